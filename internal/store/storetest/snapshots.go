package storetest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/store"
)

func snapshotRows(id, team, sandbox, name string, internal bool) (*store.Snapshot, *store.Template, *store.TemplateBuild) {
	bid := "bld_" + id
	sn := &store.Snapshot{ID: id, TeamID: team, SandboxID: sandbox, SourceTemplateID: "base", Node: "local", Kind: "filesystem",
		Runtime: "runc", Layers: []string{"/snap/" + id + "/rootfs", "/images/base/rootfs"}, SizeBytes: 42,
		Volumes: []store.VolumeMount{{VolumeID: "v1", Path: "/mnt/v", ReadOnly: true}}, EnvVars: map[string]string{"K": "v"},
		DefaultUser: "user", AgentToken: "tok", Internal: internal,
		Image: "cubicle/tpl@sha256:" + strings.Repeat("ab", 32), SnapshotLayers: []string{id, "snap_parent"},
		Package: []store.SnapshotObject{{Part: "rootfs", Digest: "sha256:" + strings.Repeat("cd", 32), Size: 1234}}}
	t := &store.Template{ID: id, TeamID: team, PrimaryName: name, Names: []string{name}, BuildStatus: store.BuildReady,
		ReadyBuildID: bid, LatestBuildID: bid, BuildCount: 1}
	b := &store.TemplateBuild{ID: bid, TemplateID: id, Status: store.BuildReady, Rootfs: "/snap/" + id + "/rootfs:/images/base/rootfs"}
	return sn, t, b
}

func testSnapshots(t *testing.T, s store.Store) {
	ctx := context.Background()
	mustTeam(t, s, "t1", store.Quota{})
	mustTeam(t, s, "t2", store.Quota{})
	sn, tpl, b := snapshotRows("snap_1", "t1", "sb1", "named", false)
	if err := s.CreateSnapshot(ctx, sn, tpl, b, 0); err != nil {
		t.Fatal(err)
	}
	got, err := s.GetSnapshot(ctx, "snap_1")
	if err != nil || got.Kind != "filesystem" || len(got.Layers) != 2 || got.Layers[0] != "/snap/snap_1/rootfs" || got.SizeBytes != 42 ||
		got.Volumes[0].Path != "/mnt/v" || !got.Volumes[0].ReadOnly || got.EnvVars["K"] != "v" || got.AgentToken != "tok" ||
		got.CreatedAt.IsZero() || !got.DeletedAt.IsZero() {
		t.Fatalf("round trip: %+v %v", got, err)
	}
	// The chain by reference, for nodes that do not share the files.
	if got.Image != sn.Image || fmt.Sprint(got.SnapshotLayers) != "[snap_1 snap_parent]" {
		t.Fatalf("references: image %q snapshot layers %v", got.Image, got.SnapshotLayers)
	}
	if len(got.Package) != 1 || got.Package[0] != sn.Package[0] {
		t.Fatalf("package: %+v", got.Package)
	}
	if l, err := s.ListSnapshots(ctx, store.SnapshotFilter{TeamID: "t1"}); err != nil || len(l) != 1 || l[0].Image != sn.Image || len(l[0].SnapshotLayers) != 2 {
		t.Fatalf("listed references: %+v %v", l, err)
	}
	// It is also a template with a ready build, found by name in its team only.
	if tt, err := s.TemplateByName(ctx, "t1", "named"); err != nil || tt.ID != "snap_1" || tt.ReadyBuildID != "bld_snap_1" {
		t.Fatalf("template by name: %+v %v", tt, err)
	}
	if _, err := s.TemplateByName(ctx, "t2", "named"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("other team sees the name: %v", err)
	}
	if bb, err := s.GetTemplateBuild(ctx, "bld_snap_1"); err != nil || bb.Status != store.BuildReady || bb.Rootfs == "" {
		t.Fatalf("build: %+v %v", bb, err)
	}
	// A taken name fails the whole create: no template, build or snapshot row.
	dup, dt, db := snapshotRows("snap_2", "t1", "sb1", "named", false)
	if err := s.CreateSnapshot(ctx, dup, dt, db, 0); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("name collision: %v", err)
	}
	if _, err := s.GetSnapshot(ctx, "snap_2"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("failed create left a snapshot row: %v", err)
	}
	if _, err := s.GetTemplate(ctx, "snap_2"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("failed create left a template row: %v", err)
	}
	// More rows for listing: newest first, per team and sandbox, paged.
	for i := 3; i <= 6; i++ {
		time.Sleep(2 * time.Millisecond) // distinct creation times
		id := fmt.Sprintf("snap_%d", i)
		sn, tpl, b := snapshotRows(id, "t1", "sb2", id, false)
		if err := s.CreateSnapshot(ctx, sn, tpl, b, 0); err != nil {
			t.Fatal(err)
		}
	}
	in, it, ib := snapshotRows("snap_7", "t1", "sb2", "snap_7", true)
	if err := s.CreateSnapshot(ctx, in, it, ib, 0); err != nil {
		t.Fatal(err)
	}
	other, ot, ob := snapshotRows("snap_8", "t2", "sb9", "snap_8", false)
	if err := s.CreateSnapshot(ctx, other, ot, ob, 0); err != nil {
		t.Fatal(err)
	}
	// The team limit counts live snapshots only (t1 has 5, an internal
	// one aside), and fails the whole insert.
	q, qt, qb := snapshotRows("snap_9", "t1", "sb2", "snap_9", false)
	var qe *store.QuotaError
	if err := s.CreateSnapshot(ctx, q, qt, qb, 5); !errors.As(err, &qe) || !errors.Is(err, store.ErrQuota) || qe.Limit != 5 {
		t.Fatalf("at the limit: %v", err)
	}
	if _, err := s.GetTemplate(ctx, "snap_9"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("refused snapshot left a template row: %v", err)
	}
	iq, iqt, iqb := snapshotRows("snap_10", "t1", "sb2", "snap_10", true)
	if err := s.CreateSnapshot(ctx, iq, iqt, iqb, 5); err != nil {
		t.Fatalf("internal snapshots are not limited: %v", err)
	}
	ids := func(rows []*store.Snapshot) (out []string) {
		for _, r := range rows {
			out = append(out, r.ID)
		}
		return out
	}
	rows, err := s.ListSnapshots(ctx, store.SnapshotFilter{TeamID: "t1", SandboxID: "sb2", Limit: 2})
	if err != nil || fmt.Sprint(ids(rows)) != "[snap_6 snap_5]" {
		t.Fatalf("page 1 = %v, %v", ids(rows), err)
	}
	last := rows[len(rows)-1]
	rows, err = s.ListSnapshots(ctx, store.SnapshotFilter{TeamID: "t1", SandboxID: "sb2", Limit: 2, AfterCreated: last.CreatedAt, AfterID: last.ID})
	if err != nil || fmt.Sprint(ids(rows)) != "[snap_4 snap_3]" {
		t.Fatalf("page 2 = %v, %v", ids(rows), err)
	}
	// Internal snapshots are born deleted: never listed, but kept as rows.
	if got, _ := s.GetSnapshot(ctx, "snap_7"); got == nil || got.DeletedAt.IsZero() {
		t.Fatalf("internal snapshot row: %+v", got)
	}
	rows, _ = s.ListSnapshots(ctx, store.SnapshotFilter{TeamID: "t1"})
	if len(rows) != 5 {
		t.Fatalf("t1 lists %v", ids(rows))
	}
	rows, _ = s.ListSnapshots(ctx, store.SnapshotFilter{IncludeDeleted: true})
	if len(rows) != 8 {
		t.Fatalf("all rows %v", ids(rows))
	}
	// Deleting the template deletes the snapshot (a tombstone), which may
	// then be purged; a live one may not.
	if err := s.PurgeSnapshot(ctx, "snap_1"); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("purge of a live snapshot: %v", err)
	}
	if err := s.DeleteTemplate(ctx, "snap_1"); err != nil {
		t.Fatal(err)
	}
	if got, err := s.GetSnapshot(ctx, "snap_1"); err != nil || got.DeletedAt.IsZero() {
		t.Fatalf("after template delete: %+v %v", got, err)
	}
	if _, err := s.TemplateByName(ctx, "t1", "named"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("name still taken after delete: %v", err)
	}
	if err := s.PurgeSnapshot(ctx, "snap_1"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.GetSnapshot(ctx, "snap_1"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("purged row: %v", err)
	}
	if err := s.PurgeSnapshot(ctx, "snap_1"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("second purge: %v", err)
	}

	// Sandboxes keep the layers they run on and their pause kind.
	sb := sample("llllllllllllllllllll", time.Now())
	sb.Layers, sb.PauseMemory = []string{"/a", "/b"}, true
	if err := s.CreateSandbox(ctx, sb); err != nil {
		t.Fatal(err)
	}
	g, err := s.GetSandbox(ctx, sb.ID)
	if err != nil || fmt.Sprint(g.Layers) != "[/a /b]" || !g.PauseMemory {
		t.Fatalf("sandbox layers: %+v %v", g, err)
	}
	g.PauseMemory, g.Layers = false, []string{"/c"}
	if err := s.UpdateSandbox(ctx, g); err != nil {
		t.Fatal(err)
	}
	if g, _ = s.GetSandbox(ctx, sb.ID); g.PauseMemory || fmt.Sprint(g.Layers) != "[/c]" {
		t.Fatalf("sandbox update: %+v", g)
	}
	// ... and the same by reference: none until set, then kept through
	// create, update and list.
	if g.Image != "" || g.SnapshotLayers != nil {
		t.Fatalf("references on a row without them: %q %v", g.Image, g.SnapshotLayers)
	}
	g.Image, g.SnapshotLayers = "base", []string{"snap_b", "snap_a"}
	if err := s.UpdateSandbox(ctx, g); err != nil {
		t.Fatal(err)
	}
	if g, _ = s.GetSandbox(ctx, sb.ID); g.Image != "base" || fmt.Sprint(g.SnapshotLayers) != "[snap_b snap_a]" {
		t.Fatalf("sandbox references after update: %q %v", g.Image, g.SnapshotLayers)
	}
	// The current pause's package: none until set, kept through update,
	// gone when cleared.
	if g.PausePackage != nil {
		t.Fatalf("pause package on a new row: %+v", g.PausePackage)
	}
	g.PausePackage = &store.PausePackage{SnapshotID: "snap_p", FilesOnly: true}
	if err := s.UpdateSandbox(ctx, g); err != nil {
		t.Fatal(err)
	}
	if g, _ = s.GetSandbox(ctx, sb.ID); g.PausePackage == nil || *g.PausePackage != (store.PausePackage{SnapshotID: "snap_p", FilesOnly: true}) {
		t.Fatalf("pause package after update: %+v", g.PausePackage)
	}
	g.PausePackage = nil
	if err := s.UpdateSandbox(ctx, g); err != nil {
		t.Fatal(err)
	}
	if g, _ = s.GetSandbox(ctx, sb.ID); g.PausePackage != nil {
		t.Fatalf("pause package after clearing: %+v", g.PausePackage)
	}
	sb2 := sample("rrrrrrrrrrrrrrrrrrrr", time.Now())
	sb2.PausePackage = &store.PausePackage{SnapshotID: "snap_q"}
	sb2.Image, sb2.SnapshotLayers = "cubicle/x@sha256:"+strings.Repeat("cd", 32), []string{"snap_c"}
	if err := s.CreateSandbox(ctx, sb2); err != nil {
		t.Fatal(err)
	}
	all, err := s.ListSandboxes(ctx, store.SandboxFilter{})
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, r := range all {
		if r.ID == sb2.ID {
			found = r.Image == sb2.Image && fmt.Sprint(r.SnapshotLayers) == "[snap_c]" && r.PausePackage != nil && r.PausePackage.SnapshotID == "snap_q"
		}
	}
	if !found {
		t.Fatalf("listed sandbox lost its references: %+v", all)
	}
}
