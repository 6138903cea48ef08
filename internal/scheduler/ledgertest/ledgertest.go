// Package ledgertest is the conformance suite every scheduler.Ledger runs
// (containerd's testsuite shape): in memory today, over the store's
// transaction once the ledger is cluster-wide.
package ledgertest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/cubicle-dev/cubicle/internal/scheduler"
)

// Factory returns an empty ledger; cleanup goes through t.Cleanup.
type Factory func(t *testing.T) scheduler.Ledger

// Run runs every behaviour as a subtest.
func Run(t *testing.T, newLedger Factory) {
	for _, tc := range []struct {
		name string
		fn   func(*testing.T, scheduler.Ledger)
	}{
		{"ReserveWithinCapacity", testReserveWithinCapacity},
		{"RefusesEachResource", testRefusesEachResource},
		{"ReleaseReturnsRoom", testReleaseReturnsRoom},
		{"ReleaseIsIdempotent", testReleaseIdempotent},
		{"RetriedReserveCountsOnce", testReserveIdempotent},
		{"ConflictingReservation", testConflict},
		{"UnknownNode", testUnknownNode},
		{"ShrunkCapacity", testShrink},
		{"InvalidInput", testInvalid},
		{"ConcurrentReservesNeverOversell", testRace},
		{"ConcurrentReserveAndRelease", testChurn},
	} {
		t.Run(tc.name, func(t *testing.T) { tc.fn(t, newLedger(t)) })
	}
}

var ctx = context.Background()

func res(cpu, mem, disk int64) scheduler.Resources {
	return scheduler.Resources{MilliCPU: cpu, MemoryMiB: mem, DiskMiB: disk}
}

func mustSet(t *testing.T, l scheduler.Ledger, id string, r scheduler.Resources) {
	t.Helper()
	if err := l.SetNode(ctx, id, r); err != nil {
		t.Fatalf("SetNode %s: %v", id, err)
	}
}

func committed(t *testing.T, l scheduler.Ledger, id string) scheduler.Resources {
	t.Helper()
	c, err := l.Committed(ctx)
	if err != nil {
		t.Fatalf("Committed: %v", err)
	}
	r, ok := c[id]
	if !ok {
		t.Fatalf("Committed has no node %s: %v", id, c)
	}
	return r
}

func testReserveWithinCapacity(t *testing.T, l scheduler.Ledger) {
	mustSet(t, l, "n1", res(4000, 8192, 10240))
	for i := 0; i < 4; i++ {
		if err := l.Reserve(ctx, fmt.Sprintf("sb%d", i), "n1", res(1000, 2048, 2560)); err != nil {
			t.Fatalf("reserve %d: %v", i, err)
		}
	}
	if got := committed(t, l, "n1"); got != res(4000, 8192, 10240) {
		t.Fatalf("committed %+v, want the whole node", got)
	}
	err := l.Reserve(ctx, "sb4", "n1", res(1, 0, 0))
	var ie *scheduler.InsufficientError
	if !errors.As(err, &ie) || !errors.Is(err, scheduler.ErrInsufficient) || ie.Resource != scheduler.ReasonCPU || ie.Free != 0 {
		t.Fatalf("reserve past capacity: %v, want InsufficientError on cpu with 0 free", err)
	}
}

func testRefusesEachResource(t *testing.T, l scheduler.Ledger) {
	mustSet(t, l, "n1", res(2000, 1024, 1024))
	for _, c := range []struct {
		r    scheduler.Resources
		want scheduler.Reason
	}{
		{res(2001, 1, 1), scheduler.ReasonCPU},
		{res(1, 1025, 1), scheduler.ReasonMemory},
		{res(1, 1, 1025), scheduler.ReasonDisk},
	} {
		err := l.Reserve(ctx, "big", "n1", c.r)
		var ie *scheduler.InsufficientError
		if !errors.As(err, &ie) || ie.Resource != c.want || ie.Node != "n1" {
			t.Fatalf("reserve %+v: %v, want InsufficientError on %s", c.r, err, c.want)
		}
	}
	if got := committed(t, l, "n1"); got != (scheduler.Resources{}) {
		t.Fatalf("a refused reserve left %+v committed", got)
	}
	// A refused sandbox may then reserve something that fits.
	if err := l.Reserve(ctx, "big", "n1", res(2000, 1024, 1024)); err != nil {
		t.Fatalf("exact fit after refusals: %v", err)
	}
}

func testReleaseReturnsRoom(t *testing.T, l scheduler.Ledger) {
	mustSet(t, l, "n1", res(1000, 1024, 0))
	if err := l.Reserve(ctx, "a", "n1", res(1000, 1024, 0)); err != nil {
		t.Fatal(err)
	}
	if err := l.Reserve(ctx, "b", "n1", res(1000, 1024, 0)); !errors.Is(err, scheduler.ErrInsufficient) {
		t.Fatalf("second reserve on a full node: %v", err)
	}
	if err := l.Release(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if err := l.Reserve(ctx, "b", "n1", res(1000, 1024, 0)); err != nil {
		t.Fatalf("reserve after release: %v", err)
	}
}

func testReleaseIdempotent(t *testing.T, l scheduler.Ledger) {
	mustSet(t, l, "n1", res(2000, 2048, 0))
	if err := l.Reserve(ctx, "a", "n1", res(1000, 1024, 0)); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		if err := l.Release(ctx, "a"); err != nil {
			t.Fatalf("release %d: %v", i, err)
		}
	}
	if err := l.Release(ctx, "never-reserved"); err != nil {
		t.Fatalf("release of an unknown sandbox: %v", err)
	}
	if got := committed(t, l, "n1"); got != (scheduler.Resources{}) {
		t.Fatalf("after repeated releases committed is %+v, want zero", got)
	}
}

func testReserveIdempotent(t *testing.T, l scheduler.Ledger) {
	mustSet(t, l, "n1", res(2000, 2048, 0))
	for i := 0; i < 3; i++ {
		if err := l.Reserve(ctx, "a", "n1", res(1000, 1024, 0)); err != nil {
			t.Fatalf("reserve %d: %v", i, err)
		}
	}
	if got := committed(t, l, "n1"); got != res(1000, 1024, 0) {
		t.Fatalf("a retried reserve counted twice: %+v", got)
	}
}

func testConflict(t *testing.T, l scheduler.Ledger) {
	mustSet(t, l, "n1", res(4000, 4096, 0))
	mustSet(t, l, "n2", res(4000, 4096, 0))
	if err := l.Reserve(ctx, "a", "n1", res(1000, 1024, 0)); err != nil {
		t.Fatal(err)
	}
	if err := l.Reserve(ctx, "a", "n2", res(1000, 1024, 0)); !errors.Is(err, scheduler.ErrConflict) {
		t.Fatalf("same sandbox on another node: %v, want ErrConflict", err)
	}
	if err := l.Reserve(ctx, "a", "n1", res(2000, 1024, 0)); !errors.Is(err, scheduler.ErrConflict) {
		t.Fatalf("same sandbox with other resources: %v, want ErrConflict", err)
	}
	if got := committed(t, l, "n2"); got != (scheduler.Resources{}) {
		t.Fatalf("a conflicting reserve committed %+v on n2", got)
	}
}

func testUnknownNode(t *testing.T, l scheduler.Ledger) {
	if err := l.Reserve(ctx, "a", "ghost", res(1, 1, 1)); !errors.Is(err, scheduler.ErrUnknownNode) {
		t.Fatalf("reserve on an unregistered node: %v, want ErrUnknownNode", err)
	}
}

func testShrink(t *testing.T, l scheduler.Ledger) {
	mustSet(t, l, "n1", res(4000, 4096, 0))
	for _, id := range []string{"a", "b"} {
		if err := l.Reserve(ctx, id, "n1", res(2000, 2048, 0)); err != nil {
			t.Fatal(err)
		}
	}
	mustSet(t, l, "n1", res(2000, 2048, 0)) // the node came back smaller
	if err := l.Reserve(ctx, "c", "n1", res(1, 1, 0)); !errors.Is(err, scheduler.ErrInsufficient) {
		t.Fatalf("reserve on an over-committed node: %v", err)
	}
	if err := l.Release(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if err := l.Reserve(ctx, "c", "n1", res(1, 1, 0)); !errors.Is(err, scheduler.ErrInsufficient) {
		t.Fatalf("node exactly full after one release must still refuse: %v", err)
	}
	if err := l.Release(ctx, "b"); err != nil {
		t.Fatal(err)
	}
	if err := l.Reserve(ctx, "c", "n1", res(2000, 2048, 0)); err != nil {
		t.Fatalf("reserve once under the new capacity: %v", err)
	}
}

func testInvalid(t *testing.T, l scheduler.Ledger) {
	if err := l.SetNode(ctx, "", res(1, 1, 1)); !errors.Is(err, scheduler.ErrInvalid) {
		t.Fatalf("SetNode without an ID: %v", err)
	}
	if err := l.SetNode(ctx, "n1", res(-1, 1, 1)); !errors.Is(err, scheduler.ErrInvalid) {
		t.Fatalf("SetNode with negative CPU: %v", err)
	}
	mustSet(t, l, "n1", res(1000, 1000, 1000))
	if err := l.Reserve(ctx, "a", "n1", res(0, -5, 0)); !errors.Is(err, scheduler.ErrInvalid) {
		t.Fatalf("negative reservation (would grow the node): %v", err)
	}
	if err := l.Reserve(ctx, "", "n1", res(1, 1, 1)); !errors.Is(err, scheduler.ErrInvalid) {
		t.Fatalf("reservation without a sandbox ID: %v", err)
	}
}

// testRace is CubeSandbox #695's case: 50 creates at once against nodes
// with room for exactly N sandboxes in all. Exactly N may succeed.
func testRace(t *testing.T, l scheduler.Ledger) {
	const goroutines = 50
	// Three nodes holding 12 + 10 + 8 = 30 sandboxes of 1 CPU / 1 GiB;
	// each node's limit is a different resource.
	nodes := []struct {
		id  string
		cap scheduler.Resources
	}{
		{"n1", res(12000, 64<<10, 1<<20)},
		{"n2", res(64000, 10<<10, 1<<20)},
		{"n3", res(64000, 64<<10, 8*1024)},
	}
	const room = 30
	for _, n := range nodes {
		mustSet(t, l, n.id, n.cap)
	}
	one := res(1000, 1024, 1024)
	var ok atomic.Int64
	perNode := make([]atomic.Int64, len(nodes))
	start := make(chan struct{})
	var wg sync.WaitGroup
	errs := make(chan error, goroutines)
	for g := 0; g < goroutines; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			sb := fmt.Sprintf("sb-%d", g)
			// Each tries every node, starting at a different one so the
			// nodes are contended from all sides.
			for i := range nodes {
				k := (g + i) % len(nodes)
				err := l.Reserve(ctx, sb, nodes[k].id, one)
				if err == nil {
					ok.Add(1)
					perNode[k].Add(1)
					return
				}
				if !errors.Is(err, scheduler.ErrInsufficient) {
					errs <- fmt.Errorf("%s on %s: %w", sb, nodes[k].id, err)
					return
				}
			}
		}()
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if got := ok.Load(); got != room {
		t.Fatalf("%d of %d reservations succeeded against room for exactly %d", got, goroutines, room)
	}
	c, err := l.Committed(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for i, n := range nodes {
		got := c[n.id]
		if !got.Fits(n.cap) {
			t.Errorf("node %s oversold: committed %+v, allocatable %+v", n.id, got, n.cap)
		}
		if want := res(1000, 1024, 1024); got != (scheduler.Resources{MilliCPU: want.MilliCPU * perNode[i].Load(), MemoryMiB: want.MemoryMiB * perNode[i].Load(), DiskMiB: want.DiskMiB * perNode[i].Load()}) {
			t.Errorf("node %s committed %+v, but %d reservations succeeded there", n.id, got, perNode[i].Load())
		}
	}
}

// testChurn reserves and releases concurrently; the ledger must end
// exactly where the surviving reservations put it.
func testChurn(t *testing.T, l scheduler.Ledger) {
	mustSet(t, l, "n1", res(10000, 10240, 0))
	var wg sync.WaitGroup
	var kept atomic.Int64
	for g := 0; g < 20; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 25; i++ {
				sb := fmt.Sprintf("c-%d-%d", g, i)
				if err := l.Reserve(ctx, sb, "n1", res(1000, 1024, 0)); err != nil {
					if !errors.Is(err, scheduler.ErrInsufficient) {
						t.Error(err)
					}
					continue
				}
				if i%5 == 4 {
					kept.Add(1) // keep a few; release the rest
					continue
				}
				if err := l.Release(ctx, sb); err != nil {
					t.Error(err)
				}
			}
		}()
	}
	wg.Wait()
	got := committed(t, l, "n1")
	if got.MilliCPU != 1000*kept.Load() || got.MemoryMiB != 1024*kept.Load() || !got.Fits(res(10000, 10240, 0)) {
		t.Fatalf("committed %+v after churn, %d reservations kept", got, kept.Load())
	}
}
