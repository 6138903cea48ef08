package integration

import (
	"bytes"
	"encoding/base64"
	"errors"
	"io/fs"
	"mime/multipart"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

var (
	probeOnce sync.Once
	probeBin  string
	probeErr  error
)

// probe builds testdata/probe (static), the program the isolation tests
// run inside sandboxes as their hostile code.
func probe(t *testing.T) string {
	t.Helper()
	probeOnce.Do(func() {
		probeBin = filepath.Join(binDir, "probe")
		cmd := exec.Command("go", "build", "-o", probeBin, "./testdata/probe")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		out, err := cmd.CombinedOutput()
		if err != nil {
			probeErr = err
			t.Logf("build probe: %s", out)
		}
	})
	if probeErr != nil {
		t.Fatal(probeErr)
	}
	return probeBin
}

// upload writes a host file into the sandbox through envd as user.
func (s *server) upload(t *testing.T, c created, hostPath, path string) {
	t.Helper()
	data, err := os.ReadFile(hostPath)
	if err != nil {
		t.Fatal(err)
	}
	var body bytes.Buffer
	mw := multipart.NewWriter(&body)
	fw, _ := mw.CreateFormFile("file", filepath.Base(path))
	fw.Write(data)
	mw.Close()
	req, _ := http.NewRequest("POST", s.URL+"/files?path="+path+"&username=user", &body)
	req.Header.Set("Content-Type", mw.FormDataContentType())
	resp, err := s.envdClient(c).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("upload %s: status %d", path, resp.StatusCode)
	}
}

// runAs runs bash -c cmdline in the sandbox as user (Basic auth, as the
// SDKs send it) and returns stdout and the exit code.
func (s *server) runAs(t *testing.T, c created, user, cmdline string) (string, int32) {
	t.Helper()
	hc := &http.Client{Transport: userTransport{headerTransport{id: c.SandboxID, token: c.EnvdAccessToken}, user}}
	out, _, code, err := s.runWith(hc, []string{"-c", cmdline})
	if err != nil {
		t.Fatalf("run %q as %s: %v", cmdline, user, err)
	}
	return strings.TrimSpace(out), code
}

type userTransport struct {
	headerTransport
	user string
}

func (u userTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte(u.user+":")))
	return u.headerTransport.RoundTrip(r)
}

// Root in a sandbox has exactly the documented capabilities (no
// CAP_NET_RAW: no packet or raw sockets, so no forged frames), unprivileged
// ICMP still works, io_uring is refused by the seccomp allow-list, and
// link-local instance metadata is not reachable: a listener on
// 169.254.169.254 that the host reaches sees no connection from the
// sandbox, while the sandbox reaches an ordinary address beside it.
func TestSandboxPrivileges(t *testing.T) {
	bin := probe(t)
	for _, rt := range []string{"runc", "runsc"} {
		t.Run(rt, func(t *testing.T) {
			s := startServer(t, "--runtime", rt)
			c := s.create(map[string]any{"templateID": "base", "timeout": 120})
			s.upload(t, c, bin, "/home/user/probe")
			s.mustRun(c, "chmod 755 /home/user/probe")
			if out, _ := s.runAs(t, c, "root", "grep CapEff /proc/self/status"); out != "CapEff:\t00000000a80405fb" {
				t.Errorf("root CapEff: %q, want 00000000a80405fb", out)
			}
			// runc: root inside is an unprivileged host uid (its own range).
			if rt == "runc" {
				if f := strings.Fields(s.mustRun(c, "cat /proc/self/uid_map")); len(f) != 3 || f[0] != "0" || f[1] == "0" || f[2] != "65536" {
					t.Errorf("uid_map %q: want root mapped to a 65536-uid host range", f)
				}
			}
			for _, cse := range []struct{ user, arg, want string }{
				{"root", "packet", "EPERM"},
				{"root", "rawip", "EPERM"},
				{"root", "iouring", "EPERM"},
				{"user", "iouring", "EPERM"},
				{"user", "ping", "ok"},
			} {
				if out, _ := s.runAs(t, c, cse.user, "/home/user/probe "+cse.arg); out != cse.want {
					t.Errorf("%s as %s: %q, want %q", cse.arg, cse.user, out, cse.want)
				}
			}
			// Instance metadata: a listener on 169.254.169.254 in a namespace
			// the test makes, which the host reaches (newMetadataHost checks),
			// as does the sandbox at an ordinary address on the same veth.
			md := newMetadataHost(t, s.poolOf(t))
			if out, _ := s.runAs(t, c, "root", "/home/user/probe dial "+md.control.String()+":80"); out != "connected" || len(md.waitClients(md.control, 2)) != 2 {
				t.Fatalf("control address beside the metadata service: %q, listener saw %v; want connected (the route to the namespace works)", out, md.clients(md.control))
			}
			if out, _ := s.runAs(t, c, "root", "/home/user/probe dial 169.254.169.254:80"); !strings.HasPrefix(out, "blocked") {
				t.Errorf("instance metadata address: %q, want blocked", out)
			}
			if got := md.clients(md.meta); len(got) != 1 || got[0] != md.hostAddr {
				t.Errorf("metadata listener saw %v, want only the host's control from %s", got, md.hostAddr)
			}
		})
	}
}

// The agent (PID 1) outlives what its sandbox's workload does to memory and
// processes on runc: a fork storm meets the pids limit (EAGAIN) before the
// memory limit, the agent answers during and after it, and a memory bomb is
// OOM-killed, never the agent. On runsc the whole sandbox is one host
// process tree (the sentry and one stub per application process), so a
// storm is contained by the sandbox's cgroup but may end the sandbox; it
// must then be reported dead with its reason, never hang.
func TestAgentSurvivesWorkload(t *testing.T) {
	bin := probe(t)
	for _, rt := range []string{"runc", "runsc"} {
		t.Run(rt, func(t *testing.T) {
			s := startServer(t, "--runtime", rt)
			c := s.create(map[string]any{"templateID": "base", "timeout": 120})
			s.upload(t, c, bin, "/home/user/probe")
			s.mustRun(c, "chmod 755 /home/user/probe")
			if rt == "runsc" {
				runscStormContained(t, s, c)
				return
			}
			if out, _ := s.runAs(t, c, "user", "cat /proc/self/oom_score_adj /proc/1/oom_score_adj | tr '\\n' ' '"); out != "500 0" {
				t.Errorf("oom_score_adj of a command and of the agent: %q, want \"500 0\"", out)
			}

			out, _ := s.runAs(t, c, "user", "/home/user/probe forkstorm 100000")
			if started, reason, _ := strings.Cut(out, " "); started == "100000" || reason != "EAGAIN" {
				t.Fatalf("fork storm: %q, want the pids limit (EAGAIN) to stop it", out)
			}
			// While the storm's processes hold every pid, the agent still answers.
			resp, err := s.envdClient(c).Get(s.URL + "/health")
			if err != nil {
				t.Fatalf("agent during the fork storm: %v", err)
			}
			resp.Body.Close()
			if resp.StatusCode/100 != 2 {
				t.Fatalf("agent during the fork storm: status %d", resp.StatusCode)
			}
			time.Sleep(3500 * time.Millisecond) // the probe's sleepers end after 3 s
			if got := s.mustRun(c, "echo alive"); strings.TrimSpace(got) != "alive" {
				t.Fatalf("after the fork storm: %q", got)
			}

			if out, code := s.runAs(t, c, "user", "/home/user/probe membomb"); strings.Contains(out, "survived") || code == 0 {
				t.Fatalf("memory bomb was not stopped: %q (exit %d)", out, code)
			}
			if got := s.mustRun(c, "echo alive"); strings.TrimSpace(got) != "alive" {
				t.Fatalf("after the memory bomb: %q", got)
			}
			var info struct {
				State string `json:"state"`
			}
			if st := s.do("GET", "/sandboxes/"+c.SandboxID, nil, &info); st != http.StatusOK || info.State != "running" {
				t.Fatalf("sandbox after the bombs: %d %+v", st, info)
			}
		})
	}
}

// runscStormContained: the storm ends; then either the sandbox answers, or
// the API reports it killed, naming why, within seconds.
func runscStormContained(t *testing.T, s *server, c created) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		hc := &http.Client{Transport: userTransport{headerTransport{id: c.SandboxID, token: c.EnvdAccessToken}, "user"}}
		s.runWith(hc, []string{"-c", "/home/user/probe forkstorm 100000"})
	}()
	select {
	case <-done:
	case <-time.After(90 * time.Second):
		t.Fatal("fork storm on runsc still running after 90 s")
	}
	time.Sleep(3500 * time.Millisecond) // the probe's sleepers end after 3 s
	if out, _, code, err := s.run(c, "echo alive"); err == nil && code == 0 && strings.TrimSpace(out) == "alive" {
		return
	}
	var e struct {
		Message string `json:"message"`
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		st := s.do("GET", "/sandboxes/"+c.SandboxID, nil, &e)
		if st == http.StatusNotFound && strings.Contains(e.Message, "killed") {
			t.Logf("runsc sandbox ended by the storm, reported: %s", e.Message)
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after the fork storm the sandbox neither answers nor is reported killed: %d %q", st, e.Message)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// A set-ID binary planted in a volume elevates nobody: the sandbox mounts
// volumes nosuid, and on the host the data dir (sandbox filesystems and
// volumes below it) is root-only, so the host's other users cannot run it,
// even where the data dir was made 0755 beforehand (make run's mkdir -p).
func TestSetuidInVolumeDoesNotElevate(t *testing.T) {
	bin := probe(t)
	s := startServer(t)
	var v struct {
		VolumeID string `json:"volumeID"`
	}
	if st := s.do("POST", "/volumes", map[string]any{"name": "suid-" + strings.ToLower(t.Name()[len(t.Name())-6:])}, &v); st != http.StatusCreated {
		t.Fatalf("create volume: %d", st)
	}
	c := s.create(map[string]any{"templateID": "base", "timeout": 120, "volumeMounts": []any{map[string]any{"name": v.VolumeID, "path": "/data"}}})
	s.upload(t, c, bin, "/home/user/probe")
	if _, code := s.runAs(t, c, "root", "cp /home/user/probe /data/suid && chown 0:0 /data/suid && chmod 4755 /data/suid"); code != 0 {
		t.Fatalf("planting the set-ID binary failed (exit %d)", code)
	}
	if out, _ := s.runAs(t, c, "user", "/data/suid euid"); out != "1000" {
		t.Errorf("set-ID binary in a volume ran with euid %q inside the sandbox, want 1000 (nosuid)", out)
	}

	fi, err := os.Stat(s.DataDir)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o711 {
		t.Errorf("data dir mode %v, want 0711", fi.Mode().Perm())
	}
	// Template images are built from untrusted recipes too.
	if fi, err := os.Stat(imagesDir(t)); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("images dir: %v %v, want 0700", fi.Mode(), err)
	}
	var planted string
	filepath.Walk(s.DataDir, func(p string, fi os.FileInfo, err error) error {
		if err == nil && fi.Name() == "suid" && fi.Mode()&os.ModeSetuid != 0 && planted == "" {
			planted = p
		}
		return nil
	})
	if planted == "" {
		t.Fatal("planted binary not found under the data dir")
	}
	// Even with the data dir opened up again, the volume's own root is
	// root-only.
	if err := os.Chmod(s.DataDir, 0o755); err != nil {
		t.Fatal(err)
	}
	// A plain host user: the kernel drops every capability on the uid change.
	cmd := exec.Command(planted, "euid")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	out, err := cmd.CombinedOutput()
	if err == nil || strings.TrimSpace(string(out)) == "0" {
		var modes []string
		for p := planted; strings.HasPrefix(p, s.DataDir); p = filepath.Dir(p) {
			if fi, err := os.Stat(p); err == nil {
				modes = append(modes, p+" "+fi.Mode().String())
			}
		}
		t.Fatalf("a host user ran the planted set-ID binary %s: %q (%v); modes: %v", planted, out, err, modes)
	}
	if !errors.Is(err, fs.ErrPermission) {
		t.Errorf("host user's exec: %v, want permission denied", err)
	}
}

// diskSizeMB is the size of the sandbox's writable layer: df inside shows
// it, a write past it fails with ENOSPC, and the host's disk loses no more
// than that.
func TestDiskSizeEnforced(t *testing.T) {
	for _, rt := range []string{"runc", "runsc"} {
		t.Run(rt, func(t *testing.T) {
			s := startServer(t, "--runtime", rt, "--disk-size-mb", "64")
			c := s.create(map[string]any{"templateID": "base", "timeout": 120})
			out, code := s.runAs(t, c, "user", "df -k / | tail -1 | awk '{print $2}'")
			if kb, err := strconv.Atoi(out); code != 0 || err != nil || kb < 50<<10 || kb > 64<<10 {
				t.Fatalf("df / inside: %q (exit %d), want about 64 MiB", out, code)
			}
			var before, after syscall.Statfs_t
			if err := syscall.Statfs(s.DataDir, &before); err != nil {
				t.Fatal(err)
			}
			out, _ = s.runAs(t, c, "user", "dd if=/dev/zero of=/home/user/fill bs=1M count=256 2>&1; echo rc=$?")
			if !strings.Contains(out, "No space left on device") || strings.HasSuffix(out, "rc=0") {
				t.Fatalf("filling the disk: %q, want ENOSPC", out)
			}
			if err := syscall.Statfs(s.DataDir, &after); err != nil {
				t.Fatal(err)
			}
			if used := (int64(before.Bavail) - int64(after.Bavail)) * before.Bsize; used > 80<<20 {
				t.Errorf("the host's disk lost %d MiB to a 64 MiB sandbox", used>>20)
			}
			// Freeing space inside works again, and the sandbox is fine.
			s.mustRun(c, "rm /home/user/fill && echo ok > /home/user/after")
		})
	}
}
