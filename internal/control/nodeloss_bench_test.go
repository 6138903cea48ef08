package control

import (
	"context"
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/idlock"
	clusterlease "github.com/cubicle-dev/cubicle/internal/lease"
	"github.com/cubicle-dev/cubicle/internal/store"
	"github.com/cubicle-dev/cubicle/internal/store/postgres"
	"github.com/cubicle-dev/cubicle/internal/store/postgres/pgtest"
)

// BenchmarkDeadNodeDetection times, over real PostgreSQL with the
// replica's loops running under PostgreSQL leases, from a node's last
// heartbeat to its sandbox showing state lost. The node beats every
// lostAfter/3 (as a node does: 5 s against the 15 s default) until each
// trial stops it. The loop looks every lostAfter/3, so detection lands in
// [lostAfter, 4/3 lostAfter] plus a pass's time; the result is printed
// in units of lostAfter too, so it reads the same at the 15 s default.
// (Lives here, not in bench/, because it drives the control plane's node
// fake; bench/lease measures the lease failover.)
//
//	go test -run '^$' -bench DeadNodeDetection -benchtime 20x ./internal/control/
func BenchmarkDeadNodeDetection(b *testing.B) {
	const lostAfter = 300 * time.Millisecond
	ctx := context.Background()
	dsn := pgtest.DSN(b)
	st, err := postgres.Open(ctx, dsn)
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	l, err := clusterlease.NewPostgres(dsn, 100*time.Millisecond, nil)
	if err != nil {
		b.Fatal(err)
	}
	locks, err := idlock.NewPostgres(ctx, dsn, "sandbox", 0)
	if err != nil {
		b.Fatal(err)
	}
	defer locks.Close()
	m := New(Config{Leaser: l, Locks: locks, NodeLostAfter: lostAfter, NodeLostGrace: time.Hour, Logger: slog.New(slog.DiscardHandler)},
		st, newFakeNode(), storeResolver{st})
	if err := st.RegisterNode(ctx, &store.Node{ID: "n2", Capacity: store.Capacity{MilliCPU: 8000, MemoryMiB: 8192}}); err != nil {
		b.Fatal(err)
	}
	const id = "benchsandbox00000000"
	if err := st.CreateSandbox(ctx, &store.Sandbox{ID: id, TeamID: store.SystemTeamID, TemplateID: "tpl", State: store.StateRunning, Node: "n2",
		StartedAt: time.Now(), EndAt: time.Now().Add(24 * time.Hour)}); err != nil {
		b.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); m.Run(rctx) }()
	defer func() { cancel(); <-done }()

	// beat heartbeats n2 until stop is closed, and returns the last beat's time.
	beat := func(stop <-chan struct{}) <-chan time.Time {
		lastc := make(chan time.Time, 1)
		go func() {
			var last time.Time
			t := time.NewTicker(lostAfter / 3)
			defer t.Stop()
			for {
				now := time.Now()
				if err := st.HeartbeatNode(ctx, "n2", store.NodeHeartbeat{Capacity: store.Capacity{MilliCPU: 8000, MemoryMiB: 8192}, Time: now}); err == nil {
					last = now
				}
				select {
				case <-stop:
					lastc <- last
					return
				case <-t.C:
				}
			}
		}()
		return lastc
	}
	var got []time.Duration
	var mu sync.Mutex
	b.ResetTimer()
	for range b.N {
		stop := make(chan struct{})
		lastc := beat(stop)
		time.Sleep(lostAfter) // beating: the loop must leave it running
		sb, err := st.GetSandbox(ctx, id)
		if err != nil || sb.State != store.StateRunning {
			b.Fatalf("sandbox of a beating node: %v %v", sb.State, err)
		}
		close(stop)
		last := <-lastc
		var seen time.Time
		for end := time.Now().Add(20 * lostAfter); ; time.Sleep(time.Millisecond) {
			if sb, err := st.GetSandbox(ctx, id); err == nil && sb.State == store.StateLost {
				seen = time.Now()
				break
			}
			if time.Now().After(end) {
				b.Fatal("the node was never found lost")
			}
		}
		mu.Lock()
		got = append(got, seen.Sub(last))
		mu.Unlock()
		// Back to running for the next trial (this node is not the
		// manager's, so its return is not re-adopted through it).
		if _, err := st.CompareAndSetState(ctx, id, []store.SandboxState{store.StateLost}, store.StateRunning); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	sort.Slice(got, func(i, j int) bool { return got[i] < got[j] })
	pct := func(p float64) time.Duration { return got[min(len(got)-1, int(p*float64(len(got))))] }
	unit := func(d time.Duration) string {
		return fmt.Sprintf("%s (%.2f×)", d.Round(time.Millisecond), float64(d)/float64(lostAfter))
	}
	b.Logf("dead-node detection over %d trials, --node-lost-after %s: p50 %s p95 %s p99 %s (expected within [1, 1.33]× plus a pass)",
		len(got), lostAfter, unit(pct(0.5)), unit(pct(0.95)), unit(pct(0.99)))
}
