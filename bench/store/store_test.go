package store_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/store"
	"github.com/cubicle-dev/cubicle/internal/store/postgres"
	"github.com/cubicle-dev/cubicle/internal/store/postgres/pgtest"
	"github.com/cubicle-dev/cubicle/internal/store/sqlite"
)

// BenchmarkCreateAndTransition measures the hot write path of a sandbox
// (quota-checked create, then two compare-and-sets) on PostgreSQL against
// SQLite in the same run, and reports p50/p95/p99 per backend and the
// ratio of their p50s (absolute times on a shared machine mean little).
//
//	go test -run '^$' -bench CreateAndTransition -benchtime 300x ./bench/store/
func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

func BenchmarkCreateAndTransition(b *testing.B) {
	ctx := context.Background()
	pg, err := postgres.Open(ctx, pgtest.DSN(b))
	if err != nil {
		b.Fatal(err)
	}
	defer pg.Close()
	lite, err := sqlite.Open(filepath.Join(b.TempDir(), "bench.db"))
	if err != nil {
		b.Fatal(err)
	}
	defer lite.Close()
	quota := store.Quota{MaxSandboxes: 1 << 20}
	for _, s := range []store.Store{pg, lite} {
		if err := s.CreateTeam(ctx, &store.Team{ID: "t_bench", Name: "bench", Quota: quota}); err != nil {
			b.Fatal(err)
		}
	}
	measure := func(s store.Store, n int, tag string) []time.Duration {
		out := make([]time.Duration, 0, n)
		for i := range n {
			id := fmt.Sprintf("%s%016d", tag, i)
			start := time.Now()
			if err := s.CreateSandbox(ctx, &store.Sandbox{ID: id, TeamID: "t_bench", TemplateID: "base", State: store.StateCreating,
				CPUCount: 1, MemoryMB: 256, StartedAt: start, EndAt: start.Add(time.Minute)}); err != nil {
				b.Fatal(err)
			}
			if _, err := s.CompareAndSetState(ctx, id, []store.SandboxState{store.StateCreating}, store.StateRunning); err != nil {
				b.Fatal(err)
			}
			if _, err := s.CompareAndSetState(ctx, id, []store.SandboxState{store.StateRunning}, store.StateKilled); err != nil {
				b.Fatal(err)
			}
			out = append(out, time.Since(start))
		}
		sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
		return out
	}
	b.ResetTimer()
	pgD := measure(pg, b.N, "pg")
	liteD := measure(lite, b.N, "li")
	b.StopTimer()
	q := func(d []time.Duration, p float64) time.Duration { return d[int(float64(len(d)-1)*p)] }
	for _, r := range []struct {
		name string
		d    []time.Duration
	}{{"postgres", pgD}, {"sqlite", liteD}} {
		b.Logf("%-8s n=%d p50=%s p95=%s p99=%s", r.name, len(r.d), q(r.d, .5), q(r.d, .95), q(r.d, .99))
	}
	b.ReportMetric(float64(q(pgD, .5))/float64(q(liteD, .5)), "pg/sqlite-p50")
}
