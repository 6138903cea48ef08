package integration

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/testenv"
)

// lxcfsPid is the pid in the server's lxcfs pid file (0 if none).
func (s *server) lxcfsPid() int {
	b, err := os.ReadFile(filepath.Join(s.DataDir, "lxcfs", "lxcfs.pid"))
	if err != nil {
		return 0
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	return pid
}

// isLxcfs says whether pid is a live lxcfs (not a zombie, not a reused pid).
func isLxcfs(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	return err == nil && strings.HasPrefix(filepath.Base(strings.SplitN(string(b), "\x00", 2)[0]), "lxcfs")
}

// watchLxcfs registers, before the server's own clean-up, a check that runs
// after it: no lxcfs the server ran may outlive it.
func watchLxcfs(t *testing.T) *[]int {
	pids := new([]int)
	t.Cleanup(func() {
		for _, pid := range *pids {
			if isLxcfs(pid) {
				t.Errorf("lxcfs %d outlived its server", pid)
				syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	})
	return pids
}

// procView reads what a sandbox's /proc says about its size.
type procView struct {
	memTotalKB, freeTotalMB, cpuinfoCPUs, statCPUs, nproc int
	online                                                string
	uptime                                                float64
}

func (s *server) procView(t *testing.T, c created) procView {
	t.Helper()
	// busybox's free (the base image's) asks sysinfo(2), which lxcfs cannot
	// change; procps' free reads /proc/meminfo. Only the latter is checked.
	out := s.mustRun(c, `grep MemTotal /proc/meminfo | awk '{print $2}'; `+
		`if readlink -f "$(command -v free)" | grep -q busybox; then echo -1; else free -m | awk '/^Mem:/ {print $2}'; fi; `+
		`grep -c ^processor /proc/cpuinfo; grep -c '^cpu[0-9]' /proc/stat; nproc; cat /sys/devices/system/cpu/online; awk '{print $1}' /proc/uptime`)
	f := strings.Fields(out)
	if len(f) != 7 {
		t.Fatalf("proc view: %q", out)
	}
	var v procView
	for i, p := range []*int{&v.memTotalKB, &v.freeTotalMB, &v.cpuinfoCPUs, &v.statCPUs, &v.nproc} {
		n, err := strconv.Atoi(f[i])
		if err != nil {
			t.Fatalf("proc view field %d: %q", i, out)
		}
		*p = n
	}
	v.online = f[5]
	v.uptime, _ = strconv.ParseFloat(f[6], 64)
	return v
}

// A runc sandbox's /proc shows its own limits (lxcfs): MemTotal (and
// procps' free) say 256 MiB (--memory-mb 256), not the host's memory; cpuinfo, stat and
// the online CPU list say one CPU (--cpu-count 1); uptime counts from the
// sandbox's start. nproc reads the scheduler affinity, which lxcfs cannot
// change, so it still counts the host's CPUs. lxcfs outlives a serve crash
// (the old sandboxes keep working views); when lxcfs itself dies, serve
// restarts it within about a second, new sandboxes get working views, and
// the views of sandboxes created before fail fast with ENOTCONN (a bind
// mount keeps the dead FUSE connection) rather than hang. The server stops
// its lxcfs once no sandbox is left.
func TestMeminfoLxcfs(t *testing.T) {
	testenv.LookPath(t, "lxcfs")
	pids := watchLxcfs(t)
	s := startServer(t, "--cpu-count", "1")
	lx := s.lxcfsPid()
	if !isLxcfs(lx) {
		t.Fatalf("no lxcfs running for the server (pid file: %d); logs:\n%s", lx, s.logs)
	}
	*pids = append(*pids, lx)

	c := s.create(map[string]any{"templateID": "base", "timeout": 300})
	want := procView{memTotalKB: 256 << 10, freeTotalMB: 256, cpuinfoCPUs: 1, statCPUs: 1, online: "0"}
	check := func(c created, what string) {
		t.Helper()
		v := s.procView(t, c)
		if v.memTotalKB != want.memTotalKB || (v.freeTotalMB != -1 && v.freeTotalMB != want.freeTotalMB) || v.cpuinfoCPUs != want.cpuinfoCPUs ||
			v.statCPUs != want.statCPUs || v.online != want.online {
			t.Errorf("%s: /proc view %+v, want %+v", what, v, want)
		}
		if v.uptime <= 0 || v.uptime > 600 {
			t.Errorf("%s: /proc/uptime %v s, want the sandbox's own (seconds)", what, v.uptime)
		}
		t.Logf("%s: %+v", what, v)
	}
	check(c, "new sandbox")
	// Read as the sandbox's unprivileged user too.
	// free (procps, in the base image) reads /proc/meminfo.
	if out := strings.TrimSpace(s.mustRun(c, "free -m | awk '/^Mem:/ {print $2}'")); out != "256" {
		t.Errorf("free -m total: %q, want 256", out)
	}
	if out, code := s.runAs(t, c, "user", "awk '/MemTotal/ {print $2}' /proc/meminfo"); code != 0 || strings.TrimSpace(out) != "262144" {
		t.Errorf("MemTotal as user: %q (exit %d)", out, code)
	}
	// A serve crash leaves lxcfs (and the sandboxes' views) alone; the next
	// serve adopts it.
	s.stop(syscall.SIGKILL)
	s.start()
	if got := s.lxcfsPid(); got != lx || !isLxcfs(lx) {
		t.Fatalf("after a serve restart lxcfs is %d, want %d adopted; logs:\n%s", got, lx, s.logs)
	}
	check(c, "sandbox across a serve restart")

	// lxcfs dies: serve restarts it; new sandboxes see their limits again.
	syscall.Kill(lx, syscall.SIGKILL)
	var nlx int
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if p := s.lxcfsPid(); p != lx && isLxcfs(p) {
			nlx = p
			break
		}
	}
	if nlx == 0 {
		t.Fatalf("lxcfs not restarted after it died; logs:\n%s", s.logs)
	}
	*pids = append(*pids, nlx)
	c2 := s.create(map[string]any{"templateID": "base", "timeout": 300})
	check(c2, "sandbox created after an lxcfs restart")
	// The sandbox from before holds the dead mount: reads fail at once.
	t0 := time.Now()
	_, errOut, code, err := s.run(c, "cat /proc/meminfo")
	if err != nil || code == 0 || !strings.Contains(errOut, "not connected") {
		t.Errorf("old sandbox's /proc/meminfo after lxcfs died: code %d err %v stderr %q, want ENOTCONN", code, err, errOut)
	}
	if d := time.Since(t0); d > 10*time.Second {
		t.Errorf("reading the dead view took %s", d)
	}
	// ...and the sandbox itself still works, and is deleted cleanly.
	s.mustRun(c, "true")
	if st := s.do("DELETE", "/sandboxes/"+c.SandboxID, nil, nil); st != 204 {
		t.Errorf("delete old sandbox: %d", st)
	}
	if st := s.do("DELETE", "/sandboxes/"+c2.SandboxID, nil, nil); st != 204 {
		t.Errorf("delete sandbox: %d", st)
	}
	s.waitNoContainers(15 * time.Second)

	// With no sandbox left, a clean stop ends lxcfs and unmounts it.
	s.stop(syscall.SIGTERM)
	if isLxcfs(nlx) {
		t.Errorf("lxcfs %d still running after serve stopped with no sandboxes", nlx)
	}
	if mps := mountsBelow(filepath.Join(s.DataDir, "lxcfs")); len(mps) > 0 {
		t.Errorf("lxcfs mounts left: %v", mps)
	}
	s.start() // the harness's clean-up checks the rest
	*pids = append(*pids, s.lxcfsPid())
}

// --lxcfs=false runs without lxcfs, and says so; runsc never uses it.
func TestMeminfoLxcfsOff(t *testing.T) {
	s := startServer(t, "--lxcfs=false")
	if !strings.Contains(s.logs.String(), "--lxcfs=false") {
		t.Errorf("no warning about --lxcfs=false in the logs:\n%s", s.logs)
	}
	if p := s.lxcfsPid(); p != 0 {
		t.Errorf("lxcfs pid file %d with --lxcfs=false", p)
	}
	c := s.create(map[string]any{"templateID": "base", "timeout": 120})
	out := strings.TrimSpace(s.mustRun(c, "awk '/MemTotal/ {print $2}' /proc/meminfo"))
	if kb, _ := strconv.Atoi(out); kb <= 256<<10 {
		t.Errorf("MemTotal without lxcfs: %s kB, want the host's", out)
	}
}

// A serve whose lxcfs cannot start refuses to start, with a clear message.
func TestMeminfoLxcfsMissing(t *testing.T) {
	data, err := os.MkdirTemp("/var/tmp", "cubicle-it-data-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(data)
	cmd := exec.Command(filepath.Join(binDir, "cubicle"), "serve", "--data-dir", data, "--listen", "127.0.0.1:0", "--metrics-listen", "off",
		"--images-dir", imagesDir(t), "--bridge", "cbinolx", "--pool", freePool(), "--cgroup-parent", "cubicle-it-nolx",
		"--agent-bin", filepath.Join(binDir, "cubicle-agent"), "--lxcfs-bin", "/nonexistent/lxcfs")
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "lxcfs") || !strings.Contains(string(out), "--lxcfs=false") {
		t.Errorf("serve with a missing lxcfs: err %v, output:\n%s", err, out)
	}
	// The disk store it mounted went with the refused start.
	if m := mountsBelow(data); len(m) > 0 {
		t.Errorf("a refused serve left mounts: %v", m)
		unmountUnder(data)
	}
}

// mountsBelow lists mount points at or below dir.
func mountsBelow(dir string) []string {
	raw, _ := os.ReadFile("/proc/self/mountinfo")
	var out []string
	for _, line := range strings.Split(string(raw), "\n") {
		if f := strings.Fields(line); len(f) > 4 && (f[4] == dir || strings.HasPrefix(f[4], dir+"/")) {
			out = append(out, f[4])
		}
	}
	return out
}

// gVisor's /proc is its own: the sentry sizes MemTotal from the memory
// limit and the CPU count from the CPU quota (runsc --cpu-num-from-quota,
// at least 2), so runsc sandboxes need no lxcfs and get none.
func TestMeminfoRunsc(t *testing.T) {
	testenv.LookPath(t, "runsc")
	s := startServer(t, "--runtime", "runsc", "--cpu-count", "1")
	if p := s.lxcfsPid(); p != 0 {
		t.Errorf("lxcfs pid file %d on runsc", p)
	}
	c := s.create(map[string]any{"templateID": "base", "timeout": 120})
	v := s.procView(t, c)
	t.Logf("runsc: %+v", v)
	cpus := min(2, goruntime.NumCPU())
	if v.memTotalKB != 256<<10 || v.cpuinfoCPUs != cpus || v.statCPUs != cpus {
		t.Errorf("runsc /proc view %+v, want MemTotal 262144 kB and %d CPUs", v, cpus)
	}
	// gVisor's sysinfo(2) agrees, so even busybox's free shows the limit.
	if out := strings.Fields(s.mustRun(c, "free -m | awk '/^Mem:/ {print $2}'")); len(out) != 1 || (out[0] != "256" && out[0] != "262144") {
		t.Errorf("runsc free: %q", out)
	}
	if out := strings.TrimSpace(s.mustRun(c, "grep -c lxcfs /proc/self/mountinfo || true")); out != "0" {
		t.Errorf("runsc sandbox has %s lxcfs mounts", out)
	}
}

// What lxcfs costs a create (POST /v2/sandboxes until it answers 201:
// network, runtime, agent /init), against a server with --lxcfs=false,
// interleaved so drift on a shared machine hits both alike. A benchmark, so
// go test runs it only with -bench; it logs p50/p95 and reports the p50
// ratio (docs/architecture.md quotes it). CUBICLE_BENCH_SAMPLES sets the
// samples per server (default 20), CUBICLE_BENCH_ARGS extra serve flags.
func BenchmarkMeminfoCreateLatency(b *testing.B) {
	n := 20
	if v, err := strconv.Atoi(os.Getenv("CUBICLE_BENCH_SAMPLES")); err == nil && v > 0 {
		n = v
	}
	extra := strings.Fields(os.Getenv("CUBICLE_BENCH_ARGS")) // e.g. --userns=off
	with, without := startServer(b, extra...), startServer(b, append(extra, "--lxcfs=false")...)
	times := map[*server][]time.Duration{}
	for i := 0; i < n+2; i++ {
		for _, s := range []*server{with, without} {
			t0 := time.Now()
			c := s.create(map[string]any{"templateID": "base", "timeout": 60})
			d := time.Since(t0)
			s.do("DELETE", "/sandboxes/"+c.SandboxID, nil, nil)
			if i >= 2 { // warm-up
				times[s] = append(times[s], d)
			}
		}
	}
	pct := func(ds []time.Duration, p float64) time.Duration {
		ds = append([]time.Duration(nil), ds...)
		slices.Sort(ds)
		return ds[min(len(ds)-1, int(float64(len(ds))*p))]
	}
	w50, o50 := pct(times[with], 0.5), pct(times[without], 0.5)
	b.Logf("create, %d samples: lxcfs p50 %s p95 %s; --lxcfs=false p50 %s p95 %s; p50 ratio %.3f",
		n, w50.Round(time.Millisecond/10), pct(times[with], 0.95).Round(time.Millisecond/10),
		o50.Round(time.Millisecond/10), pct(times[without], 0.95).Round(time.Millisecond/10), float64(w50)/float64(o50))
	b.ReportMetric(float64(w50)/float64(o50), "p50-ratio")
}
