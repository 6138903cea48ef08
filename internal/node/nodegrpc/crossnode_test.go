package nodegrpc_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/node"
	"github.com/cubicle-dev/cubicle/internal/node/nodegrpc"
	"github.com/cubicle-dev/cubicle/internal/node/nodegrpc/nodegrpctest"
	"github.com/cubicle-dev/cubicle/internal/node/nodetest/localnode"
	"github.com/cubicle-dev/cubicle/internal/snapstore"
	"github.com/cubicle-dev/cubicle/internal/snapstore/snapstoretest"
	"github.com/cubicle-dev/cubicle/internal/volume/local"
)

// twoNodes is the set-up of a move between nodes: a real S3 snapshot
// store (versitygw on loopback), node a in this process and node b over
// gRPC, both made by newNode (localnode.New, NewRunsc), and the base
// image's layers. All of it goes when tb ends.
func twoNodes(tb testing.TB, newNode func(testing.TB) (*node.Local, *local.Plugin)) (st *snapstore.Store, a *node.Local, b *nodegrpc.Client, layers []string) {
	tb.Helper()
	st, _ = snapstoretest.New(tb)
	a, _ = newNode(tb)
	lb, _ := newNode(tb)
	return st, a, nodegrpctest.Pipe(tb, lb), localnode.Layers(tb)
}

// pushSnapshot uploads the parts of n's snapshot sid to st through
// presigned PUT URLs and returns the objects as pushed.
func pushSnapshot(tb testing.TB, ctx context.Context, st *snapstore.Store, n node.Node, sid string, parts ...string) []node.SnapshotObject {
	tb.Helper()
	puts, err := st.PutURLs(ctx, sid, parts...)
	if err != nil {
		tb.Fatal(err)
	}
	pushed, err := n.PushSnapshot(ctx, sid, puts)
	if err != nil {
		tb.Fatal(err)
	}
	return pushed
}

// A snapshot taken on node A is pushed to a real S3 server through
// presigned PUT URLs, fetched by node B (over gRPC) through presigned GET
// URLs, and a sandbox on B from it by ID has A's files. A wrong digest
// leaves B without the snapshot.
func TestCrossNodeRestoreThroughS3(t *testing.T) {
	st, a, b, layers := twoNodes(t, localnode.New)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	src := node.CreateRequest{ID: "xsrc" + localnode.RandHex(t, 8), Layers: layers, EnvdToken: "tok-a", DefaultUser: "user", CPUCount: 1, MemoryMB: 128, DiskSizeMB: 256}
	if _, err := a.Create(ctx, src); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Delete(context.Background(), src.ID) })
	if c, err := a.Run(ctx, src.ID, "tok-a", "user", "mkdir -p /home/user/d && echo from-node-a > /home/user/d/f && ln -s /etc/hostname /home/user/link"); err != nil || c != 0 {
		t.Fatalf("write: %d %v", c, err)
	}
	sid := "snap_" + localnode.RandHex(t, 8)
	if _, err := a.Snapshot(ctx, src.ID, sid); err != nil {
		t.Fatal(err)
	}
	pushed := pushSnapshot(t, ctx, st, a, sid, snapstore.PartRootfs)
	t.Cleanup(func() { _ = st.Delete(context.Background(), sid) })

	// A digest that is not the push's: refused over the wire, nothing kept.
	bad := pushed[0]
	bad.Digest = "sha256:" + strings.Repeat("0f", 32)
	badURLs, err := st.GetURLs(ctx, sid, []node.SnapshotObject{bad})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.FetchSnapshot(ctx, sid, badURLs); !errors.Is(err, snapstore.ErrDigestMismatch) {
		t.Fatalf("fetch with a wrong digest: %v, want ErrDigestMismatch", err)
	}
	if ids, _ := b.Snapshots(ctx); len(ids) != 0 {
		t.Fatalf("a refused fetch left snapshots %v", ids)
	}

	gets, err := st.GetURLs(ctx, sid, pushed)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.FetchSnapshot(ctx, sid, gets); err != nil {
		t.Fatal(err)
	}
	if err := b.FetchSnapshot(ctx, sid, gets); err != nil {
		t.Fatalf("second fetch of a snapshot the node has: %v", err)
	}
	dst := node.CreateRequest{ID: "xdst" + localnode.RandHex(t, 8), Layers: layers, SnapshotLayers: []string{sid}, EnvdToken: "tok-b",
		DefaultUser: "user", CPUCount: 1, MemoryMB: 128, DiskSizeMB: 256}
	if _, err := b.Create(ctx, dst); err != nil {
		t.Fatalf("create on node B from the fetched snapshot: %v", err)
	}
	t.Cleanup(func() { _ = b.Delete(context.Background(), dst.ID) })
	if c, err := b.Run(ctx, dst.ID, "tok-b", "user", `test "$(cat /home/user/d/f)" = from-node-a && test "$(readlink /home/user/link)" = /etc/hostname`); err != nil || c != 0 {
		t.Fatalf("node B's sandbox lacks node A's files: exit %d %v", c, err)
	}
}
