package oci

import (
	"context"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/cubicle-dev/cubicle/internal/runtime"
	"github.com/cubicle-dev/cubicle/internal/runtime/runtimetest"
)

// procIDs reads the real uid and CapEff of pid from /proc.
func procIDs(t *testing.T, pid int) (uid, capEff string) {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "Uid:"); ok {
			uid = strings.Fields(v)[0]
		}
		if v, ok := strings.CutPrefix(l, "CapEff:"); ok {
			capEff = strings.TrimSpace(v)
		}
	}
	return uid, capEff
}

// runscProcs are the pids of the sentry (runsc-sandbox ... boot) and the
// gofer serving sandbox id, found by their command lines.
func runscProcs(t *testing.T, id string) (sentry, gofer []int) {
	t.Helper()
	ents, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err != nil {
			continue
		}
		args := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
		if len(args) == 0 || args[len(args)-1] != id {
			continue
		}
		for _, a := range args {
			switch a {
			case "boot":
				sentry = append(sentry, pid)
			case "gofer":
				gofer = append(gofer, pid)
			}
		}
	}
	return sentry, gofer
}

// With user namespaces on, runsc's sentry and gofer run as the sandbox's
// unprivileged host uid, in a user namespace of their own, not as host root.
func TestRunscUsernsSentry(t *testing.T) {
	env := newTestEnvWith(t, "runsc", true)
	ctx := context.Background()
	id := runtimetest.NewID(t)
	_, err := env.d.Create(ctx, runtime.Spec{ID: id, Layers: env.layers, Args: []string{"/bin/sh", "-c", "echo hi > /tmp/x; exec sleep 3600"}})
	t.Cleanup(func() { env.d.Delete(context.Background(), id) })
	if err != nil {
		t.Fatal(err)
	}
	env.d.mu.Lock()
	base := strconv.Itoa(int(slotBase(env.d.slots[id])))
	env.d.mu.Unlock()
	sentry, gofer := runscProcs(t, id)
	if len(sentry) == 0 || len(gofer) == 0 {
		t.Fatalf("sentry %v gofer %v: not found", sentry, gofer)
	}
	for _, pid := range append(sentry, gofer...) {
		uid, capEff := procIDs(t, pid)
		t.Logf("pid %d: uid %s CapEff %s", pid, uid, capEff)
		if uid != base {
			t.Errorf("pid %d runs as host uid %s, want the sandbox's %s", pid, uid, base)
		}
		self, err := os.Readlink("/proc/self/ns/user")
		if err != nil {
			t.Fatal(err)
		}
		if ns, err := os.Readlink("/proc/" + strconv.Itoa(pid) + "/ns/user"); err != nil || ns == self {
			t.Errorf("pid %d is in the host's user namespace (%s, %v)", pid, ns, err)
		}
	}
}
