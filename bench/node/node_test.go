package node_test

import (
	"context"
	"sort"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/node"
	"github.com/cubicle-dev/cubicle/internal/node/nodegrpc/nodegrpctest"
	"github.com/cubicle-dev/cubicle/internal/node/nodetest/localnode"
)

func TestMain(m *testing.M) { localnode.Main(m) }

// BenchmarkNodeOverWire measures what one gRPC hop adds to a node call: the
// same real Local (runc) called in-process and through nodegrpc over a
// bufconn, interleaved in one run. Info is the hop alone (the node answers
// from memory and one sysinfo(2)); Get asks runc for the sandbox's state;
// Run is a command through the sandbox's agent, the
// shape of the calls the control plane makes on a sandbox's path. It
// prints p50/p95/p99 of each and the ratio of the p50s.
//
//	go test -run '^$' -bench NodeOverWire -benchtime 200x ./bench/node/
func BenchmarkNodeOverWire(b *testing.B) {
	l, _ := localnode.New(b)
	wire := nodegrpctest.Pipe(b, l)
	ctx := context.Background()
	id := "bench" + localnode.RandHex(b, 7)
	if _, err := l.Create(ctx, node.CreateRequest{ID: id, Layers: localnode.Layers(b), EnvdToken: "tok", CPUCount: 1, MemoryMB: 256}); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		if err := l.Delete(context.Background(), id); err != nil {
			b.Errorf("delete: %v", err)
		}
	})
	calls := []struct {
		name string
		do   func(n node.Node) error
	}{
		{"Info", func(n node.Node) error { _, err := n.Info(ctx); return err }},
		{"Get", func(n node.Node) error { _, err := n.Get(ctx, id); return err }},
		{"Run", func(n node.Node) error { _, err := n.Run(ctx, id, "tok", "user", "true"); return err }},
	}
	sides := []struct {
		name string
		n    node.Node
	}{{"local", l}, {"grpc", wire}}
	d := map[string][]time.Duration{}
	b.ResetTimer()
	for range b.N {
		for _, c := range calls {
			for _, s := range sides {
				start := time.Now()
				if err := c.do(s.n); err != nil {
					b.Fatalf("%s %s: %v", s.name, c.name, err)
				}
				d[c.name+"/"+s.name] = append(d[c.name+"/"+s.name], time.Since(start))
			}
		}
	}
	b.StopTimer()
	if b.N == 1 {
		return // the probe round; the real one logs (BENCH output is cut at 10 lines)
	}
	q := func(v []time.Duration, p float64) time.Duration { return v[int(float64(len(v)-1)*p)] }
	for _, c := range calls {
		for _, s := range sides {
			v := d[c.name+"/"+s.name]
			sort.Slice(v, func(i, j int) bool { return v[i] < v[j] })
			b.Logf("%-5s %-5s n=%d p50=%s p95=%s p99=%s", c.name, s.name, len(v), q(v, .5), q(v, .95), q(v, .99))
		}
		b.ReportMetric(float64(q(d[c.name+"/grpc"], .5))/float64(q(d[c.name+"/local"], .5)), c.name+"-grpc/local-p50")
	}
}
