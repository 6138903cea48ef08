package scheduler

import (
	"fmt"
	"strings"
	"testing"
)

// The untracked program runs only where the static estimate holds, so the
// estimate must bound the real cost there: on a node at every assumed
// maximum (MaxNodeLabels labels, keys and values MaxLabelLength long),
// the cost-tracked program of each accepted expression finishes under
// PolicyCostLimit. The expressions are the costliest shapes the estimate
// admits: label scans, string functions over labels, list building.
func TestEstimateBoundsActualCostAtTheAssumedSizes(t *testing.T) {
	long := func(i int, c string) string { return fmt.Sprintf("%03d", i) + strings.Repeat(c, MaxLabelLength-3) }
	n := &Node{ID: strings.Repeat("n", MaxLabelLength), Labels: map[string]string{},
		Capacity: Resources{MilliCPU: 8000, MemoryMiB: 16384, DiskMiB: 1 << 20}}
	for i := range MaxNodeLabels {
		n.Labels[long(i, "k")] = long(i, "v")
	}
	req := &Request{TeamID: strings.Repeat("t", MaxLabelLength), TemplateID: strings.Repeat("p", MaxLabelLength)}
	if !withinEstimate(req, n) {
		t.Fatal("the maximal node is not within the estimate")
	}
	s, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	a := newActivation(&evalCtx{s: s, req: req}, n)
	accepted := 0
	for _, f := range []string{
		`node.labels.exists(k, k.startsWith("gpu."))`,
		`node.labels.all(k, node.labels[k].endsWith("v"))`,
		`node.labels.exists(k, k.contains(request.team))`,
		`node.labels.exists(k, node.labels[k] == node.id)`,
		`size(node.labels.filter(k, k.startsWith("0"))) > 3`,
		`node.labels.exists(k, k.matches("^[0-9]+k+$"))`,
		`node.id.startsWith(request.template) || request.team.endsWith(node.id)`,
		`node.labels.map(k, size(k)).exists(x, x > 1)`,
	} {
		p, err := CompilePolicy(f, "")
		if err != nil {
			// Refused as too costly: nothing to check.
			continue
		}
		accepted++
		t.Logf("accepted: %s", f)
		if _, _, err := p.filterPrg.limited.Eval(a); err != nil {
			t.Errorf("%s: accepted by the estimate, but at the assumed sizes: %v", f, err)
		}
	}
	if accepted < 4 {
		t.Fatalf("only %d expressions accepted: the check proves little", accepted)
	}
}
