package nodegrpc_test

import (
	"context"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/node"
	"github.com/cubicle-dev/cubicle/internal/node/nodetest/localnode"
	"github.com/cubicle-dev/cubicle/internal/runtime"
	"github.com/cubicle-dev/cubicle/internal/snapstore"
)

// A runsc sandbox paused with its memory (checkpointed) moves to another
// runsc node with it, as the control plane moves a paused sandbox: node A
// snapshots the paused sandbox (its checkpoint hard-linked, a memory
// snapshot) and pushes both parts through presigned URLs; node B (over
// gRPC) fetches them and creates the same sandbox ID restoring that
// memory, with the token its agent holds. A process started before the
// pause is still running there.
func TestPausedRunscSandboxMovesWithMemory(t *testing.T) {
	st, a, b, layers := twoNodes(t, localnode.NewRunsc)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()

	id := "pmr" + localnode.RandHex(t, 8)
	req := node.CreateRequest{ID: id, Layers: layers, EnvdToken: "tok", DefaultUser: "user", CPUCount: 1, MemoryMB: 256, DiskSizeMB: 256}
	if _, err := a.Create(ctx, req); err != nil {
		t.Fatal(err)
	}
	aGone := false
	t.Cleanup(func() {
		if !aGone {
			_ = a.Delete(context.Background(), id)
		}
	})
	if c, err := a.Run(ctx, id, "tok", "user", "sleep 1000 >/dev/null 2>&1 & echo $! > /home/user/pid; echo kept > /home/user/f"); err != nil || c != 0 {
		t.Fatalf("start: %d %v", c, err)
	}
	if err := a.Pause(ctx, id); err != nil {
		t.Fatal(err)
	}
	sid := "snap_" + localnode.RandHex(t, 8)
	sn, err := a.Snapshot(ctx, id, sid)
	if err != nil {
		t.Fatal(err)
	}
	if sn.Kind != runtime.SnapshotMemory {
		t.Fatalf("snapshot of a checkpointed runsc pause: kind %q, want memory", sn.Kind)
	}
	pushed := pushSnapshot(t, ctx, st, a, sid, snapstore.PartRootfs, snapstore.PartCheckpoint)
	t.Cleanup(func() { _ = st.Delete(context.Background(), sid) })
	// Node A is gone (its copy deleted, as the reconcile does when it returns).
	if err := a.Delete(ctx, id); err != nil {
		t.Fatal(err)
	}
	aGone = true
	gets, err := st.GetURLs(ctx, sid, pushed)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.FetchSnapshot(ctx, sid, gets); err != nil {
		t.Fatal(err)
	}
	moved := req
	moved.SnapshotLayers, moved.RestoreSnapshot, moved.CurrentToken = []string{sid}, sid, "tok"
	if _, err := b.Create(ctx, moved); err != nil {
		t.Fatalf("restore on node B: %v", err)
	}
	t.Cleanup(func() { _ = b.Delete(context.Background(), id) })
	if c, err := b.Run(ctx, id, "tok", "user", `kill -0 "$(cat /home/user/pid)"`); err != nil || c != 0 {
		t.Fatalf("node B's sandbox: the process from before the pause is gone (exit %d %v)", c, err)
	}
	if c, err := b.Run(ctx, id, "tok", "user", `test "$(cat /home/user/f)" = kept`); err != nil || c != 0 {
		t.Fatalf("node B's sandbox lacks the paused files: %d %v", c, err)
	}
}
