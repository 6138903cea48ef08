// Package leasetest is the conformance suite every lease.Leaser runs.
package leasetest

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/lease"
)

// Open returns two Leasers that compete for the same leases, as two
// control-plane replicas would, and how long a takeover may take.
type Open func(t *testing.T) (a, b lease.Leaser, takeover time.Duration)

// Run runs the suite.
func Run(t *testing.T, open Open) {
	t.Run("OneHolderAndHandover", func(t *testing.T) { testHandover(t, open) })
	t.Run("NamesAreIndependent", func(t *testing.T) { testNames(t, open) })
	t.Run("RunReturnsAfterFn", func(t *testing.T) { testReturn(t, open) })
}

// Holders counts running fns and records the most ever seen at once.
type Holders struct {
	mu      sync.Mutex
	now     map[string]bool
	maxSeen int
	starts  atomic.Int32
}

// Fn returns a lease fn for replica who: it marks who as holding until
// its context is cancelled.
func (h *Holders) Fn(who string) func(context.Context) {
	return func(ctx context.Context) {
		h.mu.Lock()
		if h.now == nil {
			h.now = map[string]bool{}
		}
		h.now[who] = true
		h.maxSeen = max(h.maxSeen, len(h.now))
		h.mu.Unlock()
		h.starts.Add(1)
		<-ctx.Done()
		h.mu.Lock()
		delete(h.now, who)
		h.mu.Unlock()
	}
}

// Current returns the holders now.
func (h *Holders) Current() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []string
	for w := range h.now {
		out = append(out, w)
	}
	return out
}

// Max is the most holders ever seen at once.
func (h *Holders) Max() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.maxSeen
}

// WaitHolder waits up to d for exactly one holder other than not, and
// returns it.
func (h *Holders) WaitHolder(t *testing.T, d time.Duration, not string) string {
	t.Helper()
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if cur := h.Current(); len(cur) == 1 && cur[0] != not {
			return cur[0]
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("no single holder (other than %q) within %s: %v", not, d, h.Current())
	return ""
}

// Starts counts how many times a fn has started.
func (h *Holders) Starts() int32 { return h.starts.Load() }

// WaitNewHolder waits up to d for exactly one holder whose fn started
// after Starts() was after, and returns it.
func (h *Holders) WaitNewHolder(t *testing.T, d time.Duration, after int32) string {
	t.Helper()
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if cur := h.Current(); len(cur) == 1 && h.Starts() > after {
			return cur[0]
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("no new holder within %s: %v, %d starts", d, h.Current(), h.Starts())
	return ""
}

// run starts l.Run in the background and returns its stop function, which
// waits for Run to return.
func run(l lease.Leaser, name string, fn func(context.Context)) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		l.Run(ctx, name, fn)
	}()
	return func() { cancel(); <-done }
}

// Two replicas run one lease: exactly one holds it; when the holder stops,
// the other takes over; never both at once.
func testHandover(t *testing.T, open Open) {
	a, b, takeover := open(t)
	var h Holders
	stopA := run(a, "reaper", h.Fn("a"))
	stopB := run(b, "reaper", h.Fn("b"))
	defer stopB()
	defer stopA()
	first := h.WaitHolder(t, takeover, "")
	if first == "a" {
		stopA()
	} else {
		stopB()
	}
	h.WaitHolder(t, takeover, first)
	if m := h.Max(); m != 1 {
		t.Fatalf("%d holders at once", m)
	}
}

// Different names are different leases: one replica holds both.
func testNames(t *testing.T, open Open) {
	a, _, takeover := open(t)
	var h1, h2 Holders
	defer run(a, "one", h1.Fn("a"))()
	defer run(a, "two", h2.Fn("a"))()
	h1.WaitHolder(t, takeover, "")
	h2.WaitHolder(t, takeover, "")
}

// When Run returns, fn has returned (its context cancelled).
func testReturn(t *testing.T, open Open) {
	a, _, takeover := open(t)
	var h Holders
	stop := run(a, "gc", h.Fn("a"))
	h.WaitHolder(t, takeover, "")
	stop()
	if cur := h.Current(); len(cur) != 0 {
		t.Fatalf("fn still running after Run returned: %v", cur)
	}
	if n := h.starts.Load(); n != 1 {
		t.Fatalf("fn started %d times, want 1", n)
	}
}
