package lxcfs

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/runtime"
	"github.com/cubicle-dev/cubicle/internal/testenv"
)

func TestBindMounts(t *testing.T) {
	got := BindMounts("/d/lxcfs/mnt", []string{"/proc/meminfo", "/sys/devices/system/cpu/online"})
	want := []runtime.Mount{
		{Source: "/d/lxcfs/mnt/proc/meminfo", Destination: "/proc/meminfo", ReadOnly: true},
		{Source: "/d/lxcfs/mnt/sys/devices/system/cpu/online", Destination: "/sys/devices/system/cpu/online", ReadOnly: true},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("BindMounts: %+v", got)
	}
	var d *Daemon
	if d.Mountpoint() != "" || d.Files() != nil {
		t.Fatal("a nil Daemon must mean no lxcfs")
	}
}

func TestAvailable(t *testing.T) {
	mnt := t.TempDir()
	for _, f := range []string{"proc/meminfo", "proc/stat", "sys/devices/system/cpu/online"} {
		os.MkdirAll(filepath.Join(mnt, filepath.Dir(f)), 0o755)
		os.WriteFile(filepath.Join(mnt, f), []byte("x"), 0o444)
	}
	os.Mkdir(filepath.Join(mnt, "proc", "uptime"), 0o755) // not a file: skipped
	if got, want := available(mnt), []string{"/proc/meminfo", "/proc/stat", "/sys/devices/system/cpu/online"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("available: %v, want %v", got, want)
	}
}

func TestMissingBinary(t *testing.T) {
	_, err := Start(context.Background(), Config{Binary: "/nonexistent/lxcfs", Dir: t.TempDir()})
	if !errors.Is(err, ErrNotFound) || !strings.Contains(err.Error(), "--lxcfs=false") {
		t.Fatalf("Start without lxcfs: %v", err)
	}
}

// A stale pid file (a pid that is not our lxcfs) is never adopted or signalled.
func TestStalePidFileNotAdopted(t *testing.T) {
	dir := t.TempDir()
	d := &Daemon{mnt: filepath.Join(dir, "mnt"), pidFile: filepath.Join(dir, "lxcfs.pid")}
	os.WriteFile(d.pidFile, []byte(strconv.Itoa(os.Getpid())), 0o600)
	if pid := d.adoptable(); pid != 0 {
		t.Fatalf("adopted %d", pid)
	}
}

// The real lxcfs: started, restarted when killed, adopted by a second
// supervisor after Release, and gone (unmounted) after Close.
func TestDaemon(t *testing.T) {
	testenv.RequireRoot(t, "FUSE mount")
	testenv.LookPath(t, "lxcfs")
	dir, err := os.MkdirTemp("/var/tmp", "lxcfs-test-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	cfg := Config{Dir: dir, CheckInterval: 50 * time.Millisecond}
	d, err := Start(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	var seen []int
	defer func() {
		d.Close()
		for _, p := range seen {
			if d.isOurs(p) {
				t.Errorf("lxcfs %d left running", p)
				syscall.Kill(p, syscall.SIGKILL)
			}
		}
		if mounted(d.mnt) {
			t.Errorf("%s still mounted", d.mnt)
			syscall.Unmount(d.mnt, syscall.MNT_DETACH)
		}
	}()
	first := d.PID()
	seen = append(seen, first)
	if !d.isOurs(first) || !contains(d.Files(), "/proc/meminfo") {
		t.Fatalf("pid %d files %v", first, d.Files())
	}
	if b, err := os.ReadFile(filepath.Join(d.Mountpoint(), "proc/meminfo")); err != nil || !strings.HasPrefix(string(b), "MemTotal:") {
		t.Fatalf("meminfo: %q %v", b, err)
	}
	syscall.Kill(first, syscall.SIGKILL)
	deadline := time.Now().Add(10 * time.Second)
	for d.Restarts() == 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	second := d.PID()
	seen = append(seen, second)
	if d.Restarts() != 1 || second == first || second == 0 {
		t.Fatalf("after kill: restarts %d pid %d (was %d)", d.Restarts(), second, first)
	}
	if err := readable(filepath.Join(d.Mountpoint(), "proc/meminfo"), 2*time.Second); err != nil {
		t.Fatalf("restarted lxcfs: %v", err)
	}
	d.Release()
	if !d.isOurs(second) {
		t.Fatal("Release stopped lxcfs")
	}
	d, err = Start(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if d.PID() != second {
		t.Fatalf("second supervisor runs %d, want %d adopted", d.PID(), second)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	if !d.waitGone(second, nil, 5*time.Second) || mounted(d.mnt) {
		t.Fatalf("after Close: pid %d alive %v, mounted %v", second, d.isOurs(second), mounted(d.mnt))
	}
}

// lxcfs runs in a cgroup of its own with a CPU quota (cpu.max, or
// cpu.cfs_quota_us on cgroup v1), so /proc reads in a loop cannot take more
// host CPU than that; a restarted lxcfs lands there too, and Close removes
// the cgroup.
func TestDaemonCPUBound(t *testing.T) {
	testenv.RequireRoot(t, "FUSE mount, cgroups")
	testenv.LookPath(t, "lxcfs")
	dir, err := os.MkdirTemp("/var/tmp", "lxcfs-test-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	cfg := Config{Dir: dir, CheckInterval: 50 * time.Millisecond, CPUs: 0.5, Cgroup: "cubicle-lxcfs-test-" + strconv.Itoa(os.Getpid())}
	d, err := Start(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	cg := d.CgroupDir()
	var seen []int
	defer func() {
		d.Close()
		for _, p := range seen {
			if d.isOurs(p) {
				t.Errorf("lxcfs %d left running", p)
				syscall.Kill(p, syscall.SIGKILL)
			}
		}
		if _, err := os.Stat(cg); err == nil {
			t.Errorf("cgroup %s left after Close", cg)
			syscall.Rmdir(cg)
		}
	}()
	if filepath.Base(cg) != cfg.Cgroup {
		t.Fatalf("CgroupDir %q, want one named %s", cg, cfg.Cgroup)
	}
	quota := func() string {
		if b, err := os.ReadFile(filepath.Join(cg, "cpu.max")); err == nil {
			return strings.TrimSpace(string(b))
		}
		q, err1 := os.ReadFile(filepath.Join(cg, "cpu.cfs_quota_us"))
		p, err2 := os.ReadFile(filepath.Join(cg, "cpu.cfs_period_us"))
		if err1 != nil || err2 != nil {
			t.Fatalf("no cpu.max nor cfs quota in %s: %v %v", cg, err1, err2)
		}
		return strings.TrimSpace(string(q)) + " " + strings.TrimSpace(string(p))
	}
	if got := quota(); got != "50000 100000" {
		t.Errorf("quota %q, want 50000 100000 (0.5 CPU)", got)
	}
	in := func(pid int) bool {
		b, err := os.ReadFile(filepath.Join(cg, "cgroup.procs"))
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range strings.Fields(string(b)) {
			if f == strconv.Itoa(pid) {
				return true
			}
		}
		return false
	}
	first := d.PID()
	seen = append(seen, first)
	if !in(first) {
		t.Fatalf("lxcfs %d is not in %s", first, cg)
	}
	if err := readable(filepath.Join(d.Mountpoint(), "proc/meminfo"), 2*time.Second); err != nil {
		t.Fatalf("bounded lxcfs does not serve: %v", err)
	}
	syscall.Kill(first, syscall.SIGKILL)
	deadline := time.Now().Add(10 * time.Second)
	for d.Restarts() == 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	second := d.PID()
	seen = append(seen, second)
	if second == 0 || second == first || !in(second) {
		t.Fatalf("restarted lxcfs %d (was %d) not in %s", second, first, cg)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(cg); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("cgroup %s after Close: %v", cg, err)
	}
}

func TestBadCPUBound(t *testing.T) {
	for _, c := range []Config{{CPUs: -1}, {CPUs: 0.001, Cgroup: "x"}, {CPUs: 1, Cgroup: "../x"}} {
		c.Dir = t.TempDir()
		if _, err := Start(context.Background(), c); !errors.Is(err, ErrCgroup) {
			t.Errorf("Start(%+v) = %v, want ErrCgroup", c, err)
		}
	}
}
