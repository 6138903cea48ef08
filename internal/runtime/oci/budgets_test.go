package oci

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cubicle-dev/cubicle/internal/runtime"
	"github.com/cubicle-dev/cubicle/internal/runtime/runtimetest"

	"github.com/cubicle-dev/cubicle/internal/testenv"
)

// One user-namespaced sandbox takes every per-user kernel budget it can
// (inotify instances and watches, POSIX message-queue bytes, queued
// signals); another sandbox and host root still get theirs. With the
// namespaces owned by root, all three drew on host root's budgets.
func TestUsernsKernelBudgets(t *testing.T) {
	env := newTestEnvWith(t, "runc", true)
	ctx := context.Background()
	probe := runtimetest.BuildProbe(t, t.TempDir())
	mounts := func(out string) []runtime.Mount {
		return []runtime.Mount{{Source: out, Destination: "/out"}, {Source: probe, Destination: "/.cubicle/probe", ReadOnly: true}}
	}
	create := func(args string, out string) string {
		id := runtimetest.NewID(t)
		_, err := env.d.Create(ctx, runtime.Spec{ID: id, Layers: env.layers, Args: []string{"/bin/sh", "-c", args}, Mounts: mounts(out)})
		t.Cleanup(func() { env.d.Delete(context.Background(), id) })
		if err != nil {
			t.Fatalf("Create: %v", err)
		}
		return id
	}
	parse := func(b []byte) map[string]string {
		m := map[string]string{}
		for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
			if k, v, ok := strings.Cut(l, "="); ok {
				m[k] = v
			}
		}
		return m
	}

	hog := t.TempDir()
	hogID := create("mkdir -p /tmp/w && exec /.cubicle/probe budgets exhaust /tmp/w /out/taken", hog)
	taken := parse(runtimetest.WaitFile(t, filepath.Join(hog, "taken"), 2*time.Minute))
	t.Logf("the hog took %v", taken)
	// Each budget really ran out, with the errno that says so.
	for name, errno := range map[string]string{"inotify-instances": "EMFILE", "inotify-watches": "ENOSPC", "mqueue": "EMFILE", "sigqueue": "EAGAIN"} {
		if taken[name+"-err"] != errno {
			t.Errorf("%s: stopped by %q, want %s", name, taken[name+"-err"], errno)
		}
		if n, _ := strconv.Atoi(taken[name+"-count"]); n == 0 {
			t.Errorf("%s: the hog got none", name)
		}
	}

	want := func(who string, got map[string]string) {
		t.Helper()
		for _, name := range []string{"inotify-instances", "inotify-watches", "mqueue", "sigqueue"} {
			if got[name] != "ok" {
				t.Errorf("%s: %s = %q after the hog took its budget, want ok", who, name, got[name])
			}
		}
	}

	// Host root, in an IPC namespace of its own so its queue is private.
	host := exec.Command(probe, "budgets", "one", t.TempDir())
	host.SysProcAttr = &syscall.SysProcAttr{Cloneflags: unix.CLONE_NEWIPC}
	out, err := host.CombinedOutput()
	if err != nil {
		t.Fatalf("probe on the host: %v: %s", err, out)
	}
	want("host root", parse(out))

	neighbour := t.TempDir()
	create("/.cubicle/probe budgets one /tmp > /out/got.tmp 2>&1; mv /out/got.tmp /out/got; exec sleep 3600", neighbour)
	want("another sandbox", parse(runtimetest.WaitFile(t, filepath.Join(neighbour, "got"), time.Minute)))

	// The hog held its budgets all along: they are freed when it exits.
	if info, err := env.d.Inspect(ctx, hogID); err != nil || info.State != runtime.StateRunning {
		t.Fatalf("the hog is no longer running (%+v, %v): the checks above proved nothing", info, err)
	}
}

// The namespace a sandbox joins is owned by its own host uid, not root,
// and is bound only while runc joins it.
func TestUsernsOwner(t *testing.T) {
	env := newTestEnvWith(t, "runc", true)
	ctx := context.Background()
	id := runtimetest.NewID(t)
	info, err := env.d.Create(ctx, runtime.Spec{ID: id, Layers: env.layers, Args: []string{"/bin/sh", "-c", "exec sleep 3600"}})
	t.Cleanup(func() { env.d.Delete(context.Background(), id) })
	if err != nil {
		t.Fatal(err)
	}
	owner, err := nsOwner("/proc/" + strconv.Itoa(info.Pid) + "/ns/user")
	if err != nil {
		t.Fatal(err)
	}
	env.d.mu.Lock()
	base := slotBase(env.d.slots[id])
	env.d.mu.Unlock()
	if owner != base {
		t.Errorf("sandbox's user namespace is owned by host uid %d, want its slot's %d", owner, base)
	}
	// runc no longer sets rlimits in such a namespace; PID 1 inherits them.
	rl := nofileRlimit(true)
	limits, err := os.ReadFile("/proc/" + strconv.Itoa(info.Pid) + "/limits")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(limits), "\n") {
		if f := strings.Fields(strings.TrimPrefix(l, "Max open files")); strings.HasPrefix(l, "Max open files") &&
			(len(f) < 2 || f[0] != strconv.FormatUint(rl.Soft, 10) || f[1] != strconv.FormatUint(rl.Hard, 10)) {
			t.Errorf("PID 1's %q, want %d/%d", l, rl.Soft, rl.Hard)
		}
	}
	if mps, _ := MountsUnder(env.d.dir(id)); len(mps) > 0 {
		for _, m := range mps {
			if m == env.d.usernsPath(id) {
				t.Errorf("user namespace still bound at %s after create", m)
			}
		}
	}
}

// The bind target sits in a directory the sandbox's host uid owns: a link
// put there is replaced, never followed.
func TestBindOwnedUsernsNoFollow(t *testing.T) {
	testenv.RequireRoot(t, "bind mounts")
	dir := t.TempDir()
	victim := filepath.Join(dir, "victim")
	if err := os.WriteFile(victim, []byte("keep"), 0o600); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, "userns")
	if err := os.Symlink(victim, p); err != nil {
		t.Fatal(err)
	}
	if err := bindOwnedUserns(usernsBase, usernsSize, p); err != nil {
		t.Fatal(err)
	}
	defer unbindUserns(p)
	if b, err := os.ReadFile(victim); err != nil || string(b) != "keep" {
		t.Fatalf("link target touched: %q, %v", b, err)
	}
	if owner, err := nsOwner(p); err != nil || owner != usernsBase {
		t.Fatalf("bound namespace owner %d, %v; want %d", owner, err, usernsBase)
	}
	if mps, _ := MountsUnder(dir); len(mps) != 1 || mps[0] != p {
		t.Fatalf("mounts under %s: %v, want just %s", dir, mps, p)
	}
	if err := unbindUserns(p); err != nil {
		t.Fatal(err)
	}
}
