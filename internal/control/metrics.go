package control

import (
	"context"
	"sync"
	"time"

	"github.com/cubicle-dev/cubicle/internal/node"
	"github.com/cubicle-dev/cubicle/internal/store"
)

const (
	sampleInterval = 5 * time.Second
	sampleKeep     = 720 // one hour at 5 s
	// sampleTimeout bounds one metrics call; sampleParallel how many run at
	// once, so one pass is bounded even with many slow agents.
	sampleTimeout  = 2 * time.Second
	sampleParallel = 8
)

// sampler keeps a bounded in-memory history of metric samples per sandbox.
// History is telemetry, not state: losing it on restart is acceptable.
type sampler struct {
	mu   sync.Mutex
	hist map[string][]node.Stats
}

func (s *sampler) add(id string, st node.Stats) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.hist == nil {
		s.hist = map[string][]node.Stats{}
	}
	h := append(s.hist[id], st)
	if len(h) > sampleKeep {
		h = h[len(h)-sampleKeep:]
	}
	s.hist[id] = h
}

func (s *sampler) get(id string) []node.Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]node.Stats(nil), s.hist[id]...)
}

func (s *sampler) forget(keep map[string]bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for id := range s.hist {
		if !keep[id] {
			delete(s.hist, id)
		}
	}
}

// sampleAll records a metrics sample of every running sandbox (Run's
// sampler loop, every sampleEvery).
func (m *Manager) sampleAll(ctx context.Context) {
	rows, err := m.store.ListSandboxes(ctx, store.SandboxFilter{States: []store.SandboxState{store.StateRunning}})
	if err != nil {
		return
	}
	keep := map[string]bool{}
	sem := make(chan struct{}, sampleParallel)
	var wg sync.WaitGroup
	for _, sb := range rows {
		keep[sb.ID] = true
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			cctx, cancel := context.WithTimeout(ctx, sampleTimeout)
			defer cancel()
			nd, err := m.nodeOf(cctx, sb)
			if err != nil {
				return
			}
			if st, err := nd.Stats(cctx, sb.ID, sb.EnvdToken); err == nil {
				st.CPUCount = sb.CPUCount
				m.samples.add(sb.ID, st)
			}
		}()
	}
	wg.Wait()
	m.samples.forget(keep)
}

// MetricsHistory returns the recorded samples plus a fresh one when the
// sandbox is running.
func (m *Manager) MetricsHistory(ctx context.Context, id string) ([]node.Stats, error) {
	sb, err := m.Get(ctx, id)
	if err != nil {
		return nil, err
	}
	if sb.State == store.StateRunning {
		nd, err := m.nodeOf(ctx, sb)
		if err != nil {
			return nil, err
		}
		if st, err := nd.Stats(ctx, id, sb.EnvdToken); err == nil {
			st.CPUCount = sb.CPUCount
			m.samples.add(id, st)
		}
	}
	return m.samples.get(id), nil
}
