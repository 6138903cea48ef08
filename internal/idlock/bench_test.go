package idlock_test

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/idlock"
)

// mutexMap is the Map before it became context-aware (a mutex per entry):
// the baseline the embedded path must not regress against.
type mutexMap struct {
	mu sync.Mutex
	m  map[string]*mutexEntry
}

type mutexEntry struct {
	mu   sync.Mutex
	refs int
}

func (l *mutexMap) Lock(id string) func() {
	l.mu.Lock()
	if l.m == nil {
		l.m = map[string]*mutexEntry{}
	}
	e := l.m[id]
	if e == nil {
		e = &mutexEntry{}
		l.m[id] = e
	}
	e.refs++
	l.mu.Unlock()
	e.mu.Lock()
	return func() {
		e.mu.Unlock()
		l.mu.Lock()
		if e.refs--; e.refs == 0 {
			delete(l.m, id)
		}
		l.mu.Unlock()
	}
}

// BenchmarkMapLock compares the embedded lock (idlock.Map.Acquire) with
// the mutex map it replaced, in the same run: 8 goroutines lock and
// unlock over 16 IDs (some contention, as concurrent API calls on a few
// sandboxes). It prints p50/p95/p99 of one lock+unlock for each and the
// ratio of their means.
//
//	go test -run '^$' -bench MapLock ./internal/idlock/
func BenchmarkMapLock(b *testing.B) {
	ctx := context.Background()
	run := func(lock func(id string) func()) (time.Duration, []time.Duration) {
		const workers = 8
		per := max(b.N/workers, 1)
		lat := make([]time.Duration, workers*per)
		var wg sync.WaitGroup
		start := time.Now()
		for w := range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range per {
					id := fmt.Sprintf("sb-%d", (w*per+i)%16)
					t0 := time.Now()
					lock(id)()
					lat[w*per+i] = time.Since(t0)
				}
			}()
		}
		wg.Wait()
		total := time.Since(start)
		sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
		return total, lat
	}
	var old mutexMap
	var cur idlock.Map
	oldTotal, oldLat := run(old.Lock)
	curTotal, curLat := run(func(id string) func() {
		release, err := cur.Acquire(ctx, id)
		if err != nil {
			b.Fatal(err)
		}
		return release
	})
	pct := func(l []time.Duration, p float64) time.Duration { return l[min(len(l)-1, int(p*float64(len(l))))] }
	b.Logf("n=%d mutex map: p50 %s p95 %s p99 %s; idlock.Map: p50 %s p95 %s p99 %s; wall ratio %.2f",
		len(curLat), pct(oldLat, .5), pct(oldLat, .95), pct(oldLat, .99), pct(curLat, .5), pct(curLat, .95), pct(curLat, .99),
		float64(curTotal)/float64(oldTotal))
	b.ReportMetric(float64(curTotal)/float64(oldTotal), "ratio")
}
