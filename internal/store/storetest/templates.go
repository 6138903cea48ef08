package storetest

import (
	"context"
	"errors"
	"fmt"
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
	got.LatestBuildID, got.BuildStatus, got.BuildCount = b2.ID, store.BuildBuilding, 2
	if err := s.AddTemplateBuild(ctx, got, b2); err != nil {
		t.Fatal(err)
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
	if err := s.UpdateTemplateBuild(ctx, b2); err != nil {
		t.Fatal(err)
	}
	if gb, _ := s.GetTemplateBuild(ctx, b2.ID); gb.Status != store.BuildError || gb.Step != "2" || gb.FinishedAt.IsZero() {
		t.Fatalf("build update: %+v", gb)
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
