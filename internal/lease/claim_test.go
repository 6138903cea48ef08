package lease_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/cubicle-dev/cubicle/internal/lease"
	"github.com/cubicle-dev/cubicle/internal/store/postgres/pgtest"
)

// A claim is one process's at a time: a second is refused at once with a
// *HeldError naming the holder; once the holder closes it (or dies: its
// session ends), it can be taken again.
func TestClaimOneHolder(t *testing.T) {
	ctx := context.Background()
	a, b := pgLeasers(t, pgtest.DSN(t))
	ca, err := a.Claim(ctx, "node/local")
	if err != nil {
		t.Fatal(err)
	}
	_, err = b.Claim(ctx, "node/local")
	var he *lease.HeldError
	if !errors.Is(err, lease.ErrHeld) || !errors.As(err, &he) || he.Name != "node/local" || !strings.Contains(he.Holder, a.Holder()) {
		t.Fatalf("second claim: %v, want ErrHeld naming holder %s", err, a.Holder())
	}
	// Another name is free.
	other, err := b.Claim(ctx, "node/other")
	if err != nil {
		t.Fatal(err)
	}
	other.Close()
	ca.Close()
	cb, err := b.Claim(ctx, "node/local")
	if err != nil {
		t.Fatalf("claim after the holder closed it: %v", err)
	}
	cb.Close()
}

// The holder's session ends (the process died, or the database dropped
// it): the claim is free for another; the old holder, finding it taken
// when it reconnects, reports it lost.
func TestClaimSessionEnds(t *testing.T) {
	ctx := context.Background()
	dsn := pgtest.DSN(t)
	a, b := pgLeasers(t, dsn)
	admin, err := pgx.Connect(ctx, pgtest.Shared(t).AdminDSN())
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	terminate := func(holder string) {
		t.Helper()
		if _, err := admin.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name LIKE $1`, "cubicle "+holder+"%"); err != nil {
			t.Fatal(err)
		}
	}

	ca, err := a.Claim(ctx, "node/local")
	if err != nil {
		t.Fatal(err)
	}
	defer ca.Close()
	// a takes it again on a new session when it gets there first: end
	// that one too until b has it (bounded).
	var cb *lease.Claim
	for range 100 {
		terminate(a.Holder())
		if cb, err = b.Claim(ctx, "node/local"); err == nil {
			break
		}
		time.Sleep(poll / 8)
	}
	if err != nil {
		t.Fatalf("b never took the claim a's session left: %v", err)
	}
	defer cb.Close()
	select {
	case <-ca.Lost():
	case <-time.After(50 * poll):
		t.Fatal("a did not report the claim lost")
	}
}
