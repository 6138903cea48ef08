package store_test

import (
	"context"
	"fmt"
	"path/filepath"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/scheduler"
	"github.com/cubicle-dev/cubicle/internal/scheduler/storeledger"
	"github.com/cubicle-dev/cubicle/internal/store/postgres"
	"github.com/cubicle-dev/cubicle/internal/store/postgres/pgtest"
	"github.com/cubicle-dev/cubicle/internal/store/sqlite"
)

// BenchmarkLedgerReserve measures scheduler.Ledger.Reserve at c=50 over
// the in-process MemLedger, the store ledger on SQLite and on PostgreSQL
// (SERIALIZABLE, retried), in the same run: each of b.N reservations
// lands on one of three nodes and is released at once, so the nodes stay
// contended but never full. It logs p50/p95/p99 and reservations per
// second per ledger, and reports PostgreSQL's p50 over SQLite's.
//
//	go test -run '^$' -bench LedgerReserve -benchtime 2000x ./bench/store/
func BenchmarkLedgerReserve(b *testing.B) {
	ctx := context.Background()
	pg, err := postgres.Open(ctx, pgtest.DSN(b))
	if err != nil {
		b.Fatal(err)
	}
	defer pg.Close()
	lite, err := sqlite.Open(filepath.Join(b.TempDir(), "ledger.db"))
	if err != nil {
		b.Fatal(err)
	}
	defer lite.Close()
	const conc = 50
	nodes := []string{"n1", "n2", "n3"}
	measure := func(l scheduler.Ledger, n int) ([]time.Duration, time.Duration) {
		for _, id := range nodes {
			if err := l.SetNode(ctx, id, scheduler.Resources{MilliCPU: 64000, MemoryMiB: 1 << 20, DiskMiB: 1 << 20}); err != nil {
				b.Fatal(err)
			}
		}
		out := make([]time.Duration, n)
		var wg sync.WaitGroup
		work := make(chan int)
		start := time.Now()
		for range conc {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range work {
					sb := fmt.Sprintf("sb-%d", i)
					t0 := time.Now()
					if err := l.Reserve(ctx, sb, nodes[i%len(nodes)], scheduler.Resources{MilliCPU: 1000, MemoryMiB: 1024}); err != nil {
						b.Error(err)
					}
					out[i] = time.Since(t0)
					if err := l.Release(ctx, sb); err != nil {
						b.Error(err)
					}
				}
			}()
		}
		for i := range n {
			work <- i
		}
		close(work)
		wg.Wait()
		total := time.Since(start)
		sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
		return out, total
	}
	q := func(d []time.Duration, p float64) time.Duration { return d[int(float64(len(d)-1)*p)] }
	b.ResetTimer()
	var p50 = map[string]time.Duration{}
	for _, r := range []struct {
		name string
		l    scheduler.Ledger
	}{{"memory", scheduler.NewMemLedger()}, {"sqlite", storeledger.New(lite)}, {"postgres", storeledger.New(pg)}} {
		d, total := measure(r.l, b.N)
		p50[r.name] = q(d, .5)
		b.Logf("%-8s n=%d c=%d p50=%s p95=%s p99=%s reserves/s=%.0f", r.name, len(d), conc, q(d, .5), q(d, .95), q(d, .99),
			float64(len(d))/total.Seconds())
	}
	b.StopTimer()
	b.ReportMetric(float64(p50["postgres"])/float64(p50["sqlite"]), "pg/sqlite-p50")
}
