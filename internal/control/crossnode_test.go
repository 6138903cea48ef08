package control

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"

	"github.com/cubicle-dev/cubicle/internal/node"
	"github.com/cubicle-dev/cubicle/internal/nodeset"
	"github.com/cubicle-dev/cubicle/internal/runtime"
	"github.com/cubicle-dev/cubicle/internal/snapstore"
	"github.com/cubicle-dev/cubicle/internal/snapstore/snapstoretest"
	"github.com/cubicle-dev/cubicle/internal/store"
	"github.com/cubicle-dev/cubicle/internal/volume/s3/s3test"
)

// newSnapCluster is newCluster with nodes that pull images and keep
// snapshot files, and (withStore) a snapshot store on a real S3 server.
func newSnapCluster(t *testing.T, withStore bool) (*cluster, *s3test.Server) {
	t.Helper()
	ctx := context.Background()
	st := openSQLite(t)
	tpl := &store.Template{ID: "tpl", PrimaryName: "tpl", Names: []string{"tpl"}, ReadyBuildID: "b1", LatestBuildID: "b1", BuildStatus: store.BuildReady}
	if err := st.CreateTemplate(ctx, tpl, &store.TemplateBuild{ID: "b1", TemplateID: "tpl", Status: store.BuildReady, Rootfs: "/x"}); err != nil {
		t.Fatal(err)
	}
	c := &cluster{st: st, nodes: map[string]*remoteNode{}}
	for _, id := range []string{"node-a", "node-b"} {
		n := newRemoteNode()
		n.pulls, n.snapKind, n.snapDir = true, runtime.SnapshotFilesystem, t.TempDir()
		c.nodes[id] = n
		if err := st.RegisterNode(ctx, &store.Node{ID: id, Address: id + ":7443", Runtime: "fake",
			Capacity: store.Capacity{MilliCPU: 4000, MemoryMiB: 1 << 20}}); err != nil {
			t.Fatal(err)
		}
	}
	set := nodeset.New(nodeset.Config{Registry: st, Dial: func(row *store.Node) (node.Node, io.Closer, error) {
		return c.nodes[row.ID], io.NopCloser(nil), nil
	}})
	cfg := Config{Nodes: set}
	var gw *s3test.Server
	if withStore {
		cfg.SnapshotStore, gw = snapstoretest.New(t)
	}
	c.m = New(cfg, st, nil, storeResolver{st})
	return c, gw
}

func other(id string) string {
	if id == "node-a" {
		return "node-b"
	}
	return "node-a"
}

// With a snapshot store, a snapshot is uploaded when it is taken, and a
// create from it that cannot go to its node (cordoned) starts on the other
// node, which fetches the package first (real bytes through presigned
// URLs) and boots it by ID. A rollback there onto it works too, and
// purging the deleted snapshot removes its package.
func TestCreateFromSnapshotOnAnotherNode(t *testing.T) {
	ctx := context.Background()
	c, gw := newSnapCluster(t, true)
	src := c.create(t)
	sn, err := c.m.Snapshot(ctx, src.ID, "")
	if err != nil {
		t.Fatal(err)
	}
	if len(sn.Package) != 1 || sn.Package[0].Part != snapstore.PartRootfs || !strings.HasPrefix(sn.Package[0].Digest, "sha256:") {
		t.Fatalf("package: %+v", sn.Package)
	}
	if keys := gw.Keys(t, sn.ID+"/"); len(keys) != 1 {
		t.Fatalf("objects: %v", keys)
	}
	if _, err := c.st.SetNodeFlags(ctx, src.Node, true, false); err != nil {
		t.Fatal(err)
	}
	to := other(src.Node)
	sb, err := c.m.Create(ctx, CreateOptions{TemplateID: sn.ID, Timeout: time.Minute})
	if err != nil {
		t.Fatalf("create from a snapshot whose node is cordoned: %v", err)
	}
	if sb.Node != to {
		t.Fatalf("placed on %s, want %s", sb.Node, to)
	}
	dst := c.nodes[to]
	if b, err := os.ReadFile(filepath.Join(dst.snapDir, sn.ID, "rootfs", "marker")); err != nil || string(b) != sn.ID {
		t.Fatalf("node %s's copy of the snapshot: %q %v", to, b, err)
	}
	req := dst.req(sb.ID)
	if req.Image != (node.Image{Name: "mini"}) || fmt.Sprint(req.SnapshotLayers) != fmt.Sprint([]string{sn.ID}) || req.Layers != nil {
		t.Fatalf("request on %s: image %+v chain %v layers %v", to, req.Image, req.SnapshotLayers, req.Layers)
	}
	// A second create there reuses the fetched copy.
	if _, err := c.m.Create(ctx, CreateOptions{TemplateID: sn.ID, Timeout: time.Minute}); err != nil {
		t.Fatal(err)
	}
	if len(dst.fetched) != 1 {
		t.Fatalf("fetches: %v, want one", dst.fetched)
	}
	// Rollback of a sandbox on the other node onto the snapshot.
	if _, err := c.st.SetNodeFlags(ctx, src.Node, false, false); err != nil {
		t.Fatal(err)
	}
	if err := c.m.Rollback(ctx, sb.ID, sn.ID); err != nil {
		t.Fatalf("rollback onto a snapshot of another node: %v", err)
	}
	// Deleted and unused: files and package go.
	all, _ := c.st.ListSandboxes(ctx, store.SandboxFilter{States: liveStates})
	for _, s := range all {
		if err := c.m.Kill(ctx, s.ID, "done"); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.m.DeleteSnapshot(ctx, sn.ID); err != nil {
		t.Fatal(err)
	}
	if err := c.m.reconcileSnapshots(ctx); err != nil {
		t.Fatal(err)
	}
	if keys := gw.Keys(t, sn.ID+"/"); len(keys) != 0 {
		t.Fatalf("package left after purge: %v", keys)
	}
}

// Without a snapshot store a snapshot stays on its node: a create from it
// while that node cannot take it, and a rollback onto it from another
// node, are refused with the flag named.
func TestCrossNodeWithoutStoreNamesTheFlag(t *testing.T) {
	ctx := context.Background()
	c, _ := newSnapCluster(t, false)
	src := c.create(t)
	sn, err := c.m.Snapshot(ctx, src.ID, "")
	if err != nil {
		t.Fatal(err)
	}
	if sn.Package != nil {
		t.Fatalf("package without a store: %+v", sn.Package)
	}
	if _, err := c.st.SetNodeFlags(ctx, src.Node, true, false); err != nil {
		t.Fatal(err)
	}
	_, err = c.m.Create(ctx, CreateOptions{TemplateID: sn.ID, Timeout: time.Minute})
	if err == nil || !strings.Contains(err.Error(), "--snapshot-store") {
		t.Fatalf("create with the snapshot's node cordoned: %v, want the flag named", err)
	}
	sb := c.create(t) // on the other node: the snapshot's is cordoned
	if sb.Node == src.Node {
		t.Fatalf("placed on the cordoned node")
	}
	err = c.m.Rollback(ctx, sb.ID, sn.ID)
	if !errors.Is(err, ErrConflict) || !strings.Contains(err.Error(), "--snapshot-store") {
		t.Fatalf("rollback across nodes: %v, want ErrConflict naming the flag", err)
	}
}

// A package replaced in the bucket behind the control plane's back fails
// the fetch (digest mismatch): the create is refused before any row is
// written, and the other node keeps nothing of it.
func TestCrossNodeFetchRefusesReplacedPackage(t *testing.T) {
	ctx := context.Background()
	c, gw := newSnapCluster(t, true)
	src := c.create(t)
	sn, err := c.m.Snapshot(ctx, src.ID, "")
	if err != nil {
		t.Fatal(err)
	}
	cl, err := gw.Client()
	if err != nil {
		t.Fatal(err)
	}
	evil := []byte("not the package")
	if _, err := cl.PutObject(ctx, gw.Bucket, sn.ID+"/rootfs.tar", bytes.NewReader(evil), int64(len(evil)), minio.PutObjectOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.st.SetNodeFlags(ctx, src.Node, true, false); err != nil {
		t.Fatal(err)
	}
	before, _ := c.st.ListSandboxes(ctx, store.SandboxFilter{})
	_, err = c.m.Create(ctx, CreateOptions{TemplateID: sn.ID, Timeout: time.Minute})
	if !errors.Is(err, snapstore.ErrDigestMismatch) {
		t.Fatalf("create from a replaced package: %v, want ErrDigestMismatch", err)
	}
	if after, _ := c.st.ListSandboxes(ctx, store.SandboxFilter{}); len(after) != len(before) {
		t.Fatalf("a refused create left a row: %d rows, had %d", len(after), len(before))
	}
	if ents, _ := os.ReadDir(c.nodes[other(src.Node)].snapDir); len(ents) != 0 {
		t.Fatalf("the other node kept %v", ents)
	}
}
