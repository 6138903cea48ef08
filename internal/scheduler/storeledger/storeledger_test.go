package storeledger_test

import (
	"context"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/cubicle-dev/cubicle/internal/scheduler"
	"github.com/cubicle-dev/cubicle/internal/scheduler/ledgertest"
	"github.com/cubicle-dev/cubicle/internal/scheduler/storeledger"
	"github.com/cubicle-dev/cubicle/internal/store/postgres"
	"github.com/cubicle-dev/cubicle/internal/store/postgres/pgtest"
	"github.com/cubicle-dev/cubicle/internal/store/sqlite"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

func TestSQLiteLedger(t *testing.T) {
	ledgertest.Run(t, func(t *testing.T) scheduler.Ledger {
		s, err := sqlite.Open(filepath.Join(t.TempDir(), "cubicle.db"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return storeledger.New(s)
	})
}

func TestPostgresLedger(t *testing.T) {
	ledgertest.Run(t, func(t *testing.T) scheduler.Ledger {
		s, err := postgres.Open(context.Background(), pgtest.DSN(t))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return storeledger.New(s)
	})
}

// replicas is one Ledger made of several control-plane replicas (each its
// own store and connection pool over one database): calls rotate between
// them, so the suite's 50-way race is fought across replicas.
type replicas struct {
	mu sync.Mutex
	n  int
	ls []scheduler.Ledger
}

func (r *replicas) next() scheduler.Ledger {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.n++
	return r.ls[r.n%len(r.ls)]
}

func (r *replicas) SetNode(ctx context.Context, id string, a scheduler.Resources) error {
	return r.next().SetNode(ctx, id, a)
}
func (r *replicas) Reserve(ctx context.Context, sb, id string, res scheduler.Resources) error {
	return r.next().Reserve(ctx, sb, id, res)
}
func (r *replicas) Release(ctx context.Context, sb string) error { return r.next().Release(ctx, sb) }
func (r *replicas) Committed(ctx context.Context) (map[string]scheduler.Resources, error) {
	return r.next().Committed(ctx)
}

func TestPostgresLedgerAcrossReplicas(t *testing.T) {
	ledgertest.Run(t, func(t *testing.T) scheduler.Ledger {
		dsn := pgtest.DSN(t)
		r := &replicas{}
		for range 3 {
			s, err := postgres.Open(context.Background(), dsn)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s.Close() })
			r.ls = append(r.ls, storeledger.New(s))
		}
		return r
	})
}
