package loop_test

import (
	"context"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/cubicle-dev/cubicle/internal/lease"
	"github.com/cubicle-dev/cubicle/internal/loop"
	"github.com/cubicle-dev/cubicle/internal/store/postgres/pgtest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// waitFor polls cond every 5 ms for up to d (bounded: no test hangs).
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatalf("timed out after %s waiting for %s", d, what)
}

// An unleased loop runs again and again, and Run returns once ctx ends.
func TestUnleasedRunsUntilCancelled(t *testing.T) {
	r := loop.New(lease.NewLocal(), nil)
	ctx, cancel := context.WithCancel(context.Background())
	var n atomic.Int32
	done := make(chan struct{})
	go func() {
		defer close(done)
		r.Run(ctx, loop.Spec{Name: "t", Every: time.Millisecond}, func(context.Context) { n.Add(1) })
	}()
	waitFor(t, 10*time.Second, "three runs", func() bool { return n.Load() >= 3 })
	cancel()
	<-done
	after := n.Load()
	time.Sleep(20 * time.Millisecond)
	if n.Load() != after {
		t.Fatal("the loop ran after Run returned")
	}
}

// A panicking pass is logged and the loop goes on.
func TestPanicDoesNotStopTheLoop(t *testing.T) {
	r := loop.New(lease.NewLocal(), nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var n atomic.Int32
	r.Go(ctx, loop.Spec{Name: "t", Every: time.Millisecond, Now: true}, func(context.Context) {
		if n.Add(1) == 1 {
			panic("first pass")
		}
	})
	waitFor(t, 10*time.Second, "a run after the panic", func() bool { return n.Load() >= 2 })
	cancel()
	r.Wait()
}

// A kick runs the loop at once, long before its interval.
func TestKickRunsNow(t *testing.T) {
	r := loop.New(lease.NewLocal(), nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	kick := make(chan struct{})
	ran := make(chan struct{}, 10)
	r.Go(ctx, loop.Spec{Name: "t", Every: time.Hour, Kick: kick}, func(context.Context) { ran <- struct{}{} })
	for range 2 {
		kick <- struct{}{}
		select {
		case <-ran:
		case <-time.After(10 * time.Second):
			t.Fatal("a kick did not run the loop")
		}
	}
	cancel()
	r.Wait()
}

// The first run of a loop without Now waits a random part of Every.
func TestFirstRunJittered(t *testing.T) {
	r := loop.New(lease.NewLocal(), nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var n atomic.Int32
	r.Go(ctx, loop.Spec{Name: "t", Every: time.Hour}, func(context.Context) { n.Add(1) })
	time.Sleep(20 * time.Millisecond) // a run within Every/180000 would be a 1-in-180000 draw
	cancel()
	r.Wait()
	if n.Load() != 0 {
		t.Fatal("the first run was not delayed")
	}
}

// tracker records which runner runs and that runs never overlap.
type tracker struct {
	mu       sync.Mutex
	inFlight int
	maxSeen  int
	runs     map[string]int
}

func (tr *tracker) fn(who string) func(context.Context) {
	return func(context.Context) {
		tr.mu.Lock()
		tr.inFlight++
		tr.maxSeen = max(tr.maxSeen, tr.inFlight)
		if tr.runs == nil {
			tr.runs = map[string]int{}
		}
		tr.runs[who]++
		tr.mu.Unlock()
		time.Sleep(2 * time.Millisecond)
		tr.mu.Lock()
		tr.inFlight--
		tr.mu.Unlock()
	}
}

func (tr *tracker) count(who string) int {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return tr.runs[who]
}

func (tr *tracker) max() int {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return tr.maxSeen
}

// Two replicas on one Local (two processes on one lease, in miniature):
// only the holder's loop runs; when it stops, the other's runs.
func TestLeasedRunsOnlyWhileHeld(t *testing.T) {
	l := lease.NewLocal()
	var tr tracker
	actx, acancel := context.WithCancel(context.Background())
	bctx, bcancel := context.WithCancel(context.Background())
	defer bcancel()
	ra, rb := loop.New(l, nil), loop.New(l, nil)
	spec := loop.Spec{Name: "reaper", Every: time.Millisecond, Leased: true, Now: true}
	ra.Go(actx, spec, tr.fn("a"))
	waitFor(t, 10*time.Second, "a to run", func() bool { return tr.count("a") >= 3 })
	rb.Go(bctx, spec, tr.fn("b"))
	time.Sleep(20 * time.Millisecond)
	if tr.count("b") != 0 {
		t.Fatal("b ran while a held the lease")
	}
	acancel()
	ra.Wait()
	waitFor(t, 10*time.Second, "b to take over", func() bool { return tr.count("b") >= 3 })
	bcancel()
	rb.Wait()
	if m := tr.max(); m != 1 {
		t.Fatalf("%d runs at once", m)
	}
}

const poll = 200 * time.Millisecond

// Over real PostgreSQL: the holder's database connection dies (as when its
// replica is SIGKILLed); its loop stops and the other replica's loop runs
// within the lease's failover bound (2 polls plus connection set-up), and
// the two loops never run at once.
func TestLeasedFailoverPostgres(t *testing.T) {
	ctx := context.Background()
	dsn := pgtest.DSN(t)
	admin, err := pgx.Connect(ctx, pgtest.Shared(t).AdminDSN())
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	var tr tracker
	rctx, cancel := context.WithCancel(ctx)
	var runners []*loop.Runner
	for _, who := range []string{"a", "b"} {
		l, err := lease.NewPostgres(dsn, poll, nil)
		if err != nil {
			t.Fatal(err)
		}
		r := loop.New(l, nil)
		r.Go(rctx, loop.Spec{Name: "reaper", Every: 5 * time.Millisecond, Leased: true, Now: true}, tr.fn(who))
		runners = append(runners, r)
	}
	defer func() {
		cancel()
		for _, r := range runners {
			r.Wait()
		}
	}()
	waitFor(t, 50*poll, "a holder to run", func() bool { return tr.count("a")+tr.count("b") >= 3 })
	holder, other := "a", "b"
	if tr.count("b") > 0 {
		holder, other = "b", "a"
	}
	if tr.count(other) != 0 {
		t.Fatal("both replicas ran the leased loop")
	}
	key := lease.Key(loop.LeaseName("reaper"))
	start := time.Now()
	tag, err := admin.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_locks
WHERE locktype = 'advisory' AND granted AND classid = (($1::bigint >> 32) & 4294967295)::oid AND objid = ($1::bigint & 4294967295)::oid AND objsubid = 1`, key)
	if err != nil || tag.RowsAffected() != 1 {
		t.Fatalf("terminate the holder's backend: %v (%d rows)", err, tag.RowsAffected())
	}
	// The lost holder backs off two polls, so the standby wins, within the
	// lease's takeover time: 2 polls (its next try, then the fencing delay)
	// plus a poll when it tried while the old session was still exiting;
	// ttl leaves room for a loaded machine.
	const ttl = 10 * poll
	waitFor(t, ttl, "the standby to run within the lease TTL", func() bool { return tr.count(other) >= 1 })
	waitFor(t, 50*poll, "the standby to run again", func() bool { return tr.count(other) >= 3 })
	t.Logf("failover %s -> %s: %s (poll %s)", holder, other, time.Since(start), poll)
	stopped := tr.count(holder)
	time.Sleep(4 * poll)
	if n := tr.count(holder); n != stopped && tr.count(other) > 0 {
		// It may only run again by re-taking the lease, which the standby holds.
		t.Fatalf("the old holder ran %d more times after losing the lease", n-stopped)
	}
	if m := tr.max(); m != 1 {
		t.Fatalf("%d runs at once", m)
	}
}
