// Package lease_test measures how long a leased control-plane loop takes
// to move to another replica when its holder dies.
package lease_test

import (
	"context"
	"os"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/cubicle-dev/cubicle/internal/lease"
	"github.com/cubicle-dev/cubicle/internal/loop"
	"github.com/cubicle-dev/cubicle/internal/store/postgres/pgtest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// BenchmarkLoopFailover: two replicas run one leased loop (every 10 ms)
// over real PostgreSQL; each trial kills the holder's database session,
// as PostgreSQL sees a SIGKILLed replica (its socket closes), and times
// until the other replica's loop runs. Poll is the lease poll (serve's
// --lease-poll); the lease's bound is 2 polls plus connection set-up,
// and the result is printed as a multiple of the poll too, so it reads the
// same at any poll. Each trial then restarts the dead replica, so every
// trial starts with a holder and a standby.
//
//	go test -run '^$' -bench LoopFailover -benchtime 20x ./bench/lease/
func BenchmarkLoopFailover(b *testing.B) {
	poll := 200 * time.Millisecond
	if s := os.Getenv("CUBICLE_BENCH_LEASE_POLL"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil {
			b.Fatal(err)
		}
		poll = d
	}
	ctx := context.Background()
	dsn := pgtest.DSN(b)
	admin, err := pgx.Connect(ctx, pgtest.Shared(b).AdminDSN())
	if err != nil {
		b.Fatal(err)
	}
	defer admin.Close(ctx)

	var mu sync.Mutex
	last := map[string]time.Time{} // replica -> its loop's latest run
	type replica struct {
		cancel context.CancelFunc
		done   chan struct{}
	}
	start := func(who string) replica {
		l, err := lease.NewPostgres(dsn, poll, nil)
		if err != nil {
			b.Fatal(err)
		}
		rctx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() {
			defer close(done)
			loop.New(l, nil).Run(rctx, loop.Spec{Name: "bench", Every: 10 * time.Millisecond, Leased: true, Now: true}, func(context.Context) {
				mu.Lock()
				last[who] = time.Now()
				mu.Unlock()
			})
		}()
		return replica{cancel, done}
	}
	ranSince := func(who string, t time.Time) bool {
		mu.Lock()
		defer mu.Unlock()
		return last[who].After(t)
	}
	reps := map[string]replica{"a": start("a"), "b": start("b")}
	defer func() {
		for _, r := range reps {
			r.cancel()
			<-r.done
		}
	}()
	wait := func(what string, cond func() bool) {
		for end := time.Now().Add(100 * poll); !cond(); time.Sleep(time.Millisecond) {
			if time.Now().After(end) {
				b.Fatalf("timed out waiting for %s", what)
			}
		}
	}
	t0 := time.Now()
	wait("a first holder", func() bool { return ranSince("a", t0) || ranSince("b", t0) })
	key := lease.Key(loop.LeaseName("bench"))
	var got []time.Duration
	b.ResetTimer()
	for range b.N {
		mark := time.Now().Add(20 * time.Millisecond)
		time.Sleep(30 * time.Millisecond)
		holder, standby := "a", "b"
		if ranSince("b", mark) {
			holder, standby = "b", "a"
		}
		// The dead replica's process is gone: stop it (no unlock: its
		// session is terminated first) and kill its session.
		killed := time.Now()
		tag, err := admin.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_locks
WHERE locktype = 'advisory' AND granted AND classid = (($1::bigint >> 32) & 4294967295)::oid AND objid = ($1::bigint & 4294967295)::oid AND objsubid = 1`, key)
		if err != nil || tag.RowsAffected() != 1 {
			b.Fatalf("terminate the holder's session: %v", err)
		}
		reps[holder].cancel()
		wait("the standby", func() bool { return ranSince(standby, killed) })
		mu.Lock()
		got = append(got, last[standby].Sub(killed))
		mu.Unlock()
		<-reps[holder].done
		reps[holder] = start(holder)
	}
	b.StopTimer()
	sort.Slice(got, func(i, j int) bool { return got[i] < got[j] })
	pct := func(p float64) time.Duration { return got[min(len(got)-1, int(p*float64(len(got))))] }
	b.Logf("leased-loop failover over %d trials, lease poll %s: p50 %s p95 %s p99 %s (p50 %.2f polls, p99 %.2f polls; bound 2 polls + connect)",
		len(got), poll, pct(0.5).Round(time.Millisecond), pct(0.95).Round(time.Millisecond), pct(0.99).Round(time.Millisecond),
		float64(pct(0.5))/float64(poll), float64(pct(0.99))/float64(poll))
	b.ReportMetric(float64(pct(0.5))/float64(poll), "p50-polls")
}
