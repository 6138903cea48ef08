package oci

import (
	"bufio"
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cubicle-dev/cubicle/internal/runtime"
	"github.com/cubicle-dev/cubicle/internal/runtime/runtimetest"
	"github.com/cubicle-dev/cubicle/internal/testenv"
)

// mountPoints returns the mount points (field 5) of a mountinfo file with
// their per-mount options (field 6).
func mountPoints(t *testing.T, path string) map[string][]string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := map[string][]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) > 6 {
			out[fs[4]] = strings.Split(fs[5], ",")
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// hostSysSubmount gives the host's /sys a writable submount for the test:
// a small world-writable tmpfs on an empty, unmounted sysfs directory that
// nothing here uses, unmounted at cleanup. It returns "" when every
// candidate is taken (the host's own submounts are then the probes).
func hostSysSubmount(t *testing.T) string {
	t.Helper()
	host := mountPoints(t, "/proc/self/mountinfo")
	for _, dir := range []string{"/sys/kernel/debug", "/sys/kernel/tracing", "/sys/fs/bpf", "/sys/fs/pstore", "/sys/kernel/security", "/sys/fs/fuse/connections", "/sys/kernel/config"} {
		if _, mounted := host[dir]; mounted {
			continue
		}
		if ents, err := os.ReadDir(dir); err != nil || len(ents) > 0 {
			continue
		}
		if err := unix.Mount("cubicle-test", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=1777,size=64k"); err != nil {
			t.Fatalf("mount a tmpfs on %s: %v", dir, err)
		}
		t.Cleanup(func() {
			if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
				t.Errorf("unmount %s: %v", dir, err)
			}
		})
		return dir
	}
	return ""
}

// A user-namespaced sandbox gets the host's /sys as a bind; every submount
// under it (securityfs, bpffs, debugfs... whatever the host has, here a
// world-writable tmpfs the test mounts) must be read-only inside too, not
// keep its host flags: mountinfo says ro for each, and creating a file in
// one fails with EROFS.
func TestUsernsSysSubmountsReadOnly(t *testing.T) {
	testUsernsSysSubmountsReadOnly(t, "runc")
}

func testUsernsSysSubmountsReadOnly(t *testing.T, rt string) {
	testenv.RequireRoot(t, "mounts under /sys, "+rt)
	own := hostSysSubmount(t)
	var probes []string
	for mp := range mountPoints(t, "/proc/self/mountinfo") {
		if strings.HasPrefix(mp, "/sys/") && !strings.HasPrefix(mp, "/sys/fs/cgroup") {
			probes = append(probes, mp)
		}
	}
	if len(probes) == 0 {
		t.Fatal("no submount under the host's /sys to probe, and none could be made")
	}
	slices.Sort(probes)

	env := newTestEnvWith(t, rt, true)
	out := filepath.Join(env.base, "out")
	if err := os.Mkdir(out, 0o777); err != nil {
		t.Fatal(err)
	}
	os.Chmod(out, 0o777)
	script := `cat /proc/self/mountinfo > /out/mountinfo
for mp in ` + strings.Join(probes, " ") + `; do
	if mkdir "$mp/cubicle-probe" 2>/out/err; then echo "$mp: created"; else echo "$mp: $(cat /out/err)"; fi
done > /out/mkdir
echo done > /out/done
exec sleep 3600`
	id := runtimetest.NewID(t)
	_, err := env.d.Create(context.Background(), runtime.Spec{
		ID: id, Layers: env.layers, Args: []string{"/bin/sh", "-c", script},
		Mounts:    []runtime.Mount{{Source: out, Destination: "/out"}},
		Resources: runtime.Resources{MemoryMB: 64, PIDs: 64},
	})
	t.Cleanup(func() { env.d.Delete(context.Background(), id) })
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err := os.Stat(filepath.Join(out, "done")); err == nil {
			break
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(env.d.ConsoleLog(id))
			t.Fatalf("script did not finish: %s", log)
		}
		time.Sleep(50 * time.Millisecond)
	}

	inside := mountPoints(t, filepath.Join(out, "mountinfo"))
	var sub int
	for mp, opts := range inside {
		if mp != "/sys" && !strings.HasPrefix(mp, "/sys/") {
			continue
		}
		sub++
		if !slices.Contains(opts, "ro") {
			t.Errorf("%s is mounted %s inside the sandbox, want ro", mp, strings.Join(opts, ","))
		}
	}
	if own != "" {
		if _, ok := inside[own]; !ok {
			t.Errorf("the test's submount %s is not in the sandbox's mountinfo", own)
		}
	}
	if sub < 2 {
		t.Errorf("%d mounts under /sys inside the sandbox, want /sys and its submounts", sub)
	}
	b, _ := os.ReadFile(filepath.Join(out, "mkdir"))
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) != len(probes) {
		t.Fatalf("mkdir results %q for probes %v", b, probes)
	}
	for _, l := range lines {
		if !strings.Contains(l, "Read-only file system") {
			t.Errorf("mkdir under a /sys submount: %s, want EROFS", l)
		}
	}
	if own != "" {
		if _, err := os.Stat(filepath.Join(own, "cubicle-probe")); err == nil {
			t.Errorf("the sandbox created %s/cubicle-probe on the host", own)
		}
	}
}
