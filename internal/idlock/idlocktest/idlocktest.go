// Package idlocktest is the conformance suite every idlock.Locker runs.
package idlocktest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/idlock"
)

// Open returns two Lockers that share their locks, as two control-plane
// replicas on one database do (they may be the same Locker).
type Open func(t *testing.T) (a, b idlock.Locker)

// Run runs the suite.
func Run(t *testing.T, open Open) {
	t.Run("MutualExclusion", func(t *testing.T) { testExclusion(t, open) })
	t.Run("IDsAreIndependent", func(t *testing.T) { testIndependent(t, open) })
	t.Run("CancelledWaitHoldsNothing", func(t *testing.T) { testCancel(t, open) })
	t.Run("NoLeak", func(t *testing.T) { testLeak(t, open) })
}

// wait is how long a lock that must be free may take (generous: shared CI).
const wait = 10 * time.Second

func acquire(t *testing.T, l idlock.Locker, id string) func() {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	release, err := l.Acquire(ctx, id)
	if err != nil {
		t.Fatalf("acquire %s: %v", id, err)
	}
	return release
}

func checkIdle(t *testing.T, ls ...idlock.Locker) {
	t.Helper()
	for i, l := range ls {
		if n := l.Held(); n != 0 {
			t.Fatalf("locker %d holds %d after every release", i, n)
		}
	}
}

// Many callers on both lockers take one ID: never two inside at once,
// and every one gets in.
func testExclusion(t *testing.T, open Open) {
	a, b := open(t)
	var mu sync.Mutex
	inside, most, total := 0, 0, 0
	var wg sync.WaitGroup
	for i := range 8 {
		l := a
		if i%2 == 1 {
			l = b
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 10 {
				ctx, cancel := context.WithTimeout(context.Background(), 4*wait)
				release, err := l.Acquire(ctx, "sb-1")
				cancel()
				if err != nil {
					t.Errorf("acquire: %v", err)
					return
				}
				mu.Lock()
				inside++
				most = max(most, inside)
				mu.Unlock()
				time.Sleep(time.Millisecond)
				mu.Lock()
				inside--
				total++
				mu.Unlock()
				release()
			}
		}()
	}
	wg.Wait()
	if most != 1 || total != 80 {
		t.Fatalf("%d callers inside at once (want 1), %d of 80 entries", most, total)
	}
	checkIdle(t, a, b)
}

// A held ID does not hold up another.
func testIndependent(t *testing.T, open Open) {
	a, b := open(t)
	ra := acquire(t, a, "x")
	rb := acquire(t, b, "y")
	rb()
	ra()
	checkIdle(t, a, b)
}

// A wait that ends with its context returns the context's error, and
// takes nothing: the holder can release and take the lock again at once.
func testCancel(t *testing.T, open Open) {
	a, b := open(t)
	ra := acquire(t, a, "x")
	for _, l := range []idlock.Locker{a, b} {
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		_, err := l.Acquire(ctx, "x")
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("acquire of a held ID with an expiring context: %v, want DeadlineExceeded", err)
		}
		ctx, cancel = context.WithCancel(context.Background())
		cancel()
		if _, err := l.Acquire(ctx, "x"); !errors.Is(err, context.Canceled) {
			t.Fatalf("acquire with a cancelled context: %v, want Canceled", err)
		}
	}
	ra()
	acquire(t, b, "x")()
	acquire(t, a, "x")()
	checkIdle(t, a, b)
}

// Hundreds of locks, held, cancelled and released, leave nothing held
// (no lock entry, no connection).
func testLeak(t *testing.T, open Open) {
	a, b := open(t)
	for i := range 100 {
		id := fmt.Sprintf("sb-%d", i)
		r := acquire(t, a, id)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Millisecond)
		if _, err := b.Acquire(ctx, id); err == nil {
			t.Fatalf("%s acquired twice", id)
		}
		cancel()
		r()
		acquire(t, b, id)()
	}
	checkIdle(t, a, b)
}
