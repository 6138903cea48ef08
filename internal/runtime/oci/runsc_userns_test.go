package oci

import (
	"context"
	"os"
	"strconv"
	"testing"

	"github.com/cubicle-dev/cubicle/internal/runtime"
	"github.com/cubicle-dev/cubicle/internal/runtime/runtimetest"
)

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
	sentry, gofer := runtimetest.RunscProcs(t, id)
	if len(sentry) == 0 || len(gofer) == 0 {
		t.Fatalf("sentry %v gofer %v: not found", sentry, gofer)
	}
	for _, pid := range append(sentry, gofer...) {
		uid, capEff := runtimetest.ProcIDs(t, pid)
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
