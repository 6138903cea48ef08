package scheduler_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/cubicle-dev/cubicle/internal/scheduler"
)

func TestPolicyCompileErrorsNameTheExpression(t *testing.T) {
	for _, c := range []struct{ filter, score, want string }{
		{`node.labels["zone"] ==`, "", "Syntax error"},
		{`node.gpus > 1`, "", "undeclared reference"},
		{`node.free_cpu`, "", "evaluates to double, want bool"},
		{"", `node.labels["zone"]`, "evaluates to string, want double or int"},
		{`node.cpu > 1`, `"high"`, "want double or int"},
		{strings.Repeat("1 + ", 600) + "1 > 0", "", "longer than 2048 bytes"},
	} {
		_, err := scheduler.CompilePolicy(c.filter, c.score)
		var pe *scheduler.PolicyError
		if !errors.As(err, &pe) || !errors.Is(err, scheduler.ErrInvalid) {
			t.Fatalf("filter %q score %q: %v, want a PolicyError", c.filter, c.score, err)
		}
		expr := c.filter
		if pe.Field == "score" {
			expr = c.score
		}
		if !strings.Contains(err.Error(), c.want) || (len(expr) < 64 && pe.Expr != expr) {
			t.Fatalf("filter %q score %q: %q (expr %q), want it to name the expression and say %q", c.filter, c.score, err, pe.Expr, c.want)
		}
	}
	if _, err := scheduler.CompilePolicy("", ""); !errors.Is(err, scheduler.ErrInvalid) {
		t.Fatalf("empty policy: %v", err)
	}
}

func TestPolicyFiltersAndScoresOverLabelsAndCapacity(t *testing.T) {
	s := newSched(t, scheduler.Config{})
	a, b, c := node("a", 8, 16384), node("b", 8, 16384), node("c", 32, 65536)
	a.Labels = map[string]string{"zone": "eu-1", "disk": "ssd"}
	b.Labels = map[string]string{"zone": "eu-1", "disk": "hdd"}
	c.Labels = map[string]string{"zone": "us-1", "disk": "ssd"}
	nodes := []scheduler.Node{a, b, c}

	team, err := scheduler.CompilePolicy(`node.labels["zone"].startsWith("eu-") && node.free_memory_mib >= request.memory_mib * 2`, "")
	if err != nil {
		t.Fatal(err)
	}
	tpl, err := scheduler.CompilePolicy("", `node.labels["disk"] == "ssd" ? 10.0 : 0.0`)
	if err != nil {
		t.Fatal(err)
	}
	req := small()
	req.Policies = []*scheduler.Policy{team, tpl}
	cands, err := s.Place(req, nodes)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(ids(cands), ","); got != "a,b" {
		t.Fatalf("candidates %s, want the eu nodes with the ssd one first", got)
	}

	// Filtering every node out is a no-fit naming the policy.
	only, _ := scheduler.CompilePolicy(`"gpu" in node.labels`, "")
	req.Policies = []*scheduler.Policy{only}
	_, err = s.Place(req, nodes)
	nf := noFit(t, err)
	if nf.Classes[scheduler.ReasonPolicy].Nodes != 3 || !strings.Contains(err.Error(), `3 nodes are refused by placement policy`) {
		t.Fatalf("%v", err)
	}
}

// A hostile expression is refused when compiled: CEL's worst-case cost
// estimate is above the limit.
func TestPolicyCostEstimateRefusesHostileExpressions(t *testing.T) {
	for _, hostile := range []string{
		`[1,2,3,4,5,6,7,8,9,10].all(a, [1,2,3,4,5,6,7,8,9,10].all(b, [1,2,3,4,5,6,7,8,9,10].all(c, [1,2,3,4,5,6,7,8,9,10].all(d, a+b+c+d >= 0))))`,
		`node.labels.all(k, node.labels.all(j, k != j || k == j))`,
	} {
		_, err := scheduler.CompilePolicy(hostile, "")
		var pe *scheduler.PolicyError
		if !errors.As(err, &pe) || !strings.Contains(pe.Message, "worst-case cost") {
			t.Fatalf("%s: %v, want a PolicyError on its cost", hostile, err)
		}
	}
}

// What the estimate cannot see (a node reporting far more labels than
// the estimate assumes) runs into CEL's runtime cost limit: that node is
// refused with an evaluation error and placement goes on.
func TestPolicyRuntimeCostLimitStopsEvaluation(t *testing.T) {
	p, err := scheduler.CompilePolicy(`node.labels.exists(k, k.startsWith("gpu."))`, "")
	if err != nil {
		t.Fatal(err)
	}
	huge, ok := node("a-huge", 8, 16384), node("b-ok", 8, 16384)
	huge.Labels = map[string]string{}
	for i := 0; i < 5000; i++ {
		huge.Labels[fmt.Sprintf("l%04d", i)] = "x"
	}
	ok.Labels = map[string]string{"zone": "z1", "gpu.model": "h100"}
	req := small()
	req.Policies = []*scheduler.Policy{p}
	s := newSched(t, scheduler.Config{})
	cands, err := s.Place(req, []scheduler.Node{huge, ok})
	if err != nil || strings.Join(ids(cands), ",") != "b-ok" {
		t.Fatalf("%v %v, want only b-ok", ids(cands), err)
	}
	_, err = s.Place(req, []scheduler.Node{huge})
	nf := noFit(t, err)
	c := nf.Classes[scheduler.ReasonPolicy]
	if c == nil || !errors.Is(c.First.Err, scheduler.ErrPolicyEval) || !strings.Contains(c.First.Err.Error(), "cost limit exceeded") {
		t.Fatalf("node with 5000 labels: %v", err)
	}
	// Cheap expressions of the same shapes evaluate.
	cheap, err := scheduler.CompilePolicy(`[1,2,3].all(a, a > 0) && node.warm == 0 && !node.cached`, `request.cpu + double(node.accelerators)`)
	if err != nil {
		t.Fatal(err)
	}
	req.Policies = []*scheduler.Policy{cheap}
	if _, err := s.Place(req, []scheduler.Node{ok}); err != nil {
		t.Fatal(err)
	}
}

// A runtime error in one node's evaluation (a label it lacks) refuses that
// node only.
func TestPolicyEvaluationErrorRefusesOnlyThatNode(t *testing.T) {
	p, err := scheduler.CompilePolicy(`node.labels["rack"] != "r9"`, "")
	if err != nil {
		t.Fatal(err)
	}
	a, b := node("a", 8, 16384), node("b", 8, 16384)
	b.Labels = map[string]string{"rack": "r1"}
	req := small()
	req.Policies = []*scheduler.Policy{p}
	cands, err := newSched(t, scheduler.Config{}).Place(req, []scheduler.Node{a, b})
	if err != nil || strings.Join(ids(cands), ",") != "b" {
		t.Fatalf("%v %v, want only b (a has no rack label)", ids(cands), err)
	}
}
