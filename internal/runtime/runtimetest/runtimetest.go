// Package runtimetest is the conformance suite every runtime.Driver runs.
package runtimetest

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/runtime"
	"golang.org/x/sys/unix"
)

// Optional capabilities a driver may expose so the suite can look deeper.
type (
	// CgroupFiler reads a file of the sandbox cgroup (v1 controller name).
	CgroupFiler interface {
		CgroupFile(id, controller, file string) ([]byte, error)
	}
	// UpperDirer exposes the writable overlay layer.
	UpperDirer interface{ UpperDir(id string) string }
	// ConsoleLogger exposes the PID 1 stdout/stderr file.
	ConsoleLogger interface{ ConsoleLog(id string) string }
	// LeakChecker reports leftovers once every sandbox is deleted.
	LeakChecker interface {
		CheckLeaks(ctx context.Context) error
	}
)

// Options tune the suite.
type Options struct {
	// LeakCycles is the number of create/delete cycles of the leak test (default 50).
	LeakCycles int
	// Timeout bounds each wait for in-sandbox effects (default 30s).
	Timeout time.Duration
	// ScratchDir is where host dirs bind-mounted into sandboxes are made
	// (default t.TempDir()).
	ScratchDir string
	// HostPIDsOverhead is what the driver adds to Resources.PIDs in the host
	// pids cgroup (runsc: the sentry's own threads).
	HostPIDsOverhead int64
	// Devices requires the device passthrough test (fails if the driver
	// does not report runtime.DeviceCapable support). Without it the test
	// still runs for drivers whose SupportsDevices() is true, and drivers
	// reporting false are checked to refuse Spec.Devices cleanly.
	Devices bool
	// UserNS: the driver puts sandboxes in user namespaces; root inside
	// must map to an unprivileged host uid.
	UserNS bool
}

// SandboxCapEff is the exact capability set of a sandbox's processes as a
// CapEff mask: Docker's default set less CAP_NET_RAW (docs/security.md).
const SandboxCapEff = 0xa80405fb

// NewID returns a random 20-char [a-z0-9] sandbox id.
func NewID(t testing.TB) string {
	const alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
	b := make([]byte, 20)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	for i := range b {
		b[i] = alphabet[int(b[i])%len(alphabet)]
	}
	return string(b)
}

// BusyboxRootfs builds a minimal rootfs from the static /bin/busybox in a
// temp dir: every applet as a symlink in /bin, root and user (1000) accounts.
func BusyboxRootfs(t testing.TB) string {
	t.Helper()
	return BusyboxRootfsIn(t, t.TempDir())
}

// BusyboxRootfsIn is BusyboxRootfs under a caller-chosen (cleaned-up) dir.
func BusyboxRootfsIn(t testing.TB, parent string) string {
	t.Helper()
	bb := busyboxPath()
	root := filepath.Join(parent, "rootfs")
	for _, d := range []string{"bin", "sbin", "usr/bin", "usr/sbin", "etc", "proc", "sys", "dev", "root", "home/user", "tmp", "var", "run"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	os.Chmod(filepath.Join(root, "tmp"), 0o1777)
	data, err := os.ReadFile(bb)
	if err != nil {
		t.Fatalf("busybox: %v", err)
	}
	if err := os.WriteFile(filepath.Join(root, "bin", "busybox"), data, 0o755); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(bb, "--list").Output()
	if err != nil {
		t.Fatalf("busybox --list: %v", err)
	}
	for _, applet := range strings.Fields(string(out)) {
		if applet == "busybox" || strings.Contains(applet, "/") {
			continue
		}
		if err := os.Symlink("busybox", filepath.Join(root, "bin", applet)); err != nil && !errors.Is(err, os.ErrExist) {
			t.Fatal(err)
		}
	}
	files := map[string]string{
		"etc/passwd":   "root:x:0:0:root:/root:/bin/sh\nuser:x:1000:1000:user:/home/user:/bin/sh\n",
		"etc/group":    "root:x:0:\nuser:x:1000:\n",
		"etc/hostname": "sandbox\n",
	}
	for p, c := range files {
		if err := os.WriteFile(filepath.Join(root, p), []byte(c), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	os.Chown(filepath.Join(root, "home/user"), 1000, 1000)
	return root
}

func busyboxPath() string {
	if p, err := exec.LookPath("busybox"); err == nil {
		if abs, err := filepath.Abs(p); err == nil {
			return abs
		}
	}
	return "/bin/busybox"
}

// WaitFile polls path until it is non-empty and returns it; past timeout it fails t.
func WaitFile(t testing.TB, path string, timeout time.Duration) []byte {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		b, err := os.ReadFile(path)
		if err == nil && len(b) > 0 {
			return b
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, path)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func readInt(t testing.TB, path string) int {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatalf("%s: %q: %v", path, b, err)
	}
	return n
}

// waitTickAbove waits until /out/tick holds a value > min.
func waitTickAbove(t testing.TB, path string, min int, timeout time.Duration) int {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		if b, err := os.ReadFile(path); err == nil {
			if n, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && n > min {
				return n
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("tick in %s did not pass %d within %v", path, min, timeout)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// probeScript is PID 1 of the main test sandbox. It records what it sees
// into /out and then ticks a counter once a second, so pause (tick stops)
// and resume-with-memory (tick continues from where it was) are observable.
const probeScript = `
grep -E '^(CapEff|Seccomp):' /proc/1/status > /out/status
cat /proc/self/uid_map > /out/uidmap
if unshare -U true 2>/dev/null; then echo 0 > /out/unshare.rc; else echo 1 > /out/unshare.rc; fi
if echo x > /ro/written 2>/dev/null; then echo 0 > /out/ro.rc; else echo 1 > /out/ro.rc; fi
cat /ro/hello > /out/ro.content
echo persisted > /tmp/persist
hostname > /out/hostname
/.cubicle/busybox echo agent-ok > /out/agent
( until [ -e /ro/read-boot-id ]; do sleep 0.05; done; cat /proc/sys/kernel/random/boot_id > /out/bootid ) &
echo hello-console
echo ready > /out/ready
i=0
while [ $i -lt 100000 ]; do i=$((i+1)); echo $i > /out/tick.new; mv /out/tick.new /out/tick; sleep 1; done
`

// RunDriverSuite runs the conformance tests against d. layers are the
// read-only lower dirs (e.g. BusyboxRootfs).
func RunDriverSuite(t *testing.T, d runtime.Driver, layers []string) {
	RunDriverSuiteWith(t, d, layers, Options{})
}

// RunDriverSuiteWith is RunDriverSuite with options.
func RunDriverSuiteWith(t *testing.T, d runtime.Driver, layers []string, o Options) {
	if o.LeakCycles == 0 {
		o.LeakCycles = 50
	}
	if o.Timeout == 0 {
		o.Timeout = 30 * time.Second
	}
	scratch := func(t *testing.T) string {
		if o.ScratchDir == "" {
			return t.TempDir()
		}
		dir, err := os.MkdirTemp(o.ScratchDir, "scratch-")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(dir) })
		return dir
	}
	ctx := context.Background()
	cleanupDelete := func(t *testing.T, id string) {
		t.Cleanup(func() {
			if err := d.Delete(context.Background(), id); err != nil {
				t.Errorf("cleanup delete %s: %v", id, err)
			}
		})
	}

	t.Run("DeleteUnknown", func(t *testing.T) {
		if err := d.Delete(ctx, NewID(t)); err != nil {
			t.Fatalf("Delete(unknown) = %v, want nil", err)
		}
		if _, err := d.Inspect(ctx, NewID(t)); !errors.Is(err, runtime.ErrNotFound) {
			t.Fatalf("Inspect(unknown) = %v, want ErrNotFound", err)
		}
	})

	t.Run("Lifecycle", func(t *testing.T) {
		out, ro := scratch(t), scratch(t)
		if err := os.WriteFile(filepath.Join(ro, "hello"), []byte("from-host\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		id := NewID(t)
		spec := runtime.Spec{
			ID: id, Layers: layers, Hostname: "probe-host",
			Args: []string{"/bin/sh", "-c", probeScript},
			Env:  []string{"PROBE=1"},
			Mounts: []runtime.Mount{
				{Source: out, Destination: "/out"},
				{Source: ro, Destination: "/ro", ReadOnly: true},
				// A single-file bind, as the agent binary is mounted.
				{Source: busyboxPath(), Destination: "/.cubicle/busybox", ReadOnly: true},
			},
			Resources: runtime.Resources{CPUCount: 1, MemoryMB: 64, PIDs: 100},
		}
		start := time.Now()
		info, err := d.Create(ctx, spec)
		cleanupDelete(t, id)
		if err != nil {
			t.Fatalf("Create: %v", err)
		}
		WaitFile(t, filepath.Join(out, "ready"), o.Timeout)
		t.Logf("%s: create -> PID 1 ready in %v", d.Name(), time.Since(start))
		if info.ID != id || info.State != runtime.StateRunning || info.Pid <= 0 {
			t.Fatalf("Create info = %+v", info)
		}

		info, err = d.Inspect(ctx, id)
		if err != nil || info.State != runtime.StateRunning || info.Pid <= 0 {
			t.Fatalf("Inspect = %+v, %v; want running with pid", info, err)
		}
		if got := strings.TrimSpace(string(WaitFile(t, filepath.Join(out, "hostname"), o.Timeout))); got != "probe-host" {
			t.Errorf("hostname = %q", got)
		}

		if got := strings.TrimSpace(string(WaitFile(t, filepath.Join(out, "agent"), o.Timeout))); got != "agent-ok" {
			t.Errorf("file bind mount: %q", got)
		}
		// Read once Create returned (as the agent's commands are): the
		// boot's own boot_id, never the host's.
		if err := os.WriteFile(filepath.Join(ro, "read-boot-id"), nil, 0o644); err != nil {
			t.Fatal(err)
		}
		hostBoot, _ := os.ReadFile("/proc/sys/kernel/random/boot_id")
		boot := strings.TrimSpace(string(WaitFile(t, filepath.Join(out, "bootid"), o.Timeout)))
		if len(boot) != 36 || boot == strings.TrimSpace(string(hostBoot)) {
			t.Errorf("boot_id %q: want a UUID of the sandbox's own (the host's is %q)", boot, strings.TrimSpace(string(hostBoot)))
		}

		// Capabilities: nothing beyond Docker's default set.
		status := string(WaitFile(t, filepath.Join(out, "status"), o.Timeout))
		var capEff uint64
		for _, line := range strings.Split(status, "\n") {
			if v, ok := strings.CutPrefix(line, "CapEff:"); ok {
				capEff, err = strconv.ParseUint(strings.TrimSpace(v), 16, 64)
				if err != nil {
					t.Fatalf("CapEff %q: %v", v, err)
				}
			}
		}
		if capEff != SandboxCapEff {
			t.Errorf("CapEff = %#x, want exactly %#x", capEff, uint64(SandboxCapEff))
		}
		// Root inside is host root only without a user namespace.
		uidmap := strings.Fields(string(WaitFile(t, filepath.Join(out, "uidmap"), o.Timeout)))
		if len(uidmap) != 3 || uidmap[0] != "0" {
			t.Errorf("uid_map %q", uidmap)
		} else if o.UserNS && (uidmap[1] == "0" || uidmap[2] != "65536") {
			t.Errorf("uid_map %q: want root mapped to an unprivileged 65536-uid range", uidmap)
		} else if !o.UserNS && uidmap[1] != "0" {
			t.Errorf("uid_map %q without a user namespace", uidmap)
		}
		// Seccomp: user namespaces need no capability, so only the filter stops this.
		if strings.Contains(status, "Seccomp:") && !strings.Contains(status, "Seccomp:\t2") {
			t.Errorf("PID 1 not in seccomp filter mode: %q", status)
		}
		if rc := readInt(t, filepath.Join(out, "unshare.rc")); rc == 0 {
			t.Errorf("unshare -U succeeded inside the sandbox; seccomp not applied (status: %q)", status)
		}

		// Read-only bind mount.
		if rc := readInt(t, filepath.Join(out, "ro.rc")); rc == 0 {
			t.Errorf("write to read-only mount succeeded")
		}
		if _, err := os.Stat(filepath.Join(ro, "written")); err == nil {
			t.Errorf("file appeared in read-only host dir")
		}
		if got := strings.TrimSpace(string(WaitFile(t, filepath.Join(out, "ro.content"), o.Timeout))); got != "from-host" {
			t.Errorf("ro content = %q", got)
		}

		// Writes land in the upper dir, never in a lower layer.
		for _, l := range layers {
			if _, err := os.Stat(filepath.Join(l, "tmp", "persist")); err == nil {
				t.Errorf("write leaked into lower layer %s", l)
			}
		}
		if u, ok := d.(UpperDirer); ok {
			b, err := os.ReadFile(filepath.Join(u.UpperDir(id), "tmp", "persist"))
			if err != nil || strings.TrimSpace(string(b)) != "persisted" {
				t.Errorf("upper/tmp/persist = %q, %v", b, err)
			}
		}
		if c, ok := d.(ConsoleLogger); ok {
			deadline := time.Now().Add(o.Timeout)
			for {
				b, _ := os.ReadFile(c.ConsoleLog(id))
				if strings.Contains(string(b), "hello-console") {
					break
				}
				if time.Now().After(deadline) {
					t.Errorf("console log lacks PID 1 stdout: %q", b)
					break
				}
				time.Sleep(20 * time.Millisecond)
			}
		}

		// Stats and limits.
		tick := filepath.Join(out, "tick")
		waitTickAbove(t, tick, 1, o.Timeout) // some CPU has been used by now
		st, err := d.Stats(ctx, id)
		if err != nil {
			t.Fatalf("Stats: %v", err)
		}
		if st.MemoryBytes == 0 || st.CPUUsageNanos == 0 || st.PIDs == 0 {
			t.Errorf("Stats = %+v, want non-zero usage", st)
		}
		if st.MemoryLimit != 64<<20 {
			t.Errorf("MemoryLimit = %d, want %d", st.MemoryLimit, 64<<20)
		}
		if cf, ok := d.(CgroupFiler); ok {
			checkCgroup(t, cf, id, "pids", []string{"pids.max"}, strconv.FormatInt(100+o.HostPIDsOverhead, 10))
			checkCgroup(t, cf, id, "memory", []string{"memory.limit_in_bytes", "memory.max"}, strconv.Itoa(64<<20))
			checkCgroup(t, cf, id, "cpu", []string{"cpu.cfs_quota_us", "cpu.max"}, "100000")
		}

		// Pause keeps the process (and its memory); Resume continues it.
		before := waitTickAbove(t, tick, 1, o.Timeout)
		if err := d.Resume(ctx, id); !errors.Is(err, runtime.ErrNotPaused) {
			t.Errorf("Resume(running) = %v, want ErrNotPaused", err)
		}
		pauseStart := time.Now()
		if err := d.Pause(ctx, id); err != nil {
			t.Fatalf("Pause: %v", err)
		}
		t.Logf("%s: pause took %v", d.Name(), time.Since(pauseStart))
		info, err = d.Inspect(ctx, id)
		if err != nil || info.State != runtime.StatePaused {
			t.Fatalf("Inspect after pause = %+v, %v", info, err)
		}
		if err := d.Pause(ctx, id); !errors.Is(err, runtime.ErrNotRunning) {
			t.Errorf("Pause(paused) = %v, want ErrNotRunning", err)
		}
		frozen := readInt(t, tick)
		time.Sleep(2500 * time.Millisecond)
		if now := readInt(t, tick); now != frozen {
			t.Errorf("tick advanced while paused: %d -> %d", frozen, now)
		}
		resumeStart := time.Now()
		if err := d.Resume(ctx, id); err != nil {
			t.Fatalf("Resume: %v", err)
		}
		t.Logf("%s: resume took %v", d.Name(), time.Since(resumeStart))
		info, err = d.Inspect(ctx, id)
		if err != nil || info.State != runtime.StateRunning || info.Pid <= 0 {
			t.Fatalf("Inspect after resume = %+v, %v", info, err)
		}
		// The counter continues from memory, not from a restart.
		if after := waitTickAbove(t, tick, frozen, o.Timeout); after < before {
			t.Errorf("tick went backwards after resume: %d -> %d (process restarted?)", before, after)
		}
		if u, ok := d.(UpperDirer); ok {
			if _, err := os.Stat(filepath.Join(u.UpperDir(id), "tmp", "persist")); err != nil {
				t.Errorf("rootfs write lost across pause/resume: %v", err)
			}
		}

		found := false
		l, err := d.List(ctx)
		if err != nil {
			t.Fatalf("List: %v", err)
		}
		for _, i := range l {
			found = found || (i.ID == id && i.State == runtime.StateRunning)
		}
		if !found {
			t.Errorf("List = %+v lacks running %s", l, id)
		}

		if err := d.Delete(ctx, id); err != nil {
			t.Fatalf("Delete: %v", err)
		}
		if _, err := d.Inspect(ctx, id); !errors.Is(err, runtime.ErrNotFound) {
			t.Fatalf("Inspect after delete = %v, want ErrNotFound", err)
		}
		if _, err := d.Stats(ctx, id); !errors.Is(err, runtime.ErrNotFound) {
			t.Errorf("Stats after delete = %v, want ErrNotFound", err)
		}
		if err := d.Delete(ctx, id); err != nil {
			t.Fatalf("second Delete = %v, want nil", err)
		}
	})

	// glibc >= 2.34 starts threads with clone3 and falls back to clone(2)
	// only when clone3 answers ENOSYS; EPERM (a runtime that drops the
	// profile's errnoRet) breaks every threaded program. Nor may a tracer
	// asking for seccomp events get clone3 through (docs/security.md).
	t.Run("SyscallFilter", func(t *testing.T) {
		out := scratch(t)
		probe := BuildProbe(t, scratch(t))
		id := NewID(t)
		_, err := d.Create(ctx, runtime.Spec{
			ID: id, Layers: layers,
			Args:   []string{"/bin/sh", "-c", "/.cubicle/probe syscalls > /out/syscalls.tmp 2>&1; mv /out/syscalls.tmp /out/syscalls; exec sleep 3600"},
			Mounts: []runtime.Mount{{Source: out, Destination: "/out"}, {Source: probe, Destination: "/.cubicle/probe", ReadOnly: true}},
		})
		cleanupDelete(t, id)
		if err != nil {
			t.Fatalf("Create: %v", err)
		}
		got := map[string]string{}
		for _, line := range strings.Split(strings.TrimSpace(string(WaitFile(t, filepath.Join(out, "syscalls"), o.Timeout))), "\n") {
			if k, v, ok := strings.Cut(line, "="); ok {
				got[k] = v
			}
		}
		t.Logf("%s: probe says %v", d.Name(), got)
		if got["clone3"] != "ENOSYS" {
			t.Errorf("clone3 = %q, want ENOSYS (libc falls back to clone only then)", got["clone3"])
		}
		if got["threads"] != "4" {
			t.Errorf("threads started = %q, want 4", got["threads"])
		}
		if got["traced-clone3"] != "ENOSYS" {
			t.Errorf("clone3(CLONE_NEWUSER) under a tracer with seccomp events (setoptions: %s) = %q, want ENOSYS",
				got["tracer-setoptions"], got["traced-clone3"])
		}
	})

	t.Run("AlreadyExists", func(t *testing.T) {
		id := NewID(t)
		spec := runtime.Spec{ID: id, Layers: layers, Args: []string{"/bin/sleep", "3600"}}
		if _, err := d.Create(ctx, spec); err != nil {
			cleanupDelete(t, id)
			t.Fatalf("Create: %v", err)
		}
		cleanupDelete(t, id)
		if _, err := d.Create(ctx, spec); !errors.Is(err, runtime.ErrAlreadyExists) {
			t.Fatalf("second Create = %v, want ErrAlreadyExists", err)
		}
		// The failed Create must not have damaged the first sandbox.
		if info, err := d.Inspect(ctx, id); err != nil || info.State != runtime.StateRunning {
			t.Fatalf("Inspect after duplicate = %+v, %v", info, err)
		}
	})

	// Resources.DiskMB is the sandbox's disk: `df /` reports its size, a
	// write past it fails with ENOSPC, in each of two sandboxes (in a
	// reflink store, clones of one blank).
	t.Run("DiskLimit", func(t *testing.T) {
		const script = `df -k / | tail -n 1 > /out/df
if dd if=/dev/zero of=/big bs=1M count=48 2> /out/dd.err; then echo 0 > /out/dd.rc; else echo 1 > /out/dd.rc; fi
mv /out/df /out/done
exec sleep 3600`
		outs := make([]string, 2)
		for i := range outs {
			outs[i] = scratch(t)
			id := NewID(t)
			_, err := d.Create(ctx, runtime.Spec{
				ID: id, Layers: layers, Args: []string{"/bin/sh", "-c", script},
				Mounts:    []runtime.Mount{{Source: outs[i], Destination: "/out"}},
				Resources: runtime.Resources{CPUCount: 1, MemoryMB: 64, PIDs: 16, DiskMB: 32},
			})
			cleanupDelete(t, id)
			if err != nil {
				t.Fatalf("Create: %v", err)
			}
		}
		for _, out := range outs {
			df := strings.Fields(string(WaitFile(t, filepath.Join(out, "done"), o.Timeout)))
			if len(df) < 2 {
				t.Fatalf("df / = %q", df)
			}
			if kb, err := strconv.Atoi(df[1]); err != nil || kb < 24<<10 || kb > 32<<10 {
				t.Errorf("df / reports %q 1K-blocks, want the 32 MiB disk", df[1])
			}
			rc, _ := os.ReadFile(filepath.Join(out, "dd.rc"))
			msg, _ := os.ReadFile(filepath.Join(out, "dd.err"))
			if strings.TrimSpace(string(rc)) != "1" || !strings.Contains(string(msg), "No space left on device") {
				t.Errorf("writing 48 MiB to a 32 MiB disk: rc %q, %q; want ENOSPC", rc, msg)
			}
		}
	})

	// A driver that passes Spec.Ready hands PID 1 the pipe at ReadyFD: a
	// byte written there reaches the caller, and PID 1 finds a pipe there
	// again when a stopped sandbox boots anew (it was told to expect one).
	if rp, ok := d.(runtime.ReadyPiper); ok {
		t.Run("ReadyPipe", func(t *testing.T) {
			fd := strconv.Itoa(rp.ReadyFD())
			id := NewID(t)
			out := scratch(t)
			if err := os.Chmod(out, 0o777); err != nil {
				t.Fatal(err)
			}
			r, w, err := os.Pipe()
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			// Each boot records whether fd is a pipe in /out/boot<N>; the
			// later boot's pipe has no reader (the write fails, ignored).
			script := `trap '' PIPE; n=1; [ -e /out/boot1 ] && n=2; ` +
				`if [ -p /proc/self/fd/` + fd + ` ]; then echo pipe > /out/boot$n; printf x >&` + fd + `; else echo none > /out/boot$n; fi; ` +
				`exec ` + fd + `>&-; exec sleep 3600`
			_, err = d.Create(ctx, runtime.Spec{ID: id, Layers: layers, Args: []string{"/bin/sh", "-c", script}, Ready: w,
				Mounts: []runtime.Mount{{Source: out, Destination: "/out"}}})
			w.Close()
			cleanupDelete(t, id)
			if err != nil {
				t.Fatalf("Create: %v", err)
			}
			r.SetReadDeadline(time.Now().Add(o.Timeout))
			got, err := io.ReadAll(r)
			if err != nil || string(got) != "x" {
				t.Fatalf("read from the ready pipe: %q, %v; want \"x\" then EOF (nothing else holds the pipe)", got, err)
			}
			if b := WaitFile(t, filepath.Join(out, "boot1"), o.Timeout); string(b) != "pipe\n" {
				t.Fatalf("first boot: fd %s is %q", fd, b)
			}
			sn, ok := d.(runtime.Snapshotter)
			if !ok {
				return
			}
			if err := sn.Stop(ctx, id); err != nil {
				t.Fatalf("Stop: %v", err)
			}
			if err := d.Resume(ctx, id); err != nil {
				t.Fatalf("Resume after Stop: %v", err)
			}
			if b := WaitFile(t, filepath.Join(out, "boot2"), o.Timeout); string(b) != "pipe\n" {
				t.Fatalf("boot after Stop: fd %s is %q, want a pipe again", fd, b)
			}
		})
	}

	t.Run("DeletePaused", func(t *testing.T) {
		id := NewID(t)
		if _, err := d.Create(ctx, runtime.Spec{ID: id, Layers: layers, Args: []string{"/bin/sleep", "3600"}}); err != nil {
			cleanupDelete(t, id)
			t.Fatalf("Create: %v", err)
		}
		cleanupDelete(t, id)
		if err := d.Pause(ctx, id); err != nil {
			t.Fatalf("Pause: %v", err)
		}
		if err := d.Delete(ctx, id); err != nil {
			t.Fatalf("Delete(paused): %v", err)
		}
		if _, err := d.Inspect(ctx, id); !errors.Is(err, runtime.ErrNotFound) {
			t.Fatalf("Inspect after delete = %v, want ErrNotFound", err)
		}
	})

	t.Run("CreateFailureCleansUp", func(t *testing.T) {
		id := NewID(t)
		// A binary that does not exist makes the runtime fail at create/start.
		_, err := d.Create(ctx, runtime.Spec{ID: id, Layers: layers, Args: []string{"/no/such/binary"}})
		cleanupDelete(t, id)
		if err == nil {
			// Some runtimes report exec failure only as an exited PID 1.
			return
		}
		if _, err := d.Inspect(ctx, id); !errors.Is(err, runtime.ErrNotFound) {
			t.Fatalf("Inspect after failed Create = %v, want ErrNotFound", err)
		}
	})

	t.Run("Concurrent", func(t *testing.T) {
		// Different IDs in parallel must not interfere (per-ID locking only).
		const n = 4
		errs := make(chan error, n)
		for i := 0; i < n; i++ {
			go func() {
				id := NewID(t)
				if _, err := d.Create(ctx, runtime.Spec{ID: id, Layers: layers, Args: []string{"/bin/sleep", "3600"}}); err != nil {
					d.Delete(ctx, id)
					errs <- fmt.Errorf("create %s: %w", id, err)
					return
				}
				if info, err := d.Inspect(ctx, id); err != nil || info.State != runtime.StateRunning {
					d.Delete(ctx, id)
					errs <- fmt.Errorf("inspect %s: %+v %v", id, info, err)
					return
				}
				errs <- d.Delete(ctx, id)
			}()
		}
		for i := 0; i < n; i++ {
			select {
			case err := <-errs:
				if err != nil {
					t.Error(err)
				}
			case <-time.After(4 * o.Timeout):
				t.Fatal("concurrent create/delete timed out")
			}
		}
	})

	// Optional abilities run as subtests only for the drivers that have
	// them, so that no subtest skips (under CI=true a skip is a failure).
	dc, capable := d.(runtime.DeviceCapable)
	if capable || o.Devices {
		t.Run("Devices", func(t *testing.T) {
			supported := capable && dc.SupportsDevices()
			if !supported && o.Devices {
				t.Fatalf("Options.Devices set but %s does not support devices", d.Name())
			}
			devs := []runtime.Device{
				// 1:7 is /dev/full: writes fail with ENOSPC once the cgroup allows them.
				{Path: "/dev/nvidia0", HostPath: "/dev/full", Type: 'c', Major: 1, Minor: 7},
				{Path: "/dev/nvidiactl", Type: 'c', Major: 195, Minor: 0, FileMode: 0o660},
			}
			id := NewID(t)
			if !supported {
				_, err := d.Create(ctx, runtime.Spec{ID: id, Layers: layers, Args: []string{"/bin/sleep", "3600"}, Devices: devs})
				cleanupDelete(t, id)
				if !errors.Is(err, runtime.ErrUnsupported) {
					t.Fatalf("Create with devices on %s = %v, want ErrUnsupported", d.Name(), err)
				}
				if _, err := d.Inspect(ctx, id); !errors.Is(err, runtime.ErrNotFound) {
					t.Fatalf("Inspect after refused Create = %v, want ErrNotFound", err)
				}
				if lc, ok := d.(LeakChecker); ok {
					if err := lc.CheckLeaks(ctx); err != nil {
						t.Fatalf("refused Create left something behind: %v", err)
					}
				}
				return
			}
			out := scratch(t)
			// stat prints "type major minor mode" (hex numbers); then a write to
			// the 1:7 node (ENOSPC proves the cgroup allows it), a read, an open
			// of 195:0 and a node outside the spec, which the cgroup denies.
			script := `
stat -c '%F %t %T %a' /dev/nvidia0 > /out/nvidia0.stat 2>&1
stat -c '%F %t %T %a' /dev/nvidiactl > /out/nvidiactl.stat 2>&1
(echo x > /dev/nvidia0) > /out/write.err 2>&1; echo $? > /out/write.rc
head -c 4 /dev/nvidia0 | od -An -tx1 > /out/read.out 2>&1
(mknod /dev/denied c 195 254 && echo x > /dev/denied) > /out/denied.err 2>&1; echo $? > /out/denied.rc
echo ready > /out/ready
exec sleep 3600
`
			_, err := d.Create(ctx, runtime.Spec{
				ID: id, Layers: layers, Args: []string{"/bin/sh", "-c", script}, Devices: devs,
				Mounts: []runtime.Mount{{Source: out, Destination: "/out"}},
			})
			cleanupDelete(t, id)
			if err != nil {
				t.Fatalf("Create with devices: %v", err)
			}
			WaitFile(t, filepath.Join(out, "ready"), o.Timeout)
			read := func(name string) string {
				b, _ := os.ReadFile(filepath.Join(out, name))
				return strings.TrimSpace(string(b))
			}
			if got := read("nvidia0.stat"); got != "character special file 1 7 666" {
				t.Errorf("/dev/nvidia0 stat = %q, want char 1:7 mode 666", got)
			}
			if got := read("nvidiactl.stat"); got != "character special file c3 0 660" {
				t.Errorf("/dev/nvidiactl stat = %q, want char 195:0 (c3:0) mode 660", got)
			}
			if rc, msg := read("write.rc"), read("write.err"); rc == "0" || !strings.Contains(msg, "No space left on device") {
				t.Errorf("write to /dev/nvidia0 (1:7) = rc %s %q, want ENOSPC (device cgroup must allow it)", rc, msg)
			}
			if got := read("read.out"); got != "00 00 00 00" {
				t.Errorf("read from /dev/nvidia0 = %q, want four zero bytes", got)
			}
			if rc, msg := read("denied.rc"), read("denied.err"); rc == "0" || !strings.Contains(msg, "Operation not permitted") {
				t.Errorf("node outside the spec: rc %s %q, want EPERM from the device cgroup", rc, msg)
			}
			if err := d.Delete(ctx, id); err != nil {
				t.Fatalf("Delete: %v", err)
			}
		})
	}

	if sn, ok := d.(runtime.Snapshotter); ok {
		t.Run("Snapshot", func(t *testing.T) {
			runSnapshot(t, d, sn, layers, scratch, o)
		})
	}

	t.Run("Leak", func(t *testing.T) {
		start := time.Now()
		for i := 0; i < o.LeakCycles; i++ {
			id := NewID(t)
			_, err := d.Create(ctx, runtime.Spec{
				ID: id, Layers: layers, Args: []string{"/bin/sleep", "3600"},
				Resources: runtime.Resources{CPUCount: 1, MemoryMB: 64, PIDs: 16, DiskMB: 32},
			})
			if err != nil {
				d.Delete(ctx, id)
				t.Fatalf("cycle %d: Create: %v", i, err)
			}
			if err := d.Delete(ctx, id); err != nil {
				t.Fatalf("cycle %d: Delete: %v", i, err)
			}
		}
		t.Logf("%s: %d create/delete cycles in %v (%v each)", d.Name(), o.LeakCycles,
			time.Since(start), time.Since(start)/time.Duration(o.LeakCycles))
		if lc, ok := d.(LeakChecker); ok {
			if err := lc.CheckLeaks(ctx); err != nil {
				t.Fatalf("leaks after %d cycles: %v", o.LeakCycles, err)
			}
		}
		if l, err := d.List(ctx); err != nil || len(l) != 0 {
			t.Fatalf("List after cycles = %+v, %v; want empty", l, err)
		}
	})
}

func checkCgroup(t *testing.T, cf CgroupFiler, id, ctrl string, files []string, want string) {
	t.Helper()
	var errs []string
	for _, f := range files {
		b, err := cf.CgroupFile(id, ctrl, f)
		if err != nil {
			errs = append(errs, err.Error())
			continue
		}
		got := strings.TrimSpace(string(b))
		if ctrl == "cpu" && f == "cpu.max" {
			got, _, _ = strings.Cut(got, " ")
		}
		if got != want {
			t.Errorf("cgroup %s/%s = %q, want %q", ctrl, f, got, want)
		}
		return
	}
	t.Errorf("cgroup %s: none of %v readable: %s", ctrl, files, fmt.Sprint(errs))
}

// BuildProbe builds ./probe (static) into dir and returns its path.
func BuildProbe(t testing.TB, dir string) string {
	t.Helper()
	goBin, err := exec.LookPath("go")
	if err != nil {
		goBin = "/usr/local/go/bin/go"
	}
	bin := filepath.Join(dir, "probe")
	cmd := exec.Command(goBin, "build", "-o", bin, "github.com/cubicle-dev/cubicle/internal/runtime/runtimetest/probe")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building the probe: %v\n%s", err, b)
	}
	return bin
}

// snapshotScript records what it finds at boot, writes /tmp/state, then
// ticks; once /out/go appears it changes /tmp/state (after the snapshot).
const snapshotScript = `
if [ -f /tmp/state ]; then cat /tmp/state > /out/seen.new; else echo none > /out/seen.new; fi
mv /out/seen.new /out/seen
cat /etc/extra > /out/extra
echo one > /tmp/state
i=0
while [ $i -lt 100000 ]; do
  i=$((i+1)); echo $i > /out/tick.new; mv /out/tick.new /out/tick
  if [ -f /out/go ] && [ ! -f /out/gone ]; then echo two > /tmp/state; echo two > /out/gone; fi
  sleep 1
done
`

func runSnapshot(t *testing.T, d runtime.Driver, sn runtime.Snapshotter, layers []string, scratch func(*testing.T) string, o Options) {
	ctx := context.Background()
	spec := func(id, out string) runtime.Spec {
		extra := filepath.Join(out, "..", filepath.Base(out)+".extra")
		if err := os.WriteFile(extra, []byte("v1\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		return runtime.Spec{ID: id, Layers: layers, Args: []string{"/bin/sh", "-c", snapshotScript},
			Mounts: []runtime.Mount{{Source: out, Destination: "/out"},
				{Source: extra, Destination: "/etc/extra", ReadOnly: true}},
			Resources: runtime.Resources{CPUCount: 1, MemoryMB: 64, PIDs: 64, DiskMB: 64}}
	}
	del := func(id string) {
		t.Cleanup(func() {
			if err := d.Delete(context.Background(), id); err != nil {
				t.Errorf("cleanup delete %s: %v", id, err)
			}
		})
	}
	outA := scratch(t)
	a := NewID(t)
	del(a)
	if _, err := d.Create(ctx, spec(a, outA)); err != nil {
		t.Fatalf("Create: %v", err)
	}
	waitTickAbove(t, filepath.Join(outA, "tick"), 1, o.Timeout)
	dst := filepath.Join(scratch(t), "snap")
	start := time.Now()
	info, err := sn.Snapshot(ctx, a, dst, true)
	if err != nil {
		t.Fatalf("Snapshot: %v", err)
	}
	t.Cleanup(func() {
		if err := sn.DeleteSnapshot(context.Background(), dst); err != nil {
			t.Errorf("DeleteSnapshot: %v", err)
		}
		if _, err := os.Lstat(dst); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("DeleteSnapshot left %s: %v", dst, err)
		}
	})
	t.Logf("%s: snapshot (%s, %d bytes) took %v", d.Name(), info.Kind, info.SizeBytes, time.Since(start))
	wantKind := runtime.SnapshotFilesystem
	if sn.MemorySnapshots() {
		wantKind = runtime.SnapshotMemory
	}
	if info.Kind != wantKind || (info.Checkpoint != "") != (wantKind == runtime.SnapshotMemory) {
		t.Fatalf("Snapshot = %+v, want kind %s", info, wantKind)
	}
	atSnap := readInt(t, filepath.Join(outA, "tick"))
	// The source keeps running, and what it does next is not in the snapshot.
	if in, err := d.Inspect(ctx, a); err != nil || in.State != runtime.StateRunning {
		t.Fatalf("source after snapshot = %+v, %v; want running", in, err)
	}
	os.WriteFile(filepath.Join(outA, "go"), nil, 0o644)
	WaitFile(t, filepath.Join(outA, "gone"), o.Timeout)
	stateFile := filepath.Join(info.Layer, "tmp", "state")
	if b, err := os.ReadFile(stateFile); err != nil || strings.TrimSpace(string(b)) != "one" {
		t.Fatalf("snapshot layer /tmp/state = %q, %v; want one", b, err)
	}
	// A reboot takes every mount down: the layer is whole again once
	// opened (twice is once), whatever the driver made it of.
	if err := unix.Unmount(info.Layer, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) {
		t.Fatalf("unmount the layer: %v", err)
	}
	for range 2 {
		if err := sn.OpenSnapshot(ctx, dst); err != nil {
			t.Fatalf("OpenSnapshot: %v", err)
		}
	}
	if b, err := os.ReadFile(stateFile); err != nil || strings.TrimSpace(string(b)) != "one" {
		t.Fatalf("reopened snapshot layer /tmp/state = %q, %v; want one", b, err)
	}
	if fi, err := os.Stat(stateFile); err == nil && o.UserNS {
		if uid := fi.Sys().(*syscall.Stat_t).Uid; uid != 0 {
			t.Errorf("snapshot layer file owner = %d, want 0 (IDs unshifted)", uid)
		}
	}

	// A sandbox from the snapshot: the layer on top, memory restored when kept.
	outB := scratch(t)
	b := NewID(t)
	del(b)
	sb := spec(b, outB)
	sb.Layers = append([]string{info.Layer}, layers...)
	sb.Restore = info.Checkpoint
	start = time.Now()
	if _, err := d.Create(ctx, sb); err != nil {
		t.Fatalf("Create from snapshot: %v", err)
	}
	t.Logf("%s: create from snapshot took %v", d.Name(), time.Since(start))
	first := waitTickAbove(t, filepath.Join(outB, "tick"), 0, o.Timeout)
	if info.Kind == runtime.SnapshotMemory {
		// The process continued: its counter is past the snapshot's value,
		// and it never re-ran its boot lines.
		if first < atSnap {
			t.Errorf("restored counter at %d, want >= %d (continued, not restarted)", first, atSnap)
		}
		if _, err := os.Stat(filepath.Join(outB, "seen")); err == nil {
			t.Errorf("restored sandbox re-ran its boot lines")
		}
	} else {
		if got := strings.TrimSpace(string(WaitFile(t, filepath.Join(outB, "seen"), o.Timeout))); got != "one" {
			t.Errorf("sandbox from snapshot saw /tmp/state %q at boot, want one", got)
		}
	}

	// Stop keeps the files and Resume boots afresh over them.
	if err := sn.Stop(ctx, b); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	if in, err := d.Inspect(ctx, b); err != nil || in.State != runtime.StatePaused {
		t.Fatalf("Inspect after Stop = %+v, %v; want paused", in, err)
	}
	os.Remove(filepath.Join(outB, "seen"))
	os.Remove(filepath.Join(outB, "extra"))
	os.WriteFile(filepath.Join(outB, "go"), nil, 0o644)
	// A file mount's source replaced while stopped (an upgraded agent
	// binary): the reboot binds the new file.
	extraB := filepath.Join(outB, "..", filepath.Base(outB)+".extra")
	if err := os.WriteFile(extraB+".new", []byte("v2\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(extraB+".new", extraB); err != nil {
		t.Fatal(err)
	}
	if err := d.Resume(ctx, b); err != nil {
		t.Fatalf("Resume after Stop: %v", err)
	}
	if got := strings.TrimSpace(string(WaitFile(t, filepath.Join(outB, "extra"), o.Timeout))); got != "v2" {
		t.Errorf("rebooted sandbox's file mount = %q, want the replaced source's v2", got)
	}
	if got := strings.TrimSpace(string(WaitFile(t, filepath.Join(outB, "seen"), o.Timeout))); got != "one" && got != "two" {
		t.Errorf("rebooted sandbox saw /tmp/state %q, want its own file kept", got)
	}
	if in, err := d.Inspect(ctx, b); err != nil || in.State != runtime.StateRunning {
		t.Fatalf("Inspect after reboot = %+v, %v; want running", in, err)
	}
}
