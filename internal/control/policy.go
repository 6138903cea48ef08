package control

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"unicode"

	"github.com/cubicle-dev/cubicle/internal/scheduler"
	"github.com/cubicle-dev/cubicle/internal/store"
	"github.com/cubicle-dev/cubicle/internal/template"
)

// MaxPolicyTarget bounds a policy's target (a team or template ID).
const MaxPolicyTarget = 256

// ValidatePlacementPolicy checks p before it is stored: a known scope, a
// target that is an existing team (a template's need not exist yet:
// built-in images have no row, and a policy may be set before the
// template is built), and expressions that compile and pass the cost
// limit. A bad expression's error is the compiler's *scheduler.PolicyError
// (matches scheduler.ErrInvalid); the rest match ErrInvalid. The API and
// the CLI both call it, so what one accepts the other does.
func ValidatePlacementPolicy(ctx context.Context, st store.Store, p *store.PlacementPolicy) error {
	if !p.Scope.Valid() {
		return invalid("placement policy scope %q: want %q or %q", p.Scope, store.PolicyTeam, store.PolicyTemplate)
	}
	if p.Target == "" || len(p.Target) > MaxPolicyTarget {
		return invalid("placement policy target: want a %s ID of 1 to %d bytes", p.Scope, MaxPolicyTarget)
	}
	for _, r := range p.Target {
		if !unicode.IsPrint(r) || unicode.IsSpace(r) {
			return invalid("placement policy target %q: control or space characters", p.Target)
		}
	}
	if p.Scope == store.PolicyTeam {
		if _, err := st.GetTeam(ctx, p.Target); errors.Is(err, store.ErrNotFound) {
			return invalid("placement policy target: no team %q (`cubicle team list` shows the teams)", p.Target)
		} else if err != nil {
			return err
		}
	}
	_, err := scheduler.CompilePolicy(p.Filter, p.Score)
	return err
}

// policyCache keeps compiled policies by their text, so a create does not
// recompile its team's and template's policies. Rows are admin-written and
// few; the cache is emptied when it reaches its bound rather than tracking
// use.
type policyCache struct {
	mu sync.Mutex
	m  map[[2]string]*scheduler.Policy
}

const policyCacheMax = 1024

func (c *policyCache) compile(filter, score string) (*scheduler.Policy, error) {
	k := [2]string{filter, score}
	c.mu.Lock()
	p, ok := c.m[k]
	c.mu.Unlock()
	if ok {
		return p, nil
	}
	p, err := scheduler.CompilePolicy(filter, score)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	if c.m == nil || len(c.m) >= policyCacheMax {
		c.m = map[[2]string]*scheduler.Policy{}
	}
	c.m[k] = p
	c.mu.Unlock()
	return p, nil
}

// placementPolicies returns the compiled policies that apply to a create
// by teamID from templateID: the team's, then the template's. place
// passes them to the scheduler, which requires every filter and adds
// every score.
func (m *Manager) placementPolicies(ctx context.Context, teamID, templateID string) ([]*scheduler.Policy, error) {
	rows, err := m.store.PlacementPoliciesFor(ctx, teamID, templateID)
	if err != nil {
		return nil, fmt.Errorf("placement policies: %w", err)
	}
	var out []*scheduler.Policy
	for _, r := range rows {
		p, err := m.policies.compile(r.Filter, r.Score)
		if err != nil {
			// Validated when written; failing now means the policy
			// language changed under a stored row. The operator must
			// fix it, and the create says whose it is.
			return nil, fmt.Errorf("the %s %s's stored placement policy no longer compiles (fix it with `cubicle scheduler policy set`): %w", r.Scope, r.Target, err)
		}
		out = append(out, p)
	}
	return out, nil
}

// fillStandbys sets, on each node, the idle warm-pool standbys of tpl it
// holds (the scheduler's warm score, and policies' node.warm). A node with
// a standby of tpl has its image, so it also counts as cached; nodes
// report the rest of their image cache themselves. Only pooled templates
// cost a read.
func (m *Manager) fillStandbys(ctx context.Context, tpl template.Template, nodes []scheduler.Node) error {
	if tpl.PoolSize == 0 || tpl.ID == "" {
		return nil
	}
	rows, err := m.store.ListSandboxes(ctx, store.SandboxFilter{States: []store.SandboxState{store.StateRunning},
		Metadata: map[string]string{PoolKey: tpl.ID}})
	if err != nil {
		return fmt.Errorf("warm standbys: %w", err)
	}
	count := map[string]int{}
	for _, sb := range rows {
		if tpl.BuildID == "" || sb.Metadata[PoolBuildKey] == tpl.BuildID {
			count[sb.Node]++
		}
	}
	for i := range nodes {
		n := &nodes[i]
		c := count[n.ID]
		if c == 0 {
			continue
		}
		if n.WarmStandbys == nil {
			n.WarmStandbys = map[string]int{}
		}
		n.WarmStandbys[tpl.ID] = c
		if !slices.Contains(n.Templates, tpl.ID) {
			n.Templates = append(n.Templates, tpl.ID)
		}
	}
	return nil
}
