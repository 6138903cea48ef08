package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/store"
	"github.com/cubicle-dev/cubicle/internal/store/storetest"
)

func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) store.Store {
		s, err := Open(filepath.Join(t.TempDir(), "c.db"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	})
}

// State must survive closing and reopening the file (a serve restart).
func TestReopenKeepsState(t *testing.T) {
	path := filepath.Join(t.TempDir(), "r.db")
	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	sb := &store.Sandbox{ID: "reopenreopenreopen00", TemplateID: "base", State: store.StatePaused, StartedAt: time.Now(), EndAt: time.Now()}
	if err := s.CreateSandbox(context.Background(), sb); err != nil {
		t.Fatal(err)
	}
	s.Close()
	s2, err := Open(path) // migrations must be idempotent
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	got, err := s2.GetSandbox(context.Background(), sb.ID)
	if err != nil || got.State != store.StatePaused {
		t.Fatalf("after reopen: %+v %v", got, err)
	}
}

// An install from before tenancy: every object moves into the default
// team, its keys stay admins, and names stay resolvable there.
func TestMigrateIntoDefaultTeam(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "old.db")
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=foreign_keys(1)")
	if err != nil {
		t.Fatal(err)
	}
	exec := func(q string, args ...any) {
		t.Helper()
		if _, err := db.ExecContext(ctx, q, args...); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	exec(`CREATE TABLE schema_migrations (name TEXT PRIMARY KEY, applied_at INTEGER NOT NULL)`)
	for _, name := range []string{"0001_init.sql", "0002_volumes.sql", "0003_templates.sql", "0004_accelerators.sql"} {
		body, err := migrations.ReadFile("migrations/" + name)
		if err != nil {
			t.Fatal(err)
		}
		exec(string(body))
		exec(`INSERT INTO schema_migrations VALUES (?, 0)`, "migrations/"+name)
	}
	exec(`INSERT INTO api_keys(id, name, hash, prefix, created_at) VALUES ('key_old', 'dev', 'hold', 'e2b_', 1)`)
	exec(`INSERT INTO sandboxes(id, template_id, state, cpu_count, memory_mb, disk_size_mb, started_at, end_at, updated_at) VALUES ('oldsandbox0000000000', 'base', 'running', 1, 256, 512, 1, 2, 1)`)
	exec(`INSERT INTO volumes(id, name, driver, state, created_at, updated_at) VALUES ('data', 'data', 'local', 'ready', 1, 1)`)
	exec(`INSERT INTO volume_attachments(volume_id, sandbox_id, node, path, created_at) VALUES ('data', 'oldsandbox0000000000', 'local', '/data', 1)`)
	exec(`INSERT INTO templates(id, primary_name, public, cpu_count, memory_mb, disk_size_mb, build_status, created_at, updated_at) VALUES ('tpl_old', 'app', 0, 1, 256, 512, 'ready', 1, 1)`)
	exec(`INSERT INTO template_names(name, template_id) VALUES ('app', 'tpl_old'), ('app:v1', 'tpl_old')`)
	exec(`INSERT INTO template_builds(id, template_id, status, cpu_count, memory_mb, disk_size_mb, created_at, updated_at) VALUES ('bld_old', 'tpl_old', 'ready', 1, 256, 512, 1, 1)`)
	exec(`INSERT INTO template_tags(template_id, tag, build_id, created_at) VALUES ('tpl_old', 'v1', 'bld_old', 1)`)
	db.Close()

	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	k, err := s.APIKeyByHash(ctx, "hold")
	if err != nil || k.TeamID != store.DefaultTeamID || !k.Admin {
		t.Fatalf("key: %+v %v", k, err)
	}
	sb, err := s.GetSandbox(ctx, "oldsandbox0000000000")
	if err != nil || sb.TeamID != store.DefaultTeamID {
		t.Fatalf("sandbox: %+v %v", sb, err)
	}
	v, err := s.VolumeByName(ctx, store.DefaultTeamID, "data")
	if err != nil || v.ID != "data" {
		t.Fatalf("volume: %+v %v", v, err)
	}
	if atts, err := s.ListVolumeAttachments(ctx, "data", ""); err != nil || len(atts) != 1 {
		t.Fatalf("attachments: %+v %v", atts, err)
	}
	tpl, err := s.TemplateByName(ctx, store.DefaultTeamID, "app:v1")
	if err != nil || tpl.ID != "tpl_old" || tpl.TeamID != store.DefaultTeamID {
		t.Fatalf("template: %+v %v", tpl, err)
	}
	if bs, err := s.ListTemplateBuilds(ctx, "tpl_old"); err != nil || len(bs) != 1 {
		t.Fatalf("builds: %+v %v", bs, err)
	}
	if tags, err := s.ListTemplateTags(ctx, "tpl_old"); err != nil || len(tags) != 1 {
		t.Fatalf("tags: %+v %v", tags, err)
	}
	// The rebuilt tables keep their foreign keys: deleting the template
	// still cascades to names, builds and tags.
	if err := s.DeleteTemplate(ctx, "tpl_old"); err != nil {
		t.Fatal(err)
	}
	if bs, _ := s.ListTemplateBuilds(ctx, "tpl_old"); len(bs) != 0 {
		t.Fatalf("builds survived the template: %+v", bs)
	}
	if _, err := s.TemplateByName(ctx, store.DefaultTeamID, "app"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("names survived the template: %v", err)
	}
	// And foreign keys are on again for normal work.
	if err := s.CreateSandbox(ctx, &store.Sandbox{ID: "newsandbox0000000000", TeamID: store.DefaultTeamID, State: store.StateRunning,
		Volumes: []store.VolumeMount{{VolumeID: "data", Path: "/d"}}, StartedAt: time.Now(), EndAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
}
