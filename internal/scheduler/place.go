package scheduler

import (
	"context"
	"errors"
	"slices"
	"sort"
)

// Candidate is a node that can run the request, with its score (higher is
// better).
type Candidate struct {
	NodeID string
	Score  float64
}

// Place returns the nodes that can run req, best first (at most
// Config.Candidates of them), or a *NoFitError saying why none can. It
// reads Node.Committed as given; Schedule reads the ledger instead. Cost
// is linear in len(nodes): one pass of checkers and scoring, and a
// bounded best-k selection instead of a sort.
func (s *Scheduler) Place(req *Request, nodes []Node) ([]Candidate, error) {
	return s.place(&evalCtx{s: s, req: req}, nodes)
}

func (s *Scheduler) place(ev *evalCtx, nodes []Node) ([]Candidate, error) {
	if err := ValidateRequest(ev.req); err != nil {
		return nil, err
	}
	var nofit NoFitError
	var closest *Rejection
	best := make([]Candidate, 0, s.cfg.Candidates)
	for i := range nodes {
		n := &nodes[i]
		if ev.committed != nil {
			if _, ok := ev.committed[n.ID]; !ok {
				// Not registered in the ledger: no capacity on record,
				// so not a candidate.
				continue
			}
		}
		nofit.Nodes++
		if r := s.feasible(ev, n); r != nil {
			nofit.add(r)
			if r.Reason == ReasonAccelBusy || r.Reason == ReasonAccelIncompatible {
				if closest == nil || closeness(r) > closeness(closest) || (closeness(r) == closeness(closest) && r.Node < closest.Node) {
					closest = r
				}
			}
			continue
		}
		sc, err := s.score(ev, n)
		if err != nil {
			nofit.add(&Rejection{Node: n.ID, Reason: ReasonPolicy, Err: err})
			continue
		}
		best = insertBest(best, Candidate{NodeID: n.ID, Score: sc}, s.cfg.Candidates)
	}
	if len(best) == 0 {
		nofit.finish(closest)
		return nil, &nofit
	}
	return best, nil
}

func (s *Scheduler) feasible(ev *evalCtx, n *Node) *Rejection {
	for _, c := range s.checkers {
		if r := c(ev, n); r != nil {
			return r
		}
	}
	return nil
}

// better orders candidates: higher score, then lower node ID, so equal
// nodes are chosen the same way every time.
func better(a, b Candidate) bool {
	if a.Score != b.Score {
		return a.Score > b.Score
	}
	return a.NodeID < b.NodeID
}

// insertBest keeps best sorted and at most k long.
func insertBest(best []Candidate, c Candidate, k int) []Candidate {
	if len(best) == k && !better(c, best[k-1]) {
		return best
	}
	i := sort.Search(len(best), func(i int) bool { return better(c, best[i]) })
	if len(best) < k {
		best = append(best, Candidate{})
	}
	copy(best[i+1:], best[i:])
	best[i] = c
	return best
}

// score is the node's rank in 0..1 by strategy, plus the cache and warm
// bonuses and any policy scores.
func (s *Scheduler) score(ev *evalCtx, n *Node) (float64, error) {
	alloc := s.Allocatable(n)
	after := ev.used(n).Add(ev.req.Resources)
	used := (frac(after.MilliCPU, alloc.MilliCPU) + frac(after.MemoryMiB, alloc.MemoryMiB)) / 2
	sc := used
	if s.cfg.Strategy == Spread {
		sc = 1 - used
	}
	if t := ev.req.TemplateID; t != "" {
		if slices.Contains(n.Templates, t) {
			sc += s.cfg.CachedBonus
		}
		if n.WarmStandbys[t] > 0 {
			sc += s.cfg.WarmBonus
		}
	}
	var a *policyActivation
	if len(ev.req.Policies) > 0 {
		a = newActivation(ev, n)
	}
	for _, p := range ev.req.Policies {
		ps, err := p.score(a)
		if err != nil {
			return 0, err
		}
		sc += ps
	}
	return sc, nil
}

func frac(used, capacity int64) float64 {
	if capacity <= 0 {
		return 1
	}
	return min(float64(used)/float64(capacity), 1)
}

// Placement is where a sandbox was reserved.
type Placement struct {
	NodeID string
	// Tried is how many reservations were attempted (1 when the best
	// candidate took it).
	Tried int
}

// maxRounds bounds how often Schedule re-reads the ledger after every
// candidate filled up under it.
const maxRounds = 3

// Schedule places req for sandboxID and reserves it in led: it reads what
// every node has committed from the ledger, ranks the nodes and reserves
// on the best one, trying the next when a concurrent placement took the
// room first. Only nodes registered in the ledger are candidates. On
// failure the error is a *NoFitError (or the ledger's own error).
func (s *Scheduler) Schedule(ctx context.Context, led Ledger, nodes []Node, req *Request, sandboxID string) (Placement, error) {
	tried, contended := 0, 0
	for round := 0; round < maxRounds; round++ {
		committed, err := led.Committed(ctx)
		if err != nil {
			return Placement{}, err
		}
		cands, err := s.place(&evalCtx{s: s, req: req, committed: committed}, nodes)
		if err != nil {
			var nf *NoFitError
			if errors.As(err, &nf) {
				nf.Contended = contended
			}
			return Placement{}, err
		}
		for _, c := range cands {
			tried++
			err := led.Reserve(ctx, sandboxID, c.NodeID, req.Resources)
			if err == nil {
				return Placement{NodeID: c.NodeID, Tried: tried}, nil
			}
			if !errors.Is(err, ErrInsufficient) {
				return Placement{}, err
			}
			contended++
		}
	}
	return Placement{}, &NoFitError{Nodes: len(nodes), Contended: contended}
}
