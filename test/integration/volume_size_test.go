package integration

import (
	"bytes"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cubicle-dev/cubicle/internal/diskimage"

	"github.com/cubicle-dev/cubicle/internal/testenv"
)

type sizedVolume struct {
	VolumeID string `json:"volumeID"`
	Token    string `json:"token"`
	Size     int64  `json:"size"`
}

// A volume holds its size: a sandbox writing past it gets ENOSPC, the
// volume-content API answers 507, and what was written before is intact,
// across a serve restart too. Sizes above the server maximum are a 400,
// and a team's volume byte quota refuses a create over it with a 429.
func TestVolumeSize(t *testing.T) {
	s := startServer(t, "--volume-size-mb", "32", "--max-volume-size-mb", "64")
	var small sizedVolume
	if st := s.do("POST", "/volumes", map[string]any{"name": "small", "size": 16 << 20}, &small); st != 201 || small.Size != 16<<20 {
		t.Fatalf("create a 16 MiB volume: %d %+v", st, small)
	}
	t.Cleanup(func() { s.do("DELETE", "/volumes/small", nil, nil) })
	var def sizedVolume
	if st := s.do("POST", "/volumes", map[string]any{"name": "dflt"}, &def); st != 201 || def.Size != 32<<20 {
		t.Fatalf("create without a size (as e2b does): %d %+v, want the 32 MiB default", st, def)
	}
	if st := s.do("DELETE", "/volumes/dflt", nil, nil); st != 204 {
		t.Fatalf("delete: %d", st)
	}
	for _, c := range []struct {
		size any
		want string
	}{
		{128 << 20, "above the server maximum of 64 MiB"},
		{0, "must be a positive number of bytes"},
		{1000, "not a whole number of MiB"},
	} {
		e := wantStatus(t, s, "POST", "/volumes", map[string]any{"name": "bad", "size": c.size}, 400)
		if !strings.Contains(e.Message, c.want) {
			t.Fatalf("size %v: %q, want it to say %q", c.size, e.Message, c.want)
		}
	}

	// A sandbox fills it: ENOSPC, and the file written first survives.
	c := s.create(map[string]any{"templateID": "base", "volumeMounts": []any{map[string]any{"name": "small", "path": "/v"}}})
	s.mustRun(c, "echo precious > /v/keep && sync")
	_, stderr, code, err := s.run(c, "dd if=/dev/zero of=/v/fill bs=1M count=32 conv=fsync")
	if err != nil || code == 0 || !strings.Contains(stderr, "No space left on device") {
		t.Fatalf("writing 32 MiB into a 16 MiB volume: code %d err %v stderr %q; want ENOSPC", code, err, stderr)
	}
	if out := s.mustRun(c, "cat /v/keep; df -m /v | tail -1 | awk '{print $2}'"); !strings.HasPrefix(out, "precious\n") {
		t.Fatalf("after the volume filled: %q", out)
	}
	// The sandbox's own disk is another filesystem: it still has room.
	s.mustRun(c, "dd if=/dev/zero of=/tmp/x bs=1M count=4 2>/dev/null && rm /tmp/x")

	// Through the volume-content API: a full volume is a 507 and the failed
	// upload leaves nothing behind; with room again, an upload past the
	// size is still a 507, and a small one works.
	put := func(path string, n int) (int, string) {
		return contentReq(t, s, "PUT", "/volumecontent/"+small.VolumeID+"/file?path="+path+"&force=true", small.Token, bytes.NewReader(make([]byte, n)))
	}
	if st, body := put("/more", 1<<20); st != http.StatusInsufficientStorage || !strings.Contains(body, "no space left") {
		t.Fatalf("upload into a full volume: %d %s, want 507", st, body)
	}
	s.mustRun(c, "rm /v/fill")
	if st, body := put("/big", 20<<20); st != http.StatusInsufficientStorage {
		t.Fatalf("20 MiB upload into a 16 MiB volume: %d %s, want 507", st, body)
	}
	var e map[string]any
	st, body := put("/big", 20<<20)
	if json.Unmarshal([]byte(body), &e) != nil || e["message"] == nil || e["code"] == nil || st != 507 {
		t.Fatalf("507 body is not {code, message}: %s", body)
	}
	if st, _ := put("/ok", 1<<20); st != 201 {
		t.Fatalf("1 MiB upload with room: %d", st)
	}
	if out := s.mustRun(c, "ls -A /v | sort | tr '\\n' ' '; cat /v/keep"); out != "keep ok precious\n" {
		t.Fatalf("volume after the failed uploads: %q, want keep and ok only", out)
	}
	s.kill(t, c.SandboxID)

	// Across a serve restart the image is mounted again on the next attach.
	s.stop(syscall.SIGTERM)
	s.start()
	c2 := s.create(map[string]any{"templateID": "base", "volumeMounts": []any{map[string]any{"name": "small", "path": "/v"}}})
	if out := s.mustRun(c2, "cat /v/keep"); out != "precious\n" {
		t.Fatalf("after a restart: %q", out)
	}
	if _, stderr, code, _ := s.run(c2, "dd if=/dev/zero of=/v/fill bs=1M count=32 conv=fsync"); code == 0 || !strings.Contains(stderr, "No space left on device") {
		t.Fatalf("after a restart the size is not enforced: code %d %q", code, stderr)
	}
	s.kill(t, c2.SandboxID)

	// The team's byte quota.
	s.cli(t, "team", "create", "vq", "--max-volume-mb", "40")
	q := s.as(t, s.cli(t, "apikey", "create", "--team", "vq"))
	var first sizedVolume
	if st := q.do("POST", "/volumes", map[string]any{"name": "a"}, &first); st != 201 {
		t.Fatalf("32 MiB within a 40 MiB quota: %d", st)
	}
	t.Cleanup(func() { q.do("DELETE", "/volumes/"+first.VolumeID, nil, nil) })
	st, h, raw := q.raw("POST", "/volumes", map[string]any{"name": "b", "size": 16 << 20})
	var qe apiErr
	json.Unmarshal(raw, &qe)
	if st != 429 || qe.Code != 429 || qe.Message != "team quota exceeded: volume MiB (40)" || h.Get("Retry-After") == "" {
		t.Fatalf("48 MiB over a 40 MiB quota: want 429 with Retry-After, got %d %s", st, raw)
	}
	if st := q.do("POST", "/volumes", map[string]any{"name": "c", "size": 8 << 20}, nil); st != 201 {
		t.Fatalf("40 MiB within a 40 MiB quota: %d", st)
	}
	q.do("DELETE", "/volumes/c", nil, nil)
}

// With a free-space reserve no create can fit, sandbox and volume creates
// are refused with 507 and the reason, and leave nothing behind.
func TestDiskReserve(t *testing.T) {
	s := startServer(t, "--disk-reserve", "100%")
	for _, c := range []struct {
		path string
		body map[string]any
		what string
	}{
		{"/sandboxes", map[string]any{"templateID": "base"}, "a 1024 MiB sandbox disk"},
		{"/volumes", map[string]any{"name": "v"}, "a 1024 MiB volume"},
	} {
		e := wantStatus(t, s, "POST", c.path, c.body, http.StatusInsufficientStorage)
		if !strings.Contains(e.Message, "cannot hold "+c.what) || !strings.Contains(e.Message, "--disk-reserve") {
			t.Fatalf("POST %s: %q, want the reason", c.path, e.Message)
		}
	}
	if ids := listedSandboxIDs(t, s, "/v2/sandboxes"); len(ids) != 0 {
		t.Fatalf("a refused create left sandboxes: %v", ids)
	}
	var vs []any
	if st := s.do("GET", "/volumes", nil, &vs); st != 200 || len(vs) != 0 {
		t.Fatalf("a refused create left volumes: %d %v", st, vs)
	}
}

// When the data filesystem runs short anyway (filled by something that is
// not an image, here a file the test makes), a sandbox whose disk can no
// longer grow to its size is reported with the reason in its logs, its
// writes fail, and the store is untouched: the API keeps answering and,
// once space is back, creates work. The server's data dir is a 3 GiB
// filesystem of its own so the test fills that, not the host.
func TestDiskShortReported(t *testing.T) {
	img := filepath.Join(t.TempDir(), "data.img") // removed after the server's clean-up
	s := newServer(t, nil, "--disk-reserve", "0")
	orig := s.DataDir
	mnt := orig + "-fs"
	if err := os.Mkdir(mnt, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := diskimage.Create(t.Context(), img, 3072); err != nil {
		t.Fatal(err)
	}
	if err := diskimage.Mount(t.Context(), img, mnt); err != nil {
		t.Fatal(err)
	}
	// The API key was made in the original data dir; the server runs on mnt.
	ents, err := os.ReadDir(orig)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(orig, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(mnt, e.Name()), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	os.RemoveAll(orig)
	s.DataDir = mnt
	for i := range s.args {
		if s.args[i] == "--data-dir" {
			s.args[i+1] = mnt
		}
	}
	s.start()
	c := s.create(map[string]any{"templateID": "base"})

	var st unix.Statfs_t
	if err := unix.Statfs(mnt, &st); err != nil {
		t.Fatal(err)
	}
	filler := filepath.Join(mnt, "filler")
	f, err := os.Create(filler)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Fallocate(int(f.Fd()), 0, 0, int64(st.Bavail)*st.Bsize-64<<20); err != nil {
		t.Fatal(err)
	}
	f.Close()

	deadline := time.Now().Add(30 * time.Second)
	for {
		_, _, logs := s.raw("GET", "/v2/sandboxes/"+c.SandboxID+"/logs", nil)
		if strings.Contains(string(logs), "data filesystem has") && strings.Contains(string(logs), "sandbox's disk may still take") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the sandbox was not reported; logs: %s", logs)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if _, _, code, _ := s.run(c, "dd if=/dev/zero of=/big bs=1M count=256 conv=fsync"); code == 0 {
		t.Fatal("256 MiB into a sandbox disk with 64 MiB left on the host succeeded")
	}
	if st := s.do("GET", "/sandboxes/"+c.SandboxID, nil, nil); st != 200 {
		t.Fatalf("API after the disk filled: %d", st)
	}
	s.kill(t, c.SandboxID)
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	if st := s.do("POST", "/volumes", map[string]any{"name": "after", "size": 16 << 20}, nil); st != 201 {
		t.Fatalf("create after space came back: %d", st)
	}
	s.do("DELETE", "/volumes/after", nil, nil)
}

// Under gVisor the volume's writes reach the image through the gofer, and
// a write past the size is ENOSPC there too.
func TestVolumeSizeRunsc(t *testing.T) {
	testenv.LookPath(t, "runsc")
	s := startServer(t, "--runtime", "runsc")
	s.createVolume(t, map[string]any{"name": "small", "size": 16 << 20})
	t.Cleanup(func() { s.do("DELETE", "/volumes/small", nil, nil) })
	c := s.create(map[string]any{"templateID": "base", "volumeMounts": []any{map[string]any{"name": "small", "path": "/v"}}})
	s.mustRun(c, "echo precious > /v/keep && sync")
	_, stderr, code, err := s.run(c, "dd if=/dev/zero of=/v/fill bs=1M count=32 conv=fsync")
	if err != nil || code == 0 || !strings.Contains(stderr, "No space left on device") {
		t.Fatalf("writing 32 MiB into a 16 MiB volume under runsc: code %d err %v stderr %q; want ENOSPC", code, err, stderr)
	}
	if out := s.mustRun(c, "cat /v/keep"); out != "precious\n" {
		t.Fatalf("after the volume filled: %q", out)
	}
	s.kill(t, c.SandboxID)
}

// A binary plugin has no size in its protocol: asking it for one is a 400
// before the plugin is called, and its volumes are unsized (no size in the
// answer, nothing counted).
func TestVolumeSizeOtherDriver(t *testing.T) {
	extra, dir, _ := faultPlugin(t, "5s")
	s := startServer(t, extra...)
	e := wantStatus(t, s, "POST", "/volumes", map[string]any{"name": "sz-1", "driver": "fault", "size": 16 << 20}, 400)
	if !strings.Contains(e.Message, `driver "fault" does not enforce volume sizes`) {
		t.Fatalf("size on a binary plugin: %q", e.Message)
	}
	if strings.Contains(calls(dir), "sz-1") {
		t.Fatalf("the plugin was called for a refused create:\n%s", calls(dir))
	}
	var v sizedVolume
	if st := s.do("POST", "/volumes", map[string]any{"name": "sz-2", "driver": "fault"}, &v); st != 201 || v.Size != 0 {
		t.Fatalf("create on a binary plugin without a size: %d %+v, want 201 and no size", st, v)
	}
	s.do("DELETE", "/volumes/sz-2", nil, nil)
}
