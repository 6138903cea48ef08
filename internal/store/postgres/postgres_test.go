package postgres

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/store"
	"github.com/cubicle-dev/cubicle/internal/store/postgres/pgtest"
	"github.com/cubicle-dev/cubicle/internal/store/storetest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

func open(t *testing.T, dsn string) *Store {
	t.Helper()
	s, err := Open(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) store.Store { return open(t, pgtest.DSN(t)) })
}

// Two control-plane replicas open one database at once: the advisory
// lock lets one migrate while the other waits, and neither fails.
func TestConcurrentOpenMigratesOnce(t *testing.T) {
	dsn := pgtest.DSN(t)
	errs := make(chan error, 4)
	stores := make(chan *Store, 4)
	for range 4 {
		go func() {
			s, err := Open(context.Background(), dsn)
			errs <- err
			stores <- s
		}()
	}
	for range 4 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
		if s := <-stores; s != nil {
			s.Close()
		}
	}
	s := open(t, dsn)
	var n int
	if err := s.db.QueryRowContext(context.Background(), `SELECT COUNT(*) FROM schema_migrations`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	// One row per embedded migration: none ran twice.
	files, err := fs.Glob(migrations, "migrations/*.sql")
	if err != nil {
		t.Fatal(err)
	}
	if n != len(files) {
		t.Fatalf("schema_migrations has %d rows, want %d", n, len(files))
	}
}

// State survives a restart: a new Store on the same database sees it.
func TestReopenKeepsState(t *testing.T) {
	ctx := context.Background()
	dsn := pgtest.DSN(t)
	s, err := Open(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	sb := &store.Sandbox{ID: "reopenreopenreopen00", TemplateID: "base", State: store.StatePaused, StartedAt: time.Now(), EndAt: time.Now(),
		Metadata: map[string]string{"k": "v"}}
	if err := s.CreateSandbox(ctx, sb); err != nil {
		t.Fatal(err)
	}
	s.Close()
	got, err := open(t, dsn).GetSandbox(ctx, sb.ID)
	if err != nil || got.State != store.StatePaused || got.Metadata["k"] != "v" {
		t.Fatalf("after reopen: %+v %v", got, err)
	}
}

// Two replicas (separate pools) race creates against one team quota: the
// serializable check-and-insert holds across them.
func TestQuotaAcrossReplicas(t *testing.T) {
	ctx := context.Background()
	dsn := pgtest.DSN(t)
	a, b := open(t, dsn), open(t, dsn)
	if err := a.CreateTeam(ctx, &store.Team{ID: "t_x", Name: "x", Quota: store.Quota{MaxSandboxes: 2}}); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var ok, quota atomic.Int32
	for i := range 12 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s := a
			if i%2 == 1 {
				s = b
			}
			err := s.CreateSandbox(ctx, &store.Sandbox{ID: fmt.Sprintf("repl%016d", i), TeamID: "t_x", TemplateID: "base",
				State: store.StateRunning, CPUCount: 1, MemoryMB: 128, StartedAt: time.Now(), EndAt: time.Now()})
			switch {
			case err == nil:
				ok.Add(1)
			case errors.Is(err, store.ErrQuota):
				quota.Add(1)
			default:
				t.Errorf("create: %v", err)
			}
		}()
	}
	wg.Wait()
	if ok.Load() != 2 || quota.Load() != 10 {
		t.Fatalf("want 2 creates and 10 quota errors, got %d and %d", ok.Load(), quota.Load())
	}
}

// A DSN pgx cannot parse is ErrDSN; one that names no reachable server
// fails at Open, not at the first query.
func TestOpenErrors(t *testing.T) {
	ctx := context.Background()
	if _, err := Open(ctx, "postgres://u:secret@[::1"); !errors.Is(err, ErrDSN) {
		t.Fatalf("bad DSN: want ErrDSN, got %v", err)
	} else if strings.Contains(err.Error(), "secret") {
		t.Fatalf("error shows the password: %v", err)
	}
	ctx2, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := Open(ctx2, "postgres://cubicle@127.0.0.1:1/none?sslmode=disable&connect_timeout=2"); err == nil {
		t.Fatal("Open of an unreachable server succeeded")
	}
}
