package scheduler

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"sync"

	"github.com/google/cel-go/cel"
	celchecker "github.com/google/cel-go/checker"
	"github.com/google/cel-go/common/types"
	"github.com/google/cel-go/common/types/ref"
	"github.com/google/cel-go/interpreter"
)

// Limits on placement policies. Expressions come from API keys, which are
// hostile by assumption: one must not stall placement for everyone.
const (
	// MaxPolicyLength bounds an expression's source, in bytes.
	MaxPolicyLength = 2048
	// PolicyCostLimit bounds one evaluation (one node), in CEL cost units.
	// An expression whose worst case CEL estimates above it is refused when
	// compiled; at runtime CEL's cost limit stops an evaluation that gets
	// there anyway and the node is refused for it (BenchmarkPolicyPerNode:
	// a full scan of 64 labels about 55 µs per node, a scan cut off by the
	// limit about 0.3 ms, on the 2-core development machine).
	PolicyCostLimit = 1000
	// MaxNodeLabels and MaxLabelLength are the sizes the cost estimate
	// assumes for node labels (nodes report at most this many, this long).
	MaxNodeLabels  = 64
	MaxLabelLength = 256
)

// PolicyError is a policy expression that does not compile or type-check.
// It matches ErrInvalid.
type PolicyError struct {
	Field   string // "filter" or "score"
	Expr    string
	Message string // CEL's message
}

func (e *PolicyError) Error() string {
	return fmt.Sprintf("placement policy %s %q: %s", e.Field, e.Expr, e.Message)
}

// Unwrap makes every PolicyError an ErrInvalid.
func (e *PolicyError) Unwrap() error { return ErrInvalid }

// Policy is a team's or template's placement extension: an optional CEL
// filter (bool: the node may run the sandbox) and score (a number added
// to the node's score), over these variables:
//
//	node.id string, node.labels map(string, string),
//	node.cpu double, node.memory_mib int, node.disk_mib int       (allocatable)
//	node.free_cpu double, node.free_memory_mib int, node.free_disk_mib int,
//	node.accelerators int (allocatable devices), node.cached bool (the
//	template's image is on the node), node.warm int (idle standbys of it),
//	request.team string, request.template string, request.cpu double,
//	request.memory_mib int, request.disk_mib int
//
// Compile it once when set (CompilePolicy) and keep it; it is safe for
// concurrent use.
type Policy struct {
	Filter, Score       string
	filterPrg, scorePrg program
}

// program is one compiled expression, twice: fast runs without CEL's
// runtime cost tracking and is used only on a node within the sizes the
// static estimate assumed (withinEstimate), where the estimate, at most
// PolicyCostLimit, already bounds the cost; limited tracks cost and stops
// at PolicyCostLimit, for any node beyond those sizes. The tracking is
// most of an evaluation's cost (BenchmarkPlaceSimplePolicy), so the
// common case skips it without giving up the bound.
type program struct {
	fast, limited cel.Program
}

func (p program) set() bool { return p.fast != nil }

var policyVars = []struct {
	name string
	typ  *cel.Type
}{
	{"node.id", cel.StringType},
	{"node.labels", cel.MapType(cel.StringType, cel.StringType)},
	{"node.cpu", cel.DoubleType},
	{"node.memory_mib", cel.IntType},
	{"node.disk_mib", cel.IntType},
	{"node.free_cpu", cel.DoubleType},
	{"node.free_memory_mib", cel.IntType},
	{"node.free_disk_mib", cel.IntType},
	{"node.accelerators", cel.IntType},
	{"node.cached", cel.BoolType},
	{"node.warm", cel.IntType},
	{"request.team", cel.StringType},
	{"request.template", cel.StringType},
	{"request.cpu", cel.DoubleType},
	{"request.memory_mib", cel.IntType},
	{"request.disk_mib", cel.IntType},
}

var policyEnv = sync.OnceValues(func() (*cel.Env, error) {
	// Cross-type numeric comparisons let "node.cpu > 2" check without
	// writing 2.0 (CEL has no implicit conversions otherwise).
	opts := []cel.EnvOption{cel.ParserExpressionSizeLimit(MaxPolicyLength), cel.ParserRecursionLimit(64), cel.CrossTypeNumericComparisons(true)}
	for _, v := range policyVars {
		opts = append(opts, cel.Variable(v.name, v.typ))
	}
	return cel.NewEnv(opts...)
})

// CompilePolicy parses and type-checks filter and score (either may be
// empty, not both). A bad expression is a *PolicyError naming it.
func CompilePolicy(filter, score string) (*Policy, error) {
	if filter == "" && score == "" {
		return nil, fmt.Errorf("%w: a placement policy needs a filter or a score expression", ErrInvalid)
	}
	env, err := policyEnv()
	if err != nil {
		return nil, err
	}
	p := &Policy{Filter: filter, Score: score}
	if filter != "" {
		if p.filterPrg, err = compile(env, "filter", filter, cel.BoolType); err != nil {
			return nil, err
		}
	}
	if score != "" {
		if p.scorePrg, err = compile(env, "score", score, cel.DoubleType, cel.IntType); err != nil {
			return nil, err
		}
	}
	return p, nil
}

func compile(env *cel.Env, field, expr string, want ...*cel.Type) (program, error) {
	if len(expr) > MaxPolicyLength {
		return program{}, &PolicyError{Field: field, Expr: expr[:64] + "…", Message: fmt.Sprintf("longer than %d bytes", MaxPolicyLength)}
	}
	ast, iss := env.Compile(expr)
	if iss.Err() != nil {
		return program{}, &PolicyError{Field: field, Expr: expr, Message: iss.Err().Error()}
	}
	if !slices.ContainsFunc(want, func(t *cel.Type) bool { return ast.OutputType().IsExactType(t) }) {
		return program{}, &PolicyError{Field: field, Expr: expr, Message: fmt.Sprintf("evaluates to %s, want %s", ast.OutputType(), typeNames(want))}
	}
	est, err := env.EstimateCost(ast, policyEstimator{})
	if err != nil {
		return program{}, &PolicyError{Field: field, Expr: expr, Message: "cost estimate: " + err.Error()}
	}
	if est.Max > PolicyCostLimit {
		return program{}, &PolicyError{Field: field, Expr: expr, Message: fmt.Sprintf("worst-case cost %s exceeds the limit of %d", costString(est.Max), PolicyCostLimit)}
	}
	limited, err := env.Program(ast, cel.CostLimit(PolicyCostLimit))
	if err != nil {
		return program{}, &PolicyError{Field: field, Expr: expr, Message: err.Error()}
	}
	fast, err := env.Program(ast)
	if err != nil {
		return program{}, &PolicyError{Field: field, Expr: expr, Message: err.Error()}
	}
	return program{fast: fast, limited: limited}, nil
}

// withinEstimate reports whether every size the cost estimate assumed
// holds for this node and request: at most MaxNodeLabels labels, and every
// string a policy can read at most MaxLabelLength bytes. Then the static
// estimate bounds the evaluation and the untracked program may run.
func withinEstimate(req *Request, n *Node) bool {
	if len(n.Labels) > MaxNodeLabels || len(n.ID) > MaxLabelLength || len(req.TeamID) > MaxLabelLength || len(req.TemplateID) > MaxLabelLength {
		return false
	}
	for k, v := range n.Labels {
		if len(k) > MaxLabelLength || len(v) > MaxLabelLength {
			return false
		}
	}
	return true
}

// eval runs prg for n with the program its sizes allow.
func (prg program) eval(a *policyActivation) (ref.Val, error) {
	p := prg.limited
	if a.within {
		p = prg.fast
	}
	out, _, err := p.Eval(a)
	return out, err
}

func costString(c uint64) string {
	if c == math.MaxUint64 {
		return "unbounded"
	}
	return strconv.FormatUint(c, 10)
}

// policyEstimator gives CEL's static cost estimate the sizes it cannot
// know: label maps and strings. Without them any comprehension over
// labels would estimate as unbounded.
type policyEstimator struct{}

func (policyEstimator) EstimateSize(el celchecker.AstNode) *celchecker.SizeEstimate {
	path := el.Path()
	if len(path) == 0 {
		return nil
	}
	if path[0] == "node.labels" && len(path) == 1 {
		return &celchecker.SizeEstimate{Min: 0, Max: MaxNodeLabels}
	}
	if el.Type().IsExactType(cel.StringType) {
		return &celchecker.SizeEstimate{Min: 0, Max: MaxLabelLength}
	}
	return nil
}

func (policyEstimator) EstimateCallCost(function, overloadID string, target *celchecker.AstNode, args []celchecker.AstNode) *celchecker.CallEstimate {
	return nil
}

func typeNames(ts []*cel.Type) string {
	s := ""
	for i, t := range ts {
		if i > 0 {
			s += " or "
		}
		s += t.String()
	}
	return s
}

// ErrPolicyEval: a policy failed at evaluation (cost limit, division by
// zero, missing label...). The node is refused; placement goes on.
var ErrPolicyEval = errors.New("placement policy evaluation failed")

func (p *Policy) filter(a *policyActivation) (bool, error) {
	if !p.filterPrg.set() {
		return true, nil
	}
	out, err := p.filterPrg.eval(a)
	if err != nil {
		return false, fmt.Errorf("%w: filter %q: %v", ErrPolicyEval, p.Filter, err)
	}
	b, ok := out.Value().(bool)
	if !ok {
		return false, fmt.Errorf("%w: filter %q returned %v", ErrPolicyEval, p.Filter, out)
	}
	return b, nil
}

func (p *Policy) score(a *policyActivation) (float64, error) {
	if !p.scorePrg.set() {
		return 0, nil
	}
	out, err := p.scorePrg.eval(a)
	if err != nil {
		return 0, fmt.Errorf("%w: score %q: %v", ErrPolicyEval, p.Score, err)
	}
	var f float64
	switch v := out.(type) {
	case types.Double:
		f = float64(v)
	case types.Int:
		f = float64(v)
	default:
		return 0, fmt.Errorf("%w: score %q returned %v", ErrPolicyEval, p.Score, out)
	}
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return 0, fmt.Errorf("%w: score %q is %v", ErrPolicyEval, p.Score, f)
	}
	return f, nil
}

// policyActivation resolves the variables from the node and request
// without building a map per node. One serves every policy of a node.
type policyActivation struct {
	ev     *evalCtx
	n      *Node
	within bool // withinEstimate(req, n)
}

func newActivation(ev *evalCtx, n *Node) *policyActivation {
	return &policyActivation{ev: ev, n: n, within: withinEstimate(ev.req, n)}
}

var _ interpreter.Activation = (*policyActivation)(nil)

func (a *policyActivation) Parent() interpreter.Activation { return nil }

func (a *policyActivation) ResolveName(name string) (any, bool) {
	// CEL values, not Go ones, so the interpreter need not convert them
	// through its type registry on every evaluation.
	n, req, s := a.n, a.ev.req, a.ev.s
	switch name {
	case "node.id":
		return types.String(n.ID), true
	case "node.labels":
		return types.NewStringStringMap(types.DefaultTypeAdapter, n.Labels), true
	case "node.cpu":
		return types.Double(float64(s.Allocatable(n).MilliCPU) / 1000), true
	case "node.memory_mib":
		return types.Int(n.Capacity.MemoryMiB), true
	case "node.disk_mib":
		return types.Int(n.Capacity.DiskMiB), true
	case "node.free_cpu":
		return types.Double(float64(s.Allocatable(n).MilliCPU-a.ev.used(n).MilliCPU) / 1000), true
	case "node.free_memory_mib":
		return types.Int(n.Capacity.MemoryMiB - a.ev.used(n).MemoryMiB), true
	case "node.free_disk_mib":
		return types.Int(n.Capacity.DiskMiB - a.ev.used(n).DiskMiB), true
	case "node.accelerators":
		c := int64(0)
		for i := range n.Accelerators {
			if n.Accelerators[i].State.Schedulable() {
				c++
			}
		}
		return types.Int(c), true
	case "node.cached":
		return types.Bool(slices.Contains(n.Templates, req.TemplateID)), true
	case "node.warm":
		return types.Int(n.WarmStandbys[req.TemplateID]), true
	case "request.team":
		return types.String(req.TeamID), true
	case "request.template":
		return types.String(req.TemplateID), true
	case "request.cpu":
		return types.Double(float64(req.Resources.MilliCPU) / 1000), true
	case "request.memory_mib":
		return types.Int(req.Resources.MemoryMiB), true
	case "request.disk_mib":
		return types.Int(req.Resources.DiskMiB), true
	}
	return nil, false
}
