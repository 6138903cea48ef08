package control

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/node"
	"github.com/cubicle-dev/cubicle/internal/runtime"
	"github.com/cubicle-dev/cubicle/internal/store"
	"github.com/cubicle-dev/cubicle/internal/store/sqlite"
	"github.com/cubicle-dev/cubicle/internal/template"
)

// snapResolver is imageResolver plus snapshot templates, resolved from
// their build rows as the catalog does (the build's rootfs: the node's
// snapshot paths over the source's layers; no image).
type snapResolver struct{ st store.Store }

func (r snapResolver) Resolve(ctx context.Context, ref string) (template.Template, error) {
	if t, err := r.st.GetTemplate(ctx, ref); err == nil {
		b, err := r.st.GetTemplateBuild(ctx, t.ReadyBuildID)
		if err != nil {
			return template.Template{}, err
		}
		return template.Template{ID: t.ID, Alias: t.ID, Layers: template.Layers(b.Rootfs), CPUCount: 1, MemoryMB: 128, BuildID: b.ID}, nil
	}
	return imageResolver{}.Resolve(ctx, ref)
}

func newSnapRefManager(t *testing.T, pulls bool, kind string) (*Manager, *fakeNode) {
	t.Helper()
	st, err := sqlite.Open(filepath.Join(t.TempDir(), "c.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	n := newFakeNode()
	n.pulls, n.snapKind = pulls, kind
	m := New(Config{ImageDigest: func(ref string) (node.Image, error) {
		if ref != "cubicle/built:b1" {
			return node.Image{}, fmt.Errorf("no image %s", ref)
		}
		return node.Image{Name: "cubicle/built", Digest: builtDigest}, nil
	}}, st, n, snapResolver{st})
	if err := m.RegisterNode(context.Background()); err != nil {
		t.Fatal(err)
	}
	return m, n
}

func (f *fakeNode) req(id string) node.CreateRequest {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.sbs[id]
}

// On a node that pulls images, rows record the image and the snapshot
// chain by ID, and creates from snapshots (two deep, memory on top) and
// rollbacks send those references, never a path: the node resolves them
// in its own snapshot dir.
func TestSnapshotsByReferenceOnPullingNode(t *testing.T) {
	ctx := context.Background()
	built := node.Image{Name: "cubicle/built", Digest: builtDigest}
	m, n := newSnapRefManager(t, true, runtime.SnapshotFilesystem)
	src, err := m.Create(ctx, CreateOptions{TemplateID: "built", Timeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if row, _ := m.store.GetSandbox(ctx, src.ID); row.Image != built.String() || row.SnapshotLayers != nil {
		t.Fatalf("source row: image %q snapshot layers %v", row.Image, row.SnapshotLayers)
	}
	s1, err := m.Snapshot(ctx, src.ID, "")
	if err != nil {
		t.Fatal(err)
	}
	if s1.Image != built.String() || fmt.Sprint(s1.SnapshotLayers) != fmt.Sprint([]string{s1.ID}) {
		t.Fatalf("first snapshot: image %q chain %v", s1.Image, s1.SnapshotLayers)
	}
	// A filesystem snapshot: the chain, no restore.
	c1, err := m.Create(ctx, CreateOptions{TemplateID: s1.ID, Timeout: time.Minute})
	if err != nil {
		t.Fatalf("create from a snapshot on a pulling node: %v", err)
	}
	req := n.req(c1.ID)
	if req.Image != built || req.Layers != nil || fmt.Sprint(req.SnapshotLayers) != fmt.Sprint([]string{s1.ID}) ||
		req.Restore != "" || req.RestoreSnapshot != "" {
		t.Fatalf("from %s: image %+v layers %v snapshot layers %v restore %q/%q", s1.ID, req.Image, req.Layers, req.SnapshotLayers, req.Restore, req.RestoreSnapshot)
	}
	// A memory snapshot of that sandbox stacks on the chain.
	n.snapKind = runtime.SnapshotMemory
	s2, err := m.Snapshot(ctx, c1.ID, "")
	if err != nil {
		t.Fatal(err)
	}
	wantChain := fmt.Sprint([]string{s2.ID, s1.ID})
	if s2.Image != built.String() || fmt.Sprint(s2.SnapshotLayers) != wantChain {
		t.Fatalf("second snapshot: image %q chain %v", s2.Image, s2.SnapshotLayers)
	}
	c2, err := m.Create(ctx, CreateOptions{TemplateID: s2.ID, Timeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	req = n.req(c2.ID)
	if req.Image != built || req.Layers != nil || fmt.Sprint(req.SnapshotLayers) != wantChain || req.Restore != "" ||
		req.RestoreSnapshot != s2.ID || req.CurrentToken != c1.EnvdToken {
		t.Fatalf("from memory %s: image %+v layers %v chain %v restore %q/%q token %q", s2.ID, req.Image, req.Layers, req.SnapshotLayers, req.Restore, req.RestoreSnapshot, req.CurrentToken)
	}
	if row, _ := m.store.GetSandbox(ctx, c2.ID); row.Image != built.String() || fmt.Sprint(row.SnapshotLayers) != wantChain {
		t.Fatalf("row from %s: image %q chain %v", s2.ID, row.Image, row.SnapshotLayers)
	}
	// Rollback of the source onto the memory snapshot: the same references.
	if err := m.Rollback(ctx, src.ID, s2.ID); err != nil {
		t.Fatalf("rollback on a pulling node: %v", err)
	}
	req = n.req(src.ID)
	if req.Image != built || req.Layers != nil || fmt.Sprint(req.SnapshotLayers) != wantChain || req.RestoreSnapshot != s2.ID || req.Restore != "" {
		t.Fatalf("rollback request: image %+v layers %v chain %v restore %q/%q", req.Image, req.Layers, req.SnapshotLayers, req.Restore, req.RestoreSnapshot)
	}
	if row, _ := m.store.GetSandbox(ctx, src.ID); row.State != store.StateRunning || fmt.Sprint(row.SnapshotLayers) != wantChain || row.Image != built.String() {
		t.Fatalf("rolled-back row: %s image %q chain %v", row.State, row.Image, row.SnapshotLayers)
	}
}

// The embedded node keeps getting paths for creates from snapshots and
// rollbacks, exactly as before references existed (and its rows still
// record the chain by ID).
func TestSnapshotsByPathOnEmbeddedNode(t *testing.T) {
	ctx := context.Background()
	m, n := newSnapRefManager(t, false, runtime.SnapshotMemory)
	src, err := m.Create(ctx, CreateOptions{TemplateID: "built", Timeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	s1, err := m.Snapshot(ctx, src.ID, "")
	if err != nil {
		t.Fatal(err)
	}
	c1, err := m.Create(ctx, CreateOptions{TemplateID: s1.ID, Timeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	req := n.req(c1.ID)
	wantLayers := fmt.Sprint([]string{"/node/snapshots/" + s1.ID + "/rootfs", "/cp/built/rootfs"})
	if !req.Image.IsZero() || fmt.Sprint(req.Layers) != wantLayers || req.SnapshotLayers != nil ||
		req.Restore != "/node/snapshots/"+s1.ID+"/checkpoint" || req.RestoreSnapshot != "" {
		t.Fatalf("embedded from %s: image %+v layers %v chain %v restore %q/%q", s1.ID, req.Image, req.Layers, req.SnapshotLayers, req.Restore, req.RestoreSnapshot)
	}
	if err := m.Rollback(ctx, src.ID, s1.ID); err != nil {
		t.Fatal(err)
	}
	if req = n.req(src.ID); !req.Image.IsZero() || fmt.Sprint(req.Layers) != wantLayers || req.SnapshotLayers != nil {
		t.Fatalf("embedded rollback: image %+v layers %v chain %v", req.Image, req.Layers, req.SnapshotLayers)
	}
	if row, _ := m.store.GetSandbox(ctx, c1.ID); row.Image != "" || fmt.Sprint(row.SnapshotLayers) != fmt.Sprint([]string{s1.ID}) {
		t.Fatalf("embedded row: image %q chain %v", row.Image, row.SnapshotLayers)
	}
}

// A deleted snapshot that a live sandbox on a pulling node stacks on by
// ID keeps its files; they go with the last such sandbox.
func TestSnapshotGCKeepsChainInUseByReference(t *testing.T) {
	ctx := context.Background()
	m, _ := newSnapRefManager(t, true, runtime.SnapshotFilesystem)
	src, err := m.Create(ctx, CreateOptions{TemplateID: "built", Timeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	s1, err := m.Snapshot(ctx, src.ID, "")
	if err != nil {
		t.Fatal(err)
	}
	c1, err := m.Create(ctx, CreateOptions{TemplateID: s1.ID, Timeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	// Only the reference marks it in use: the row's paths say nothing.
	row, _ := m.store.GetSandbox(ctx, c1.ID)
	row.Layers = nil
	if err := m.store.UpdateSandbox(ctx, row); err != nil {
		t.Fatal(err)
	}
	if err := m.DeleteSnapshot(ctx, s1.ID); err != nil {
		t.Fatal(err)
	}
	if err := m.reconcileSnapshots(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := m.store.GetSnapshot(ctx, s1.ID); err != nil {
		t.Fatalf("a snapshot in use by ID was purged: %v", err)
	}
	if err := m.Kill(ctx, c1.ID, "done"); err != nil {
		t.Fatal(err)
	}
	if err := m.reconcileSnapshots(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := m.store.GetSnapshot(ctx, s1.ID); err == nil {
		t.Fatal("the snapshot outlived its last sandbox")
	}
}

// A snapshot's volumes are recorded by ID, and a team's volume IDs are not
// their names: a sandbox from the snapshot, and a rollback onto it, mount
// the same volumes of that team by name (they failed with "volume not
// found" for every team but the default one).
func TestSnapshotVolumesOfATeamMountAgain(t *testing.T) {
	ctx := context.Background()
	m, n := newSnapRefManager(t, false, runtime.SnapshotFilesystem)
	n.volDrivers = []string{"local"}
	const team = "team_snapvol"
	if err := m.store.CreateTeam(ctx, &store.Team{ID: team, Name: "snapvol"}); err != nil {
		t.Fatal(err)
	}
	if err := m.store.CreateVolume(ctx, &store.Volume{ID: "vol_x1y2z3", TeamID: team, Name: "data", Driver: "local", State: store.VolumeReady}); err != nil {
		t.Fatal(err)
	}
	src, err := m.Create(ctx, CreateOptions{TemplateID: "built", TeamID: team, Timeout: time.Minute,
		VolumeMounts: []VolumeMount{{Name: "data", Path: "/data"}}})
	if err != nil {
		t.Fatal(err)
	}
	sn, err := m.Snapshot(ctx, src.ID, "")
	if err != nil {
		t.Fatal(err)
	}
	from, err := m.Create(ctx, CreateOptions{TemplateID: sn.ID, TeamID: team, Timeout: time.Minute})
	if err != nil {
		t.Fatalf("create from the snapshot: %v", err)
	}
	for _, id := range []string{from.ID, src.ID} {
		if id == src.ID {
			if err := m.Rollback(ctx, src.ID, sn.ID); err != nil {
				t.Fatalf("rollback: %v", err)
			}
		}
		vols := n.req(id).Volumes
		if len(vols) != 1 || vols[0].VolumeID != "vol_x1y2z3" || vols[0].Path != "/data" {
			t.Fatalf("sandbox %s mounts %+v, want vol_x1y2z3 at /data", id, vols)
		}
	}
}
