package scheduler_test

import (
	"fmt"
	"testing"

	"github.com/cubicle-dev/cubicle/internal/scheduler"
)

// BenchmarkPolicyPerNode is what a policy adds per node: a label scan
// over MaxNodeLabels labels (what the cost estimate admits), and the same
// scan stopped by the runtime cost limit on a node reporting 5,000.
func BenchmarkPolicyPerNode(b *testing.B) {
	p, err := scheduler.CompilePolicy(`node.labels.exists(k, k.startsWith("gpu."))`, "")
	if err != nil {
		b.Fatal(err)
	}
	s, _ := scheduler.New(scheduler.Config{})
	for _, labels := range []int{scheduler.MaxNodeLabels, 5000} {
		b.Run(fmt.Sprintf("labels=%d", labels), func(b *testing.B) {
			n := node("a", 8, 16384)
			n.Labels = map[string]string{}
			for i := 0; i < labels; i++ {
				n.Labels[fmt.Sprintf("l%04d", i)] = "x"
			}
			req := small()
			req.Policies = []*scheduler.Policy{p}
			nodes := []scheduler.Node{n}
			for i := 0; i < b.N; i++ {
				if _, err := s.Place(req, nodes); err == nil {
					b.Fatal("the filter passed a node without gpu labels")
				}
			}
		})
	}
}

// BenchmarkPlaceSimplePolicy is one Place over 1,000 nodes with and
// without the kind of policy operators write (a label filter and a score
// over free capacity), so the policy's share of a decision is measured
// against a baseline from the same run.
func BenchmarkPlaceSimplePolicy(b *testing.B) {
	p, err := scheduler.CompilePolicy(`node.labels["zone"] != "z2"`, "node.free_cpu / 32.0")
	if err != nil {
		b.Fatal(err)
	}
	s, _ := scheduler.New(scheduler.Config{})
	nodes := make([]scheduler.Node, 1000)
	for i := range nodes {
		nodes[i] = node(fmt.Sprintf("n%04d", i), 16, 32768)
		nodes[i].Labels = map[string]string{"zone": fmt.Sprintf("z%d", i%3), "disk": "ssd"}
	}
	for _, pols := range [][]*scheduler.Policy{nil, {p}} {
		b.Run(fmt.Sprintf("policies=%d", len(pols)), func(b *testing.B) {
			req := small()
			req.Policies = pols
			for i := 0; i < b.N; i++ {
				if _, err := s.Place(req, nodes); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
