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
