package storetest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/store"
)

func testTemplates(t *testing.T, s store.Store) {
	ctx := context.Background()
	tpl := &store.Template{ID: "tpl_00000001", PrimaryName: "my-template", Names: []string{"my-template", "my-template:v1"},
		CPUCount: 2, MemoryMB: 512, DiskSizeMB: 2048, BuildStatus: store.BuildWaiting, LatestBuildID: "bld_00000001", BuildCount: 1}
	b := &store.TemplateBuild{ID: "bld_00000001", TemplateID: tpl.ID, Status: store.BuildWaiting, CPUCount: 2, MemoryMB: 512, DiskSizeMB: 2048}
	if err := s.CreateTemplate(ctx, tpl, b); err != nil {
		t.Fatal(err)
	}
	// A name collision fails the whole create.
	other := &store.Template{ID: "tpl_00000002", PrimaryName: "other", Names: []string{"other", "my-template:v1"}, BuildStatus: store.BuildWaiting}
	if err := s.CreateTemplate(ctx, other, &store.TemplateBuild{ID: "bld_00000002", TemplateID: other.ID, Status: store.BuildWaiting}); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("name collision: want ErrConflict, got %v", err)
	}
	if _, err := s.GetTemplate(ctx, other.ID); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("failed create left a row: %v", err)
	}
	got, err := s.TemplateByName(ctx, "", "my-template:v1")
	if err != nil || got.ID != tpl.ID || len(got.Names) != 2 || got.Names[0] != "my-template" {
		t.Fatalf("by name: %+v %v", got, err)
	}
	got.BuildStatus, got.ReadyImage, got.ReadyBuildID, got.RunAs = store.BuildReady, "img@sha256:1", b.ID, "0"
	if err := s.UpdateTemplate(ctx, got); err != nil {
		t.Fatal(err)
	}
	// A rebuild adds a build without touching the ready image.
	b2 := &store.TemplateBuild{ID: "bld_00000003", TemplateID: tpl.ID, Status: store.BuildBuilding, CPUCount: 1, MemoryMB: 256}
	got.LatestBuildID, got.BuildStatus = b2.ID, store.BuildBuilding
	if err := s.AddTemplateBuild(ctx, got, b2, b.ID); err != nil {
		t.Fatal(err)
	}
	if got.BuildCount != 2 {
		t.Fatalf("AddTemplateBuild: BuildCount %d, want the stored 2", got.BuildCount)
	}
	again, _ := s.GetTemplate(ctx, tpl.ID)
	if again.ReadyImage != "img@sha256:1" || again.LatestBuildID != b2.ID || again.BuildStatus != store.BuildBuilding || again.RunAs != "0" || again.BuildCount != 2 {
		t.Fatalf("after rebuild: %+v", again)
	}
	builds, err := s.ListTemplateBuilds(ctx, tpl.ID)
	if err != nil || len(builds) != 2 {
		t.Fatalf("builds: %v %v", builds, err)
	}
	b2.Status, b2.Reason, b2.Step, b2.FinishedAt = store.BuildError, "RUN failed", "2", time.Now()
	b2.Image, b2.ImageDigest = "cubicle/tpl_00000001:bld_00000003", "sha256:"+strings.Repeat("ab", 32)
	if err := s.UpdateTemplateBuild(ctx, b2); err != nil {
		t.Fatal(err)
	}
	// A touch moves a build in progress only.
	b2.Status = store.BuildBuilding
	if err := s.UpdateTemplateBuild(ctx, b2); err != nil {
		t.Fatal(err)
	}
	before, _ := s.GetTemplateBuild(ctx, b2.ID)
	time.Sleep(5 * time.Millisecond)
	if err := s.TouchTemplateBuild(ctx, b2.ID); err != nil {
		t.Fatal(err)
	}
	if after, _ := s.GetTemplateBuild(ctx, b2.ID); !after.UpdatedAt.After(before.UpdatedAt) {
		t.Fatalf("touch of a building build: updated %v, before %v", after.UpdatedAt, before.UpdatedAt)
	}
	if err := s.TouchTemplateBuild(ctx, "bld_missing"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("touch of a missing build: %v", err)
	}
	b2.Status = store.BuildError
	if err := s.UpdateTemplateBuild(ctx, b2); err != nil {
		t.Fatal(err)
	}
	done, _ := s.GetTemplateBuild(ctx, b2.ID)
	time.Sleep(5 * time.Millisecond)
	if err := s.TouchTemplateBuild(ctx, b2.ID); err != nil {
		t.Fatal(err)
	}
	if again, _ := s.GetTemplateBuild(ctx, b2.ID); !again.UpdatedAt.Equal(done.UpdatedAt) {
		t.Fatal("touch moved a finished build")
	}
	if gb, _ := s.GetTemplateBuild(ctx, b2.ID); gb.Status != store.BuildError || gb.Step != "2" || gb.FinishedAt.IsZero() ||
		gb.Image != b2.Image || gb.ImageDigest != b2.ImageDigest {
		t.Fatalf("build update: %+v", gb)
	}
	// A build row created with its image keeps the digest too (the sweep
	// and imports insert whole rows).
	if gb, _ := s.GetTemplateBuild(ctx, b.ID); gb.ImageDigest != "" {
		t.Fatalf("a build recorded without a digest reads %q", gb.ImageDigest)
	}
	for i := 0; i < 3; i++ {
		if err := s.AppendBuildLogs(ctx, b2.ID, []store.BuildLog{{Level: "info", Message: fmt.Sprint("a", i)}, {Level: "warn", Message: fmt.Sprint("b", i), Step: "1"}}); err != nil {
			t.Fatal(err)
		}
	}
	logs, err := s.ListBuildLogs(ctx, b2.ID, 4, 100)
	if err != nil || len(logs) != 2 || logs[0].Seq != 4 || logs[0].Message != "a2" || logs[1].Step != "1" {
		t.Fatalf("logs from offset 4: %+v %v", logs, err)
	}
	if l, _ := s.ListBuildLogs(ctx, b2.ID, 6, 100); len(l) != 0 {
		t.Fatalf("logs past the end: %+v", l)
	}
	if err := s.SetTemplateTag(ctx, tpl.ID, "v1", b.ID); err != nil {
		t.Fatal(err)
	}
	if err := s.SetTemplateTag(ctx, tpl.ID, "v1", b2.ID); err != nil {
		t.Fatal(err)
	}
	tags, _ := s.ListTemplateTags(ctx, tpl.ID)
	if len(tags) != 1 || tags[0].BuildID != b2.ID {
		t.Fatalf("tags: %+v", tags)
	}
	if err := s.DeleteTemplateTag(ctx, tpl.ID, "nope"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("delete missing tag: %v", err)
	}
	if err := s.SetTemplateNames(ctx, tpl.ID, []string{"my-template", "my-template:v2"}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.TemplateByName(ctx, "", "my-template:v1"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("old name still resolves: %v", err)
	}
	if err := s.RecordSpawn(ctx, tpl.ID, time.Now()); err != nil {
		t.Fatal(err)
	}
	if g, _ := s.GetTemplate(ctx, tpl.ID); g.SpawnCount != 1 || g.LastSpawnedAt.IsZero() {
		t.Fatalf("spawn: %+v", g)
	}
	// Paging in creation order.
	for i := 0; i < 5; i++ {
		id := fmt.Sprintf("tpl_1000000%d", i)
		if err := s.CreateTemplate(ctx, &store.Template{ID: id, PrimaryName: id, Names: []string{id}, BuildStatus: store.BuildWaiting},
			&store.TemplateBuild{ID: "bld_" + id, TemplateID: id, Status: store.BuildWaiting}); err != nil {
			t.Fatal(err)
		}
	}
	page1, _ := s.ListTemplates(ctx, "", 3)
	page2, _ := s.ListTemplates(ctx, page1[2].ID, 3)
	if len(page1) != 3 || len(page2) != 3 || page1[0].ID != tpl.ID || page2[0].ID == page1[2].ID {
		t.Fatalf("paging: %d %d", len(page1), len(page2))
	}
	if err := s.DeleteTemplate(ctx, tpl.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := s.TemplateByName(ctx, "", "my-template"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("names survive delete: %v", err)
	}
	if l, _ := s.ListBuildLogs(ctx, b2.ID, 0, 100); len(l) != 0 {
		t.Fatalf("logs survive delete: %d", len(l))
	}
	if err := s.DeleteTemplate(ctx, tpl.ID); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("delete twice: %v", err)
	}
	// Idempotency: the first response wins.
	first, err := s.PutIdempotency(ctx, &store.Idempotency{Key: "k1", BodyHash: "h1", Response: "r1"})
	if err != nil || first.Response != "r1" {
		t.Fatal(err)
	}
	if again, err := s.PutIdempotency(ctx, &store.Idempotency{Key: "k1", BodyHash: "h2", Response: "r2"}); err != nil || again.Response != "r1" || again.BodyHash != "h1" {
		t.Fatalf("replay: %+v %v", again, err)
	}
}

// testTemplateCounters: counters only move by atomic increments, a stale
// whole-row write cannot roll them back, and of two rebuilds from the same
// latest build exactly one is recorded.
func testTemplateCounters(t *testing.T, s store.Store) {
	ctx := context.Background()
	tpl := &store.Template{ID: "tpl_c0000001", PrimaryName: "ctr", Names: []string{"ctr"}, BuildStatus: store.BuildReady, LatestBuildID: "bld_c0", BuildCount: 1}
	if err := s.CreateTemplate(ctx, tpl, &store.TemplateBuild{ID: "bld_c0", TemplateID: tpl.ID, Status: store.BuildReady}); err != nil {
		t.Fatal(err)
	}
	stale, _ := s.GetTemplate(ctx, tpl.ID)
	var wg sync.WaitGroup
	for i := 0; i < 20; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := s.RecordSpawn(ctx, tpl.ID, time.Now()); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	stale.Public = true
	if err := s.UpdateTemplate(ctx, stale); err != nil {
		t.Fatal(err)
	}
	if g, _ := s.GetTemplate(ctx, tpl.ID); g.SpawnCount != 20 || g.LastSpawnedAt.IsZero() || !g.Public {
		t.Fatalf("a stale UpdateTemplate rolled back the spawn counter: %+v", g)
	}

	// Concurrent rebuilds from the same latest build: one wins, the rest
	// get ErrConflict, and BuildCount counts only the winner.
	const n = 8
	errs := make([]error, n)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			row, err := s.GetTemplate(ctx, tpl.ID)
			if err != nil {
				errs[i] = err
				return
			}
			b := &store.TemplateBuild{ID: fmt.Sprintf("bld_c%d", i+1), TemplateID: tpl.ID, Status: store.BuildWaiting}
			row.LatestBuildID, row.BuildStatus = b.ID, store.BuildWaiting
			errs[i] = s.AddTemplateBuild(ctx, row, b, "bld_c0")
		}(i)
	}
	wg.Wait()
	won := 0
	for _, err := range errs {
		switch {
		case err == nil:
			won++
		case !errors.Is(err, store.ErrConflict):
			t.Fatalf("losing rebuild: %v, want ErrConflict", err)
		}
	}
	g, _ := s.GetTemplate(ctx, tpl.ID)
	if won != 1 || g.BuildCount != 2 || g.SpawnCount != 20 {
		t.Fatalf("%d rebuilds won; template %+v", won, g)
	}
	if builds, _ := s.ListTemplateBuilds(ctx, tpl.ID); len(builds) != 2 {
		t.Fatalf("%d builds recorded, want 2", len(builds))
	}

	// RecordTemplateBuild mirrors the latest build's status and, when
	// ready, its image; it leaves settings and counters alone.
	lb, err := s.GetTemplateBuild(ctx, g.LatestBuildID)
	if err != nil {
		t.Fatal(err)
	}
	lb.Status, lb.Rootfs, lb.FinishedAt = store.BuildReady, "/r", time.Now()
	lb.Image, lb.ImageDigest = "cubicle/x:y", "sha256:"+strings.Repeat("cd", 32)
	if err := s.RecordTemplateBuild(ctx, lb, &store.TemplateReady{Image: "img@x", RunAs: "0", CPUCount: 3, MemoryMB: 256}); err != nil {
		t.Fatal(err)
	}
	if gb, _ := s.GetTemplateBuild(ctx, lb.ID); gb.Image != lb.Image || gb.ImageDigest != lb.ImageDigest {
		t.Fatalf("RecordTemplateBuild lost the image: %+v", gb)
	}
	g2, _ := s.GetTemplate(ctx, tpl.ID)
	if g2.BuildStatus != store.BuildReady || g2.ReadyBuildID != lb.ID || g2.ReadyImage != "img@x" || g2.CPUCount != 3 || !g2.Public || g2.BuildCount != 2 || g2.SpawnCount != 20 {
		t.Fatalf("after RecordTemplateBuild: %+v", g2)
	}
	old, _ := s.GetTemplateBuild(ctx, "bld_c0")
	old.Status = store.BuildError
	if err := s.RecordTemplateBuild(ctx, old, nil); err != nil {
		t.Fatal(err)
	}
	if g3, _ := s.GetTemplate(ctx, tpl.ID); g3.BuildStatus != store.BuildReady {
		t.Fatalf("an older build's status reached the template: %s", g3.BuildStatus)
	}
	if err := s.RecordTemplateBuild(ctx, &store.TemplateBuild{ID: "bld_nope", TemplateID: tpl.ID}, nil); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("unknown build: %v", err)
	}

	// A rebuild supersedes an unstarted latest build in its transaction,
	// which StartTemplateBuild then refuses; a started (queued) or running
	// latest build refuses the rebuild.
	cur, _ := s.GetTemplate(ctx, tpl.ID)
	w := &store.TemplateBuild{ID: "bld_w1", TemplateID: tpl.ID, Status: store.BuildWaiting}
	cur.LatestBuildID = w.ID
	if err := s.AddTemplateBuild(ctx, cur, w, lb.ID); err != nil {
		t.Fatal(err)
	}
	w2 := &store.TemplateBuild{ID: "bld_w2", TemplateID: tpl.ID, Status: store.BuildWaiting}
	cur.LatestBuildID = w2.ID
	if err := s.AddTemplateBuild(ctx, cur, w2, w.ID); err != nil {
		t.Fatal(err)
	}
	if gw, _ := s.GetTemplateBuild(ctx, w.ID); gw.Status != store.BuildError || gw.Reason != "superseded by build "+w2.ID {
		t.Fatalf("unstarted build not superseded: %+v", gw)
	}
	if err := s.StartTemplateBuild(ctx, w.ID, `{}`); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("start of a superseded build: %v", err)
	}
	if err := s.StartTemplateBuild(ctx, w2.ID, `{"fromTemplate":"base"}`); err != nil {
		t.Fatal(err)
	}
	if err := s.StartTemplateBuild(ctx, w2.ID, `{}`); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("second start: %v", err)
	}
	w3 := &store.TemplateBuild{ID: "bld_w3", TemplateID: tpl.ID, Status: store.BuildWaiting}
	cur.LatestBuildID = w3.ID
	if err := s.AddTemplateBuild(ctx, cur, w3, w2.ID); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("rebuild over a queued build: %v", err)
	}
	if gw, _ := s.GetTemplateBuild(ctx, w2.ID); gw.Status != store.BuildWaiting || gw.Spec == "" {
		t.Fatalf("queued build touched by a refused rebuild: %+v", gw)
	}
}

// testIdempotencyGC: keys older than the cutoff go, newer ones stay.
func testIdempotencyGC(t *testing.T, s store.Store) {
	ctx := context.Background()
	now := time.Now().UTC()
	for _, k := range []*store.Idempotency{{Key: "old", BodyHash: "h", CreatedAt: now.Add(-48 * time.Hour)}, {Key: "new", BodyHash: "h", CreatedAt: now}} {
		if _, err := s.PutIdempotency(ctx, k); err != nil {
			t.Fatal(err)
		}
	}
	n, err := s.DeleteIdempotencyBefore(ctx, now.Add(-24*time.Hour))
	if err != nil || n != 1 {
		t.Fatalf("deleted %d, %v", n, err)
	}
	// The old key is free again; the new one still replays.
	if got, _ := s.PutIdempotency(ctx, &store.Idempotency{Key: "old", BodyHash: "h2"}); got.BodyHash != "h2" {
		t.Fatalf("old key survived: %+v", got)
	}
	if got, _ := s.PutIdempotency(ctx, &store.Idempotency{Key: "new", BodyHash: "h2"}); got.BodyHash != "h" {
		t.Fatalf("new key was collected: %+v", got)
	}
}

// testTemplateAlias: an alias moves between templates of one team in one
// transaction, with its tagged forms, and never across teams.
func testTemplateAlias(t *testing.T, s store.Store) {
	ctx := context.Background()
	mk := func(id, team, name string, at time.Duration) {
		t.Helper()
		var names []string
		if name != "" {
			names = []string{name, name + ":v1"}
		}
		tpl := &store.Template{ID: id, TeamID: team, PrimaryName: name, Names: names, BuildStatus: store.BuildWaiting, LatestBuildID: "bld_" + id}
		if err := s.CreateTemplate(ctx, tpl, &store.TemplateBuild{ID: "bld_" + id, TemplateID: id, Status: store.BuildWaiting}); err != nil {
			t.Fatal(err)
		}
		if name != "" {
			if err := s.SetTemplateTag(ctx, id, "v1", "bld_"+id); err != nil {
				t.Fatal(err)
			}
		}
		time.Sleep(at)
	}
	names := func(id string) []string {
		t.Helper()
		got, err := s.GetTemplate(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		return got.Names
	}
	mk("tpl-a", store.DefaultTeamID, "web", 5*time.Millisecond)
	mk("tpl-b", store.DefaultTeamID, "", 5*time.Millisecond)
	mk("tpl-other", "t_other", "web", 5*time.Millisecond)
	mk("tpl-c", store.DefaultTeamID, "", 0)
	if n := names("tpl-b"); len(n) != 0 {
		t.Fatalf("an unnamed template has names %q", n)
	}
	// b takes "web" from a, with a's tagged form; b's own tag follows.
	if err := s.SetTemplateTag(ctx, "tpl-b", "v2", "bld_tpl-b"); err != nil {
		t.Fatal(err)
	}
	if took, err := s.SetTemplateAlias(ctx, "tpl-b", "web", true); err != nil || !took {
		t.Fatalf("claim from an older template: %v %v", took, err)
	}
	if n := names("tpl-a"); len(n) != 0 {
		t.Fatalf("the old holder kept %q", n)
	}
	if a, _ := s.GetTemplate(ctx, "tpl-a"); a.PrimaryName != "" {
		t.Fatalf("the old holder's primary name stayed %q", a.PrimaryName)
	}
	if n := names("tpl-b"); fmt.Sprint(n) != "[web web:v2]" {
		t.Fatalf("new holder's names %q", n)
	}
	if got, err := s.TemplateByName(ctx, store.DefaultTeamID, "web"); err != nil || got.ID != "tpl-b" {
		t.Fatalf("web resolves to %+v %v", got, err)
	}
	// Another team's holder of the same name is untouched.
	if got, err := s.TemplateByName(ctx, "t_other", "web:v1"); err != nil || got.ID != "tpl-other" {
		t.Fatalf("other team's web:v1: %+v %v", got, err)
	}
	// newerOnly: the older a does not take it back from b.
	if took, err := s.SetTemplateAlias(ctx, "tpl-a", "web", true); err != nil || took {
		t.Fatalf("an older template took the alias from a newer one: %v %v", took, err)
	}
	// Without newerOnly it does (an explicit set), and c moves on a
	// free alias; then clearing leaves c without names.
	if took, err := s.SetTemplateAlias(ctx, "tpl-a", "web", false); err != nil || !took {
		t.Fatalf("explicit set: %v %v", took, err)
	}
	if n := names("tpl-b"); len(n) != 0 {
		t.Fatalf("b kept %q", n)
	}
	if took, err := s.SetTemplateAlias(ctx, "tpl-c", "api_x", true); err != nil || !took {
		t.Fatalf("free alias: %v %v", took, err)
	}
	if took, err := s.SetTemplateAlias(ctx, "tpl-c", "", false); err != nil || !took {
		t.Fatalf("clear: %v %v", took, err)
	}
	if n := names("tpl-c"); len(n) != 0 {
		t.Fatalf("cleared template has names %q", n)
	}
	if _, err := s.TemplateByName(ctx, store.DefaultTeamID, "api_x"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("a cleared alias still resolves: %v", err)
	}
	if _, err := s.SetTemplateAlias(ctx, "tpl-missing", "x", false); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("unknown template: %v", err)
	}
}
