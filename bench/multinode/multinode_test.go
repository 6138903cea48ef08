package multinode_test

import (
	"context"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/control"
	"github.com/cubicle-dev/cubicle/internal/node"
	"github.com/cubicle-dev/cubicle/internal/nodeset"
	"github.com/cubicle-dev/cubicle/internal/runtime"
	"github.com/cubicle-dev/cubicle/internal/store"
	"github.com/cubicle-dev/cubicle/internal/store/postgres"
	"github.com/cubicle-dev/cubicle/internal/store/postgres/pgtest"
	"github.com/cubicle-dev/cubicle/internal/store/sqlite"
	"github.com/cubicle-dev/cubicle/internal/template"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// simNode answers the calls a create and a kill make, in memory: the
// node's own work is left out so the numbers are the control plane's
// (placement, ledger, rows). Other methods are not called.
type simNode struct {
	node.Node
	mu  sync.Mutex
	sbs map[string]bool
}

func (n *simNode) Info(context.Context) (node.Info, error) {
	return node.Info{ID: "sim", Runtime: "sim"}, nil
}
func (n *simNode) Create(_ context.Context, req node.CreateRequest) (node.Sandbox, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.sbs[req.ID] = true
	return node.Sandbox{ID: req.ID, Addr: netip.MustParseAddr("10.0.0.2"), State: runtime.StateRunning}, nil
}
func (n *simNode) Delete(_ context.Context, id string) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	delete(n.sbs, id)
	return nil
}

type resolver struct{}

func (resolver) Resolve(context.Context, string) (template.Template, error) {
	return template.Template{ID: "tpl", Alias: "tpl", Layers: []string{"/nonexistent"}, CPUCount: 1, MemoryMB: 128}, nil
}

// BenchmarkClusterCreate measures a create and its kill through the
// control plane over registered nodes answered in-process (placement
// across them, a store-ledger reservation, the sandbox rows), 50 at once,
// on SQLite and PostgreSQL in the same run. It prints p50/p95/p99 of the
// create and the creates per second.
//
//	go test -run '^$' -bench ClusterCreate -benchtime 1000x ./bench/multinode/
func BenchmarkClusterCreate(b *testing.B) {
	for _, nodes := range []int{3, 30} {
		for _, backend := range []string{"sqlite", "postgres"} {
			b.Run(fmt.Sprintf("%s/nodes=%d", backend, nodes), func(b *testing.B) {
				var st store.Store
				var err error
				if backend == "sqlite" {
					st, err = sqlite.Open(filepath.Join(b.TempDir(), "bench.db"))
				} else {
					st, err = postgres.Open(context.Background(), pgtest.DSN(b))
				}
				if err != nil {
					b.Fatal(err)
				}
				defer st.Close()
				run(b, st, nodes)
			})
		}
	}
}

func run(b *testing.B, st store.Store, n int) {
	ctx := context.Background()
	sims := map[string]*simNode{}
	for i := range n {
		id := fmt.Sprintf("node-%03d", i)
		sims[id] = &simNode{sbs: map[string]bool{}}
		if err := st.RegisterNode(ctx, &store.Node{ID: id, Address: id + ":7443", Runtime: "sim",
			Capacity: store.Capacity{MilliCPU: 1 << 30, MemoryMiB: 1 << 40}}); err != nil {
			b.Fatal(err)
		}
	}
	set := nodeset.New(nodeset.Config{Registry: st, Dial: func(row *store.Node) (node.Node, io.Closer, error) {
		return sims[row.ID], io.NopCloser(nil), nil
	}})
	m := control.New(control.Config{Nodes: set, MaxConcurrentCreates: 64, Logger: nil}, st, nil, resolver{})
	lat := make([]time.Duration, b.N)
	work := make(chan int)
	var wg sync.WaitGroup
	var failed sync.Once
	b.ResetTimer()
	start := time.Now()
	for range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				t0 := time.Now()
				sb, err := m.Create(ctx, control.CreateOptions{TemplateID: "tpl", Timeout: time.Minute})
				lat[i] = time.Since(t0)
				if err != nil {
					failed.Do(func() { b.Error(err) })
					continue
				}
				if err := m.Kill(ctx, sb.ID, "bench"); err != nil {
					failed.Do(func() { b.Error(err) })
				}
			}
		}()
	}
	for i := range b.N {
		work <- i
	}
	close(work)
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	q := func(p float64) time.Duration { return lat[int(p*float64(len(lat)-1))] }
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "creates/s")
	if b.N < 50 {
		return // the framework's probe run
	}
	fmt.Printf("%s: %d creates at c=50: p50 %v p95 %v p99 %v, %.0f creates+kills/s\n", b.Name(), b.N,
		q(0.50).Round(10*time.Microsecond), q(0.95).Round(10*time.Microsecond), q(0.99).Round(10*time.Microsecond), float64(b.N)/elapsed.Seconds())
}
