package lease_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/lease"
	"github.com/cubicle-dev/cubicle/internal/lease/leasetest"
	"github.com/cubicle-dev/cubicle/internal/store/postgres/pgtest"
	"github.com/jackc/pgx/v5"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

func TestLocal(t *testing.T) {
	leasetest.Run(t, func(t *testing.T) (lease.Leaser, lease.Leaser, time.Duration) {
		l := lease.NewLocal()
		return l, l, 10 * time.Second
	})
}

const poll = 200 * time.Millisecond

func pgLeasers(t *testing.T, dsn string) (*lease.Postgres, *lease.Postgres) {
	a, err := lease.NewPostgres(dsn, poll, nil)
	if err != nil {
		t.Fatal(err)
	}
	b, err := lease.NewPostgres(dsn, poll, nil)
	if err != nil {
		t.Fatal(err)
	}
	return a, b
}

func TestPostgres(t *testing.T) {
	leasetest.Run(t, func(t *testing.T) (lease.Leaser, lease.Leaser, time.Duration) {
		a, b := pgLeasers(t, pgtest.DSN(t))
		return a, b, 50 * poll
	})
}

// The holder's backend is terminated (its replica lost the database): it
// stops, and a new holder starts, at no observed moment two at once. The
// standby usually wins (the loser backs off two polls) but the replica that
// lost may win instead when the standby's attempt is slow. Repeated: an
// overlap shows only when the standby's poll falls between the loss and the
// holder's next check.
func TestPostgresFailover(t *testing.T) {
	ctx := context.Background()
	dsn := pgtest.DSN(t)
	a, b := pgLeasers(t, dsn)
	admin, err := pgx.Connect(ctx, pgtest.Shared(t).AdminDSN())
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	var h leasetest.Holders
	for _, r := range []struct {
		l   *lease.Postgres
		who string
	}{{a, "a"}, {b, "b"}} {
		rctx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { defer close(done); r.l.Run(rctx, "reaper", h.Fn(r.who)) }()
		defer func() { cancel(); <-done }()
	}
	holder := h.WaitHolder(t, 50*poll, "")
	key := lease.Key("reaper")
	standbyWon := 0
	const rounds = 10
	for i := range rounds {
		start, starts := time.Now(), h.Starts()
		tag, err := admin.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_locks
WHERE locktype = 'advisory' AND granted AND classid = ($1::bigint >> 32)::oid AND objid = ($1::bigint & 4294967295)::oid AND objsubid = 1`, key)
		if err != nil || tag.RowsAffected() != 1 {
			t.Fatalf("terminate the holder's backend: %v (%d rows)", err, tag.RowsAffected())
		}
		next := h.WaitNewHolder(t, 50*poll, starts)
		t.Logf("failover %d: %s -> %s in %s (poll %s)", i, holder, next, time.Since(start), poll)
		if next != holder {
			standbyWon++
		}
		holder = next
	}
	t.Logf("the standby took over %d of %d times", standbyWon, rounds)
	if m := h.Max(); m != 1 {
		t.Fatalf("%d holders at once", m)
	}
}
