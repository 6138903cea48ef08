package phase

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestNoTraceIsNoop(t *testing.T) {
	ctx := context.Background()
	if From(ctx) != nil {
		t.Fatal("a bare context has a trace")
	}
	Start(ctx, Disk)() // must not panic
	var tr *Trace
	tr.Add(Disk, time.Second)
	tr.SetRuntime("runc")
	if tr.Phases() != nil || tr.Runtime() != "" || tr.ServerTiming() != "" {
		t.Fatal("a nil trace recorded something")
	}
	if n := testing.AllocsPerRun(100, func() { Start(ctx, Disk)() }); n != 0 {
		t.Fatalf("a mark without a trace allocates %v times", n)
	}
}

func TestNestedPhasesOverlap(t *testing.T) {
	tr := New()
	ctx := With(context.Background(), tr)
	endOuter := Start(ctx, Network)
	endInner := Start(ctx, LockWait)
	time.Sleep(2 * time.Millisecond)
	endInner()
	endOuter()
	ps := tr.Phases()
	if len(ps) != 2 || ps[0].Name != LockWait || ps[1].Name != Network {
		t.Fatalf("phases %+v, want lock_wait then network (end order)", ps)
	}
	if ps[0].Duration <= 0 || ps[1].Duration < ps[0].Duration {
		t.Fatalf("the outer phase (%v) must include the inner one (%v)", ps[1].Duration, ps[0].Duration)
	}
}

func TestRepeatedPhaseSums(t *testing.T) {
	tr := New()
	tr.Add(Store, 3*time.Millisecond)
	tr.Add(Validate, time.Millisecond)
	tr.Add(Store, 4*time.Millisecond)
	tr.Merge([]Phase{{Name: Disk, Duration: 25 * time.Millisecond}, {Name: Store, Duration: time.Millisecond}})
	want := []Phase{{Store, 8 * time.Millisecond}, {Validate, time.Millisecond}, {Disk, 25 * time.Millisecond}}
	got := tr.Phases()
	if len(got) != len(want) {
		t.Fatalf("phases %+v, want %+v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("phases %+v, want %+v", got, want)
		}
	}
	if h := tr.ServerTiming(); h != "store;dur=8.000, validate;dur=1.000, disk;dur=25.000" {
		t.Fatalf("Server-Timing %q", h)
	}
}

func TestConcurrentMarks(t *testing.T) {
	tr := New()
	ctx := With(context.Background(), tr)
	const workers, each = 16, 200
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range each {
				tr.Add(Names[w%len(Names)], time.Microsecond)
				Start(ctx, Store)()
			}
			tr.SetRuntime("runc")
			_ = tr.ServerTiming()
		}()
	}
	wg.Wait()
	var sum time.Duration
	for _, p := range tr.Phases() {
		if p.Name != Store {
			sum += p.Duration
		}
	}
	// Every Add landed: 16 workers × 200 marks of 1µs over names other
	// than store, plus whatever the workers whose name is store added.
	storeWorkers := 0
	for w := range workers {
		if Names[w%len(Names)] == Store {
			storeWorkers++
		}
	}
	if want := time.Duration((workers-storeWorkers)*each) * time.Microsecond; sum != want {
		t.Fatalf("non-store phases sum to %v, want %v", sum, want)
	}
	if tr.Runtime() != "runc" {
		t.Fatalf("runtime %q", tr.Runtime())
	}
	if !strings.Contains(tr.ServerTiming(), "store;dur=") {
		t.Fatal("no store phase in the header")
	}
}

func TestNamesAreTokens(t *testing.T) {
	for _, n := range Names {
		if strings.ContainsAny(n, " ,;=\"") {
			t.Fatalf("phase %q is not a Server-Timing token", n)
		}
	}
}

// The cost of one mark (go test -bench Mark ./internal/phase/): the
// create path makes about twenty.
func BenchmarkMark(b *testing.B) {
	b.Run("no-trace", func(b *testing.B) {
		ctx := context.Background()
		for b.Loop() {
			Start(ctx, Disk)()
		}
	})
	b.Run("trace", func(b *testing.B) {
		ctx := With(context.Background(), New())
		for b.Loop() {
			Start(ctx, Disk)()
		}
	})
}
