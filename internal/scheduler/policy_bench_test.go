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
