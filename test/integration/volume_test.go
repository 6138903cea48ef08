package integration

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/testenv"
)

type volumeOut struct {
	VolumeID    string `json:"volumeID"`
	Name        string `json:"name"`
	Token       string `json:"token"`
	Driver      string `json:"driver"`
	State       string `json:"state"`
	Attachments []struct {
		SandboxID string `json:"sandboxID"`
		Path      string `json:"path"`
		ReadOnly  bool   `json:"readOnly"`
	} `json:"attachments"`
}

func (s *server) createVolume(t *testing.T, body map[string]any) volumeOut {
	t.Helper()
	var v volumeOut
	if st := s.do("POST", "/volumes", body, &v); st != http.StatusCreated {
		t.Fatalf("create volume %v: status %d; logs:\n%s", body, st, s.logs)
	}
	return v
}

func (s *server) volume(t *testing.T, id string) volumeOut {
	t.Helper()
	var v volumeOut
	if st := s.do("GET", "/volumes/"+id, nil, &v); st != http.StatusOK {
		t.Fatalf("get volume %s: %d", id, st)
	}
	return v
}

// mountsUnder lists mount points at or below dir.
func mountsUnder(dir string) []string {
	raw, _ := os.ReadFile("/proc/self/mountinfo")
	var out []string
	for _, line := range strings.Split(string(raw), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && (f[4] == dir || strings.HasPrefix(f[4], dir+"/")) {
			out = append(out, f[4])
		}
	}
	return out
}

func refFiles(t *testing.T, s *server) []string {
	var out []string
	filepath.Walk(filepath.Join(s.DataDir, "node", "volumes"), func(p string, fi os.FileInfo, err error) error {
		if err == nil && !fi.IsDir() {
			out = append(out, strings.TrimPrefix(p, s.DataDir))
		}
		return nil
	})
	return out
}

func (s *server) kill(t *testing.T, id string) {
	t.Helper()
	if st := s.do("DELETE", "/sandboxes/"+id, nil, nil); st != http.StatusNoContent {
		t.Fatalf("kill %s: %d", id, st)
	}
}

func TestVolumeAPIAndSharing(t *testing.T) {
	s := startServer(t)
	base := filepath.Join(s.DataDir, "volume-mounts")

	// Bad input.
	errShape(t, s, "POST", "/volumes", map[string]any{"name": "bad name!"}, 400)
	errShape(t, s, "POST", "/volumes", map[string]any{"name": strings.Repeat("a", 129)}, 400)
	errShape(t, s, "POST", "/volumes", map[string]any{"name": ""}, 400)
	errShape(t, s, "POST", "/volumes", map[string]any{"name": "x", "driver": "nope"}, 400)
	errShape(t, s, "POST", "/volumes", `{"name":`, 400)
	errShape(t, s, "GET", "/volumes/missing", nil, 404)
	errShape(t, s, "DELETE", "/volumes/missing", nil, 404)

	gen := s.createVolume(t, map[string]any{})
	if len(gen.VolumeID) != 36 || gen.Name != gen.VolumeID || gen.Token == "" || gen.Driver != "local" {
		t.Fatalf("generated volume: %+v", gen)
	}
	v := s.createVolume(t, map[string]any{"name": "shared_data-1"})
	if v.VolumeID != "shared_data-1" || v.Token == "" {
		t.Fatalf("volume: %+v", v)
	}
	errShape(t, s, "POST", "/volumes", map[string]any{"name": "shared_data-1"}, 409)
	var list []map[string]any
	s.do("GET", "/volumes", nil, &list)
	if len(list) != 2 {
		t.Fatalf("list: %v", list)
	}
	for _, e := range list {
		if _, ok := e["token"]; ok {
			t.Fatalf("list must omit the token: %v", e)
		}
	}
	if got := s.volume(t, v.VolumeID); got.Token != v.Token || got.State != "ready" || len(got.Attachments) != 0 {
		t.Fatalf("get: %+v", got)
	}

	// Mount validation.
	errShape(t, s, "POST", "/v2/sandboxes", map[string]any{"templateID": "base", "volumeMounts": []any{map[string]any{"name": "never-created", "path": "/data"}}}, 400)
	errShape(t, s, "POST", "/v2/sandboxes", map[string]any{"templateID": "base", "volumeMounts": []any{
		map[string]any{"name": v.VolumeID, "path": "/a"}, map[string]any{"name": v.VolumeID, "path": "/b"}}}, 400)
	errShape(t, s, "POST", "/v2/sandboxes", map[string]any{"templateID": "base", "volumeMounts": []any{map[string]any{"name": v.VolumeID, "path": "relative"}}}, 400)
	errShape(t, s, "POST", "/v2/sandboxes", map[string]any{"templateID": "base", "volumeMounts": []any{map[string]any{"name": v.VolumeID, "path": "/proc/x"}}}, 400)
	errShape(t, s, "POST", "/v2/sandboxes", map[string]any{"templateID": "base", "volumeMounts": []any{map[string]any{"name": v.VolumeID, "path": "/"}}}, 400)
	if got := s.volume(t, v.VolumeID); len(got.Attachments) != 0 {
		t.Fatalf("rejected creates left references: %+v", got.Attachments)
	}

	a := s.create(map[string]any{"templateID": "base", "volumeMounts": []any{map[string]any{"name": v.VolumeID, "path": "/workspace"}}})
	b := s.create(map[string]any{"templateID": "base", "volumeMounts": []any{map[string]any{"name": v.VolumeID, "path": "/data", "readOnly": true}}})
	s.mustRun(a, "echo from-a > /workspace/a.txt")
	if out := s.mustRun(b, "cat /data/a.txt"); out != "from-a\n" {
		t.Fatalf("B did not see A's write: %q", out)
	}
	// Read-only is enforced by the kernel in B and does not affect A.
	_, errOut, code, _ := s.run(b, "echo x > /data/b.txt")
	if code == 0 || !strings.Contains(errOut, "Read-only file system") {
		t.Fatalf("write in read-only attachment: code %d stderr %q", code, errOut)
	}
	s.mustRun(a, "echo again >> /workspace/a.txt && mkdir -p /workspace/d && touch /workspace/d/f")
	if out := s.mustRun(b, "cat /data/a.txt; ls /data/d"); out != "from-a\nagain\nf\n" {
		t.Fatalf("B does not follow A's writes: %q", out)
	}
	// The default user (uid 1000) can write too.
	s.mustRun(a, "su -s /bin/sh user -c 'echo u > /workspace/user.txt' 2>/dev/null || (cd /workspace && /bin/bash -c 'echo u > user.txt')")
	var detail map[string]any
	s.do("GET", "/sandboxes/"+b.SandboxID, nil, &detail)
	vms, _ := detail["volumeMounts"].([]any)
	if len(vms) != 1 || vms[0].(map[string]any)["name"] != v.VolumeID || vms[0].(map[string]any)["path"] != "/data" {
		t.Fatalf("sandbox detail volumeMounts: %v", detail["volumeMounts"])
	}
	if got := s.volume(t, v.VolumeID); len(got.Attachments) != 2 {
		t.Fatalf("attachments: %+v", got.Attachments)
	}
	if m := mountsUnder(base); len(m) != 1 {
		t.Fatalf("want one host mount shared by both sandboxes, got %v", m)
	}
	errShape(t, s, "DELETE", "/volumes/"+v.VolumeID, nil, 409)
	s.kill(t, a.SandboxID)
	errShape(t, s, "DELETE", "/volumes/"+v.VolumeID, nil, 409)
	if m := mountsUnder(base); len(m) != 1 {
		t.Fatalf("host mount must stay while B holds it: %v", m)
	}
	s.kill(t, b.SandboxID)
	if got := s.volume(t, v.VolumeID); len(got.Attachments) != 0 {
		t.Fatalf("attachments after kills: %+v", got.Attachments)
	}
	if m := mountsUnder(base); len(m) != 0 {
		t.Fatalf("host mount left after the last detach: %v", m)
	}
	// Data outlives every sandbox that used it.
	c := s.create(map[string]any{"templateID": "base", "volumeMounts": []any{map[string]any{"name": v.VolumeID, "path": "/mnt/v"}}})
	if out := s.mustRun(c, "cat /mnt/v/a.txt"); out != "from-a\nagain\n" {
		t.Fatalf("data did not survive: %q", out)
	}
	s.kill(t, c.SandboxID)
	if st := s.do("DELETE", "/volumes/"+v.VolumeID, nil, nil); st != http.StatusNoContent {
		t.Fatalf("delete: %d", st)
	}
	errShape(t, s, "DELETE", "/volumes/"+v.VolumeID, nil, 404)
	if _, err := os.Stat(filepath.Join(s.DataDir, "volumes", "local", v.VolumeID)); !os.IsNotExist(err) {
		t.Fatalf("destroy left the data dir: %v", err)
	}
	if refs := refFiles(t, s); len(refs) != 0 {
		t.Fatalf("node refs left: %v", refs)
	}
	s.requireMetrics(t, `cubicle_volume_operations_total{driver="local",op="attach",result="ok"}`, `cubicle_volume_attach_duration_seconds_count{driver="local"}`,
		`cubicle_volume_operations_total{driver="local",op="create",result="ok"}`, `cubicle_volume_operations_total{driver="local",op="delete",result="ok"}`)
}

// contentReq calls the volume-content API with the volume token.
func contentReq(t *testing.T, s *server, method, path, token string, body io.Reader) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(method, s.URL+path, body)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/octet-stream")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func TestVolumeContentAPI(t *testing.T) {
	s := startServer(t, "--volume-content-idle", "1s")
	v := s.createVolume(t, map[string]any{"name": "files"})
	if st, _ := contentReq(t, s, "PUT", "/volumecontent/files/file?path=/dir/hello.txt&force=true", v.Token, strings.NewReader("hi there")); st != 201 {
		t.Fatalf("put: %d", st)
	}
	if st, body := contentReq(t, s, "GET", "/volumecontent/files/file?path=/dir/hello.txt", v.Token, nil); st != 200 || body != "hi there" {
		t.Fatalf("get: %d %q", st, body)
	}
	if st, _ := contentReq(t, s, "GET", "/volumecontent/files/file?path=/dir/hello.txt", "wrong", nil); st != 401 {
		t.Fatalf("bad token: %d", st)
	}
	if st, _ := contentReq(t, s, "GET", "/volumecontent/files/file?path=/dir/hello.txt", "", nil); st != 401 {
		t.Fatalf("no token: %d", st)
	}
	if st, _ := contentReq(t, s, "GET", "/volumecontent/nope/file?path=/x", v.Token, nil); st != 404 {
		t.Fatalf("unknown volume: %d", st)
	}
	// A sandbox sees what the API wrote, and the API sees the sandbox's writes.
	c := s.create(map[string]any{"templateID": "base", "volumeMounts": []any{map[string]any{"name": "files", "path": "/v"}}})
	if out := s.mustRun(c, "cat /v/dir/hello.txt && echo back > /v/back.txt"); out != "hi there" {
		t.Fatalf("sandbox read: %q", out)
	}
	if st, body := contentReq(t, s, "GET", "/volumecontent/files/file?path=/back.txt", v.Token, nil); st != 200 || body != "back\n" {
		t.Fatalf("get sandbox file: %d %q", st, body)
	}
	s.kill(t, c.SandboxID)
	// The API's own attachment is released after the idle period.
	deadline := time.Now().Add(10 * time.Second)
	for len(refFiles(t, s)) != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("volume-content attachment not released: %v", refFiles(t, s))
		}
		time.Sleep(100 * time.Millisecond)
	}
	if m := mountsUnder(filepath.Join(s.DataDir, "volume-mounts")); len(m) != 0 {
		t.Fatalf("mounts left: %v", m)
	}
	// Delete releases a held attachment at once.
	contentReq(t, s, "GET", "/volumecontent/files/path?path=/", v.Token, nil)
	if st := s.do("DELETE", "/volumes/files", nil, nil); st != 204 {
		t.Fatalf("delete: %d", st)
	}
	if st, _ := contentReq(t, s, "GET", "/volumecontent/files/path?path=/", v.Token, nil); st != 404 {
		t.Fatalf("deleted volume: %d", st)
	}
	if refs := refFiles(t, s); len(refs) != 0 {
		t.Fatalf("refs left: %v", refs)
	}
}

// faultPlugin installs testdata/fault-plugin.sh as driver "fault" next to
// the built-in local plugin and returns the plugin's dir and base dir.
func faultPlugin(t *testing.T, timeout string) (extra []string, dir, base string) {
	t.Helper()
	dir, err := os.MkdirTemp("/var/tmp", "cubicle-it-plugin-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		unmountUnder(dir)
		os.RemoveAll(dir)
	})
	src, err := os.ReadFile("testdata/fault-plugin.sh")
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "fault-plugin.sh")
	if err := os.WriteFile(bin, src, 0o755); err != nil {
		t.Fatal(err)
	}
	base = filepath.Join(dir, "base")
	yaml := fmt.Sprintf("volume_plugins:\n  - name: local\n    type: local\n  - name: fault\n    type: binary\n    binary_path: %s\n    timeout: %s\n", bin, timeout)
	toml := fmt.Sprintf(`[plugins."io.cubelet.internal.v1.storage"]
  volume_plugin_base_dir = %q

[[plugins."io.cubelet.internal.v1.storage".volume_plugins]]
  name = "local"
  type = "local"

[[plugins."io.cubelet.internal.v1.storage".volume_plugins]]
  name        = "fault"
  type        = "binary"
  binary_path = %q
  timeout     = %q
`, base, bin, timeout)
	os.WriteFile(filepath.Join(dir, "control.yaml"), []byte(yaml), 0o644)
	os.WriteFile(filepath.Join(dir, "node.toml"), []byte(toml), 0o644)
	return []string{"--volume-config", filepath.Join(dir, "control.yaml"), "--node-config", filepath.Join(dir, "node.toml")}, dir, base
}

func calls(dir string) string {
	b, _ := os.ReadFile(filepath.Join(dir, "calls.log"))
	return string(b)
}

func TestVolumePluginFaults(t *testing.T) {
	extra, dir, base := faultPlugin(t, "2s")
	s := startServer(t, extra...)

	// private_data over 1024 bytes: create fails, is rolled back (Destroy).
	var e struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	}
	if st := s.do("POST", "/volumes", map[string]any{"name": "bigpd-1", "driver": "fault"}, &e); st != 502 || !strings.Contains(e.Message, "private_data") {
		t.Fatalf("big private_data: %d %+v", st, e)
	}
	if !strings.Contains(calls(dir), "destroy bigpd-1") {
		t.Fatalf("big private_data create not rolled back:\n%s", calls(dir))
	}
	errShape(t, s, "GET", "/volumes/bigpd-1", nil, 404)
	if st := s.do("POST", "/volumes", map[string]any{"name": "nocreate-1", "driver": "fault"}, &e); st != 502 || !strings.Contains(e.Message, "backend refused") {
		t.Fatalf("failing create: %d %+v", st, e)
	}
	errShape(t, s, "GET", "/volumes/nocreate-1", nil, 404)

	// A healthy fault volume, mounted by one sandbox throughout: its
	// refcount must not move when other creates fail.
	ok := s.createVolume(t, map[string]any{"name": "good-1", "driver": "fault"})
	holder := s.create(map[string]any{"templateID": "base", "volumeMounts": []any{map[string]any{"name": ok.VolumeID, "path": "/good"}}})
	s.mustRun(holder, "echo held > /good/f")

	for _, tc := range []struct {
		name, wantMsg string
		status        int
	}{
		{"crash-1", "signal", 502},
		{"slow-1", "2s", 504},
		{"fail-1", "backend is down", 502},
		{"escape-1", "volume_base_dir", 502},
	} {
		s.createVolume(t, map[string]any{"name": tc.name, "driver": "fault"})
		start := time.Now()
		st := s.do("POST", "/v2/sandboxes", map[string]any{"templateID": "base", "volumeMounts": []any{
			map[string]any{"name": tc.name, "path": "/v"}, map[string]any{"name": "good-1", "path": "/good2"}}}, &e)
		if st != tc.status || e.Code != tc.status || !strings.Contains(e.Message, tc.wantMsg) {
			t.Fatalf("%s: want %d with %q, got %d %+v", tc.name, tc.status, tc.wantMsg, st, e)
		}
		if tc.name == "slow-1" && time.Since(start) > 15*time.Second {
			t.Fatalf("plugin timeout not enforced: %v", time.Since(start))
		}
		if got := s.volume(t, tc.name); len(got.Attachments) != 0 {
			t.Fatalf("%s: refcount changed: %+v", tc.name, got.Attachments)
		}
		if got := s.volume(t, "good-1"); len(got.Attachments) != 1 {
			t.Fatalf("%s: good-1 refcount changed: %+v", tc.name, got.Attachments)
		}
		if m := mountsUnder(base); len(m) != 1 || !strings.HasSuffix(m[0], "fault-good-1") {
			t.Fatalf("%s: mounts under base dir: %v\ncalls:\n%s", tc.name, m, calls(dir))
		}
		if tc.name != "fail-1" && !strings.Contains(calls(dir), "detach "+tc.name+" sandbox=") {
			t.Fatalf("%s: no rollback Detach:\n%s", tc.name, calls(dir))
		}
		var list []map[string]any
		s.do("GET", "/v2/sandboxes", nil, &list)
		if len(list) != 1 {
			t.Fatalf("%s: failed create left a sandbox: %v", tc.name, list)
		}
		if st := s.do("DELETE", "/volumes/"+tc.name, nil, nil); st != 204 {
			t.Fatalf("%s: delete after failed mount: %d", tc.name, st)
		}
	}
	if out := s.mustRun(holder, "cat /good/f"); out != "held\n" {
		t.Fatalf("holder lost its volume: %q", out)
	}
	// Detach gets the exact metadata Attach returned, and the refcounts.
	s.kill(t, holder.SandboxID)
	log := calls(dir)
	if !strings.Contains(log, "attach good-1 sandbox="+holder.SandboxID+" ref=0 pd=fault/good-1") ||
		!strings.Contains(log, `detach good-1 sandbox=`+holder.SandboxID+` ref=0 pd= md={"mount_dir":"`+base+`/fault-good-1"}`) {
		t.Fatalf("hook arguments:\n%s", log)
	}
	if m := mountsUnder(base); len(m) != 0 {
		t.Fatalf("mounts left: %v", m)
	}
	s.requireMetrics(t, `cubicle_volume_plugin_errors_total{driver="fault",kind="timeout",op="attach"}`,
		`cubicle_volume_plugin_errors_total{driver="fault",kind="protocol",op="attach"}`, `cubicle_volume_plugin_errors_total{driver="fault",kind="protocol",op="create"}`)
}

// Killing the server while a plugin is attaching (after its mount, before
// the answer) must be repaired on the next start.
func TestVolumeServerKilledMidAttach(t *testing.T) {
	extra, dir, base := faultPlugin(t, "60s")
	s := startServer(t, extra...)
	s.createVolume(t, map[string]any{"name": "slow-2", "driver": "fault"})
	done := make(chan int, 1)
	go func() {
		req, _ := http.NewRequest("POST", s.URL+"/v2/sandboxes", strings.NewReader(`{"templateID":"base","volumeMounts":[{"name":"slow-2","path":"/v"}]}`))
		req.Header.Set("X-API-Key", s.Key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			done <- 0
			return
		}
		resp.Body.Close()
		done <- resp.StatusCode
	}()
	deadline := time.Now().Add(20 * time.Second)
	for !strings.Contains(calls(dir), "slow attach started") {
		if time.Now().After(deadline) {
			t.Fatalf("attach never started:\n%s", calls(dir))
		}
		time.Sleep(50 * time.Millisecond)
	}
	if m := mountsUnder(base); len(m) != 1 {
		t.Fatalf("plugin should have mounted before hanging: %v", m)
	}
	s.stop(syscall.SIGKILL)
	if st := <-done; st != 0 {
		t.Fatalf("create finished with %d despite the kill", st)
	}
	s.start()
	if got := s.volume(t, "slow-2"); len(got.Attachments) != 0 {
		t.Fatalf("refcount after recovery: %+v", got.Attachments)
	}
	var list []map[string]any
	s.do("GET", "/v2/sandboxes", nil, &list)
	if len(list) != 0 {
		t.Fatalf("half-created sandbox survived: %v", list)
	}
	if m := mountsUnder(base); len(m) != 0 {
		t.Fatalf("mount left after recovery: %v\ncalls:\n%s", m, calls(dir))
	}
	if !strings.Contains(calls(dir), "detach slow-2 sandbox=") {
		t.Fatalf("recovery did not Detach:\n%s", calls(dir))
	}
	if refs := refFiles(t, s); len(refs) != 0 {
		t.Fatalf("node refs left: %v", refs)
	}
	if st := s.do("DELETE", "/volumes/slow-2", nil, nil); st != 204 {
		t.Fatalf("delete after recovery: %d", st)
	}
	if h := s.snapshot(t); h.mounts != 0 || h.netns != 0 || h.sandboxDirs != 0 {
		t.Fatalf("host state left: %+v", h)
	}
}

// Restart with volumes attached: live attachments are kept, those of a
// sandbox that died while the server was down are detached.
func TestVolumeRestartReconcile(t *testing.T) {
	s := startServer(t)
	base := filepath.Join(s.DataDir, "volume-mounts")
	s.createVolume(t, map[string]any{"name": "persist"})
	mount := []any{map[string]any{"name": "persist", "path": "/p"}}
	keep := s.create(map[string]any{"templateID": "base", "volumeMounts": mount})
	lost := s.create(map[string]any{"templateID": "base", "volumeMounts": mount})
	s.mustRun(keep, "echo before > /p/f")
	s.stop(syscall.SIGKILL)
	exec.Command("runc", "--root", filepath.Join(s.DataDir, "run", "runc"), "kill", lost.SandboxID, "KILL").Run()
	time.Sleep(300 * time.Millisecond)
	s.start()
	got := s.volume(t, "persist")
	if len(got.Attachments) != 1 || got.Attachments[0].SandboxID != keep.SandboxID {
		t.Fatalf("attachments after restart: %+v", got.Attachments)
	}
	if refs := refFiles(t, s); len(refs) != 1 || !strings.Contains(refs[0], keep.SandboxID) {
		t.Fatalf("node refs after restart: %v", refs)
	}
	if m := mountsUnder(base); len(m) != 1 {
		t.Fatalf("the surviving sandbox's mount must stay: %v", m)
	}
	if out := s.mustRun(keep, "cat /p/f && echo after >> /p/f"); out != "before\n" {
		t.Fatalf("volume after restart: %q", out)
	}
	errShape(t, s, "DELETE", "/volumes/persist", nil, 409)
	s.kill(t, keep.SandboxID)
	if m := mountsUnder(base); len(m) != 0 {
		t.Fatalf("mount left: %v", m)
	}
	if st := s.do("DELETE", "/volumes/persist", nil, nil); st != 204 {
		t.Fatalf("delete: %d", st)
	}
}

func TestVolumeRunsc(t *testing.T) {
	testenv.LookPath(t, "runsc")
	s := startServer(t, "--runtime", "runsc")
	s.createVolume(t, map[string]any{"name": "gv"})
	w := s.create(map[string]any{"templateID": "base", "volumeMounts": []any{map[string]any{"name": "gv", "path": "/w"}}})
	r := s.create(map[string]any{"templateID": "base", "volumeMounts": []any{map[string]any{"name": "gv", "path": "/r", "readOnly": true}}})
	s.mustRun(w, "echo one > /w/f")
	if out := s.mustRun(r, "cat /r/f"); out != "one\n" {
		t.Fatalf("reader: %q", out)
	}
	if _, errOut, code, _ := s.run(r, "echo x > /r/g"); code == 0 || !strings.Contains(errOut, "Read-only file system") {
		t.Fatalf("read-only under runsc: code %d %q", code, errOut)
	}
	// Checkpoint/restore keeps the attachment (external reference).
	if st := s.do("POST", "/sandboxes/"+w.SandboxID+"/pause", map[string]any{}, nil); st != 204 {
		t.Fatalf("pause: %d", st)
	}
	errShape(t, s, "DELETE", "/volumes/gv", nil, 409)
	s.mustRun(r, "true")
	if st := s.do("POST", "/v2/sandboxes/"+w.SandboxID+"/connect", map[string]any{}, nil); st != 201 {
		t.Fatalf("resume: %d", st)
	}
	if out := s.mustRun(w, "cat /w/f && echo two >> /w/f"); out != "one\n" {
		t.Fatalf("after restore: %q", out)
	}
	if out := s.mustRun(r, "cat /r/f"); out != "one\ntwo\n" {
		t.Fatalf("reader after writer's restore: %q", out)
	}
	s.kill(t, w.SandboxID)
	s.kill(t, r.SandboxID)
	if st := s.do("DELETE", "/volumes/gv", nil, nil); st != 204 {
		t.Fatalf("delete: %d", st)
	}
	if h := s.snapshot(t); h.mounts != 0 {
		t.Fatalf("mounts left: %+v", h)
	}
}

// `cubicle volume plugin-test` passes a conformant plugin and reports the
// violations of a broken one with exit status 1.
func TestVolumePluginTestCommand(t *testing.T) {
	_, dir, base := faultPlugin(t, "5s")
	bin := filepath.Join(dir, "fault-plugin.sh")
	run := func(vol string) (string, error) {
		out, err := exec.Command(filepath.Join(binDir, "cubicle"), "volume", "plugin-test", "--binary", bin, "--base-dir", base, "--volume-id", vol, "--timeout", "5s").CombinedOutput()
		return string(out), err
	}
	if out, err := run("good-pt"); err != nil || !strings.Contains(out, "PASS") {
		t.Fatalf("conformant plugin: %v\n%s", err, out)
	}
	for vol, want := range map[string]string{"escape-pt": "not inside volume_base_dir", "bigpd-pt": "private_data of 2000 bytes", "crash-pt": "SIGSEGV"} {
		out, err := run(vol)
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 1 || !strings.Contains(out, want) {
			t.Fatalf("%s: want exit 1 reporting %q, got %v\n%s", vol, want, err, out)
		}
	}
	if m := mountsUnder(base); len(m) != 0 {
		t.Fatalf("plugin-test left mounts: %v", m)
	}
}

func TestVolumeCLI(t *testing.T) {
	s := startServer(t)
	cli := func(args ...string) (string, error) {
		cmd := exec.Command(filepath.Join(binDir, "cubicle"), args...)
		cmd.Env = append(os.Environ(), "CUBICLE_API_URL="+s.URL, "CUBICLE_API_KEY="+s.Key)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	if out, err := cli("volume", "create", "cli-vol"); err != nil || strings.TrimSpace(out) != "cli-vol" {
		t.Fatalf("volume create: %v %q", err, out)
	}
	if out, err := cli("volume", "list"); err != nil || !strings.Contains(out, "cli-vol") || !strings.Contains(out, "local") {
		t.Fatalf("volume list: %v %q", err, out)
	}
	id, err := cli("sandbox", "create", "-v", "cli-vol:/v:ro")
	if err != nil {
		t.Fatalf("sandbox create: %v %q", err, id)
	}
	id = strings.TrimSpace(id)
	out, err := cli("volume", "get", "cli-vol")
	if err != nil || !strings.Contains(out, id) || !strings.Contains(out, `"readOnly": true`) {
		t.Fatalf("volume get: %v %q", err, out)
	}
	if out, err := cli("volume", "delete", "cli-vol"); err == nil || !strings.Contains(out, "409") {
		t.Fatalf("delete while mounted: %v %q", err, out)
	}
	if out, err := cli("sandbox", "create", "-v", "cli-vol"); err == nil || !strings.Contains(out, "NAME:/path") {
		t.Fatalf("bad -v: %v %q", err, out)
	}
	if out, err := cli("sandbox", "kill", id); err != nil {
		t.Fatalf("kill: %v %q", err, out)
	}
	if out, err := cli("volume", "delete", "cli-vol"); err != nil {
		t.Fatalf("delete: %v %q", err, out)
	}
}

// Bad plugin registrations stop `serve` at start, before it touches the host.
func TestVolumeConfigRejectedAtStart(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		os.WriteFile(p, []byte(body), 0o644)
		return p
	}
	okNode := write("ok.toml", "[storage]\n[[storage.volume_plugins]]\n  name = \"local\"\n  type = \"local\"\n")
	for name, tc := range map[string]struct{ yaml, toml, want string }{
		"duplicate": {"volume_plugins:\n  - {name: local, type: local}\n  - {name: local, type: local}\n", okNode, "unique"},
		"empty":     {"volume_plugins:\n  - {name: '', type: local}\n", okNode, "name is required"},
		"mismatch":  {"volume_plugins:\n  - {name: other, type: local}\n", okNode, "same driver names"},
		"bad type":  {"volume_plugins:\n  - {name: local, type: nfs}\n", okNode, "unknown type"},
		"no binary": {"volume_plugins:\n  - {name: x, type: binary, binary_path: /nonexistent}\n", okNode, "binary_path"},
	} {
		bridge := "cbx" + strings.ReplaceAll(name, " ", "")[:3]
		cmd := exec.Command(filepath.Join(binDir, "cubicle"), "serve", "--data-dir", filepath.Join(dir, "data-"+bridge), "--listen", "127.0.0.1:0", "--metrics-listen", "off",
			"--images-dir", imagesDir(t), "--bridge", bridge, "--agent-bin", filepath.Join(binDir, "cubicle-agent"),
			"--volume-config", write(bridge+".yaml", tc.yaml), "--node-config", tc.toml)
		out, err := cmd.CombinedOutput()
		if err == nil || !strings.Contains(string(out), tc.want) {
			t.Fatalf("%s: want a start failure mentioning %q, got %v\n%s", name, tc.want, err, out)
		}
		if exec.Command("ip", "link", "show", bridge).Run() == nil {
			exec.Command("ip", "link", "del", bridge).Run()
			t.Fatalf("%s: serve created bridge %s before rejecting its config", name, bridge)
		}
	}
}
