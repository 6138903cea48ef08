package integration

import (
	"context"
	"errors"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/cubicle-dev/cubicle/internal/store"
	"github.com/cubicle-dev/cubicle/internal/store/postgres"
	"github.com/cubicle-dev/cubicle/internal/store/postgres/pgtest"
)

// cubicle serve --store postgres://...: sandboxes created, listed and
// killed through the API are rows in PostgreSQL (no SQLite file is made),
// and a restarted serve sees the same rows.
func TestServePostgresStore(t *testing.T) {
	ctx := context.Background()
	dsn, err := pgtest.StartT(t).NewDatabase(ctx)
	if err != nil {
		t.Fatal(err)
	}
	s := startServer(t, "--store", dsn)
	keep := s.create(map[string]any{"templateID": "base"})
	gone := s.create(map[string]any{"templateID": "base"})
	listed := func() map[string]bool {
		var list []map[string]any
		if st := s.do("GET", "/v2/sandboxes", nil, &list); st != http.StatusOK {
			t.Fatalf("list: %d", st)
		}
		ids := map[string]bool{}
		for _, sb := range list {
			ids[sb["sandboxID"].(string)] = true
		}
		return ids
	}
	if ids := listed(); !ids[keep.SandboxID] || !ids[gone.SandboxID] {
		t.Fatalf("list before kill: %v", ids)
	}
	if st := s.do("DELETE", "/sandboxes/"+gone.SandboxID, nil, nil); st != http.StatusNoContent {
		t.Fatalf("kill: %d", st)
	}
	if ids := listed(); !ids[keep.SandboxID] || ids[gone.SandboxID] {
		t.Fatalf("list after kill: %v", ids)
	}
	s.mustRun(keep, "echo kept > /tmp/state")

	s.stop(syscall.SIGTERM)
	s.start()
	if out := s.mustRun(keep, "cat /tmp/state"); out != "kept\n" {
		t.Fatalf("sandbox after restart: %q", out)
	}
	if st := s.do("GET", "/sandboxes/"+gone.SandboxID, nil, nil); st != http.StatusNotFound {
		t.Fatalf("killed sandbox after restart: want 404, got %d", st)
	}
	if ids := listed(); !ids[keep.SandboxID] || ids[gone.SandboxID] {
		t.Fatalf("list after restart: %v", ids)
	}

	// The rows are PostgreSQL's, and serve never made a SQLite database.
	st, err := postgres.Open(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	for id, want := range map[string]store.SandboxState{keep.SandboxID: store.StateRunning, gone.SandboxID: store.StateKilled} {
		if sb, err := st.GetSandbox(ctx, id); err != nil || sb.State != want {
			t.Fatalf("row %s: %+v %v; want %s", id, sb, err, want)
		}
	}
	// serve registered its in-process node in the same database.
	if n, err := st.GetNode(ctx, "local"); err != nil || n.Runtime == "" || n.Capacity.MilliCPU == 0 {
		t.Fatalf("node row in PostgreSQL: %+v %v", n, err)
	}
	if _, err := os.Stat(filepath.Join(s.DataDir, "cubicle.db")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("serve --store postgres made a SQLite database: %v", err)
	}
}
