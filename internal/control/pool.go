package control

// Warm pools: per template, a few pre-created idle sandboxes ("standbys") so
// a create from a pooled template is a claim, not a boot. Standbys are
// ordinary sandbox rows marked with pool metadata, so they survive a restart
// like any sandbox (Recover re-adopts them and the reconciler fixes counts).

import (
	"context"
	"errors"
	"fmt"
	goruntime "runtime"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/cubicle-dev/cubicle/internal/diskbudget"
	"github.com/cubicle-dev/cubicle/internal/network"
	"github.com/cubicle-dev/cubicle/internal/phase"
	"github.com/cubicle-dev/cubicle/internal/store"
	"github.com/cubicle-dev/cubicle/internal/template"
)

// Pool metadata keys (see store.PoolMetadataKey).
const (
	PoolKey      = store.PoolMetadataKey
	PoolBuildKey = store.PoolBuildMetadataKey
)

const (
	poolInterval = time.Second
	// standbyTimeout is a standby's expiry; the reconciler pushes it out
	// again well before it passes, so only an abandoned pool expires.
	standbyTimeout = 24 * time.Hour
	poolMaxPages   = 100 // bounds the template listing (500 a page)
	claimTimeout   = 30 * time.Second
	// A pool's demand is the most creates of its template (claims and
	// boots) started within any demandBucket of the last demandWindow:
	// the burst the pool should have absorbed.
	demandBucket  = 10 * time.Second
	demandWindow  = 10 * time.Minute
	demandMaxRows = 5000
)

// IsStandby reports whether sb is an unclaimed warm-pool standby.
func IsStandby(sb *store.Sandbox) bool {
	_, ok := sb.Metadata[PoolKey]
	return ok
}

type poolMetrics struct {
	standbys *prometheus.GaugeVec
	target   *prometheus.GaugeVec
	claims   *prometheus.CounterVec
}

func newPoolMetrics(reg prometheus.Registerer) *poolMetrics {
	m := &poolMetrics{
		standbys: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "cubicle_pool_standbys", Help: "Unclaimed warm-pool standbys on the template's current build.",
		}, []string{"template"}),
		target: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "cubicle_pool_target", Help: "Standbys the pool refills to: its set size, grown to recent demand within serve --pool-memory-mb.",
		}, []string{"template"}),
		claims: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "cubicle_pool_claims_total", Help: "Creates from a pooled template: hit = served by a standby, miss = booted.",
		}, []string{"result"}),
	}
	if reg != nil {
		reg.MustRegister(m.standbys, m.target, m.claims)
	}
	return m
}

// PoolTrigger asks the pool reconciler to run now; it has the catalog's
// ReadyHook signature (a new ready build or pool size).
func (m *Manager) PoolTrigger(string) {
	select {
	case m.poolKick <- struct{}{}:
	default: // a run is already pending
	}
}

// Standbys lists the unclaimed, running standbys of templateID on buildID
// (oldest first): those a claim can hand out.
func (m *Manager) Standbys(ctx context.Context, templateID, buildID string) ([]string, error) {
	rows, err := m.store.ListSandboxes(ctx, store.SandboxFilter{States: []store.SandboxState{store.StateRunning},
		Metadata: map[string]string{PoolKey: templateID}, Ascending: true})
	if err != nil {
		return nil, err
	}
	ids := []string{}
	for _, sb := range rows {
		if buildID != "" && sb.Metadata[PoolBuildKey] == buildID {
			ids = append(ids, sb.ID)
		}
	}
	return ids, nil
}

// claim hands a standby of tpl's current build to the request, on one of
// onNodes when that is not nil. ok is false when there was none or it
// could not be applied; the caller then boots.
func (m *Manager) claim(ctx context.Context, o CreateOptions, tpl template.Template, onNodes []string) (_ *store.Sandbox, ok bool) {
	defer func() {
		result := "miss"
		if ok {
			result = "hit"
		}
		m.pool.claims.WithLabelValues(result).Inc()
	}()
	// Traced like a boot (the create's Server-Timing and histogram): the
	// store's claim, re-read and update, the sandbox's lock, the agent's
	// re-init.
	endStore := phase.Start(ctx, phase.Store)
	got, err := m.store.ClaimPoolSandbox(ctx, tpl.ID, tpl.BuildID, o.TeamID, onNodes)
	endStore()
	if err != nil {
		// At its quota, the team's boot is refused with the quota error.
		if !errors.Is(err, store.ErrNotFound) && !errors.Is(err, store.ErrQuota) {
			m.log.Warn("warm-pool claim", "template", tpl.ID, "err", err)
		}
		return nil, false
	}
	m.PoolTrigger(tpl.ID) // refill
	endWait := phase.Start(ctx, phase.LockWait)
	unlock, err := m.lock(ctx, got.ID)
	endWait()
	if err != nil {
		// The standby stays claimed-running; the pool reconciler's
		// checks retire what no one holds.
		m.log.Warn("warm-pool claim", "sandbox", got.ID, "err", err)
		return nil, false
	}
	defer unlock()
	// The reconciler may have retired it between the store claim and the
	// lock: it then is killed and the request boots instead.
	endStore = phase.Start(ctx, phase.Store)
	sb, err := m.store.GetSandbox(ctx, got.ID)
	endStore()
	if err != nil || sb.State != store.StateRunning {
		return nil, false
	}
	nctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), claimTimeout)
	defer cancel()
	fail := func(step string, err error) (*store.Sandbox, bool) {
		m.log.Warn("warm-pool claim failed; booting instead", "sandbox", sb.ID, "step", step, "err", err)
		derr := m.deleteOn(nctx, sb)
		m.markKilled(nctx, sb, fmt.Sprintf("warm-pool claim failed at %s: %v", step, err), derr)
		return nil, false
	}
	oldToken := sb.EnvdToken
	oldPolicy := policyOf(sb.Network)
	now := time.Now().UTC()
	sb.TemplateID, sb.Alias = tpl.ID, tpl.Alias
	sb.Metadata, sb.EnvVars = o.Metadata, o.EnvVars
	// Fresh tokens: nothing about the standby was ever handed out, but the
	// request must not share secrets with whatever the pool did before.
	sb.EnvdToken, sb.TrafficToken = token(16), token(16)
	sb.Network, sb.AutoPause, sb.AutoResume, sb.APIKeyID = o.Network, o.AutoPause, o.AutoResume, o.APIKeyID
	sb.PauseMemory = !o.PauseFilesystem
	sb.StartedAt, sb.EndAt = now, now.Add(o.Timeout)
	req, err := m.nodeRequest(sb, nil)
	if err != nil {
		return fail("node", err)
	}
	req.DefaultWorkdir = tpl.Workdir
	nd, err := m.nodeOf(nctx, sb)
	if err != nil {
		return fail("node", err)
	}
	endInit := phase.Start(ctx, phase.Init)
	err = nd.Reinit(nctx, sb.ID, req, oldToken)
	endInit()
	if err != nil {
		return fail("agent re-init", err)
	}
	if p := m.policyFor(o.TeamID, o.Network); !samePolicy(p, oldPolicy) {
		if err := nd.UpdatePolicy(nctx, sb.ID, p); err != nil {
			return fail("network policy", err)
		}
	}
	endStore = phase.Start(ctx, phase.Store)
	defer endStore()
	if err := m.store.UpdateSandbox(nctx, sb); err != nil {
		return fail("store update", err)
	}
	m.event(ctx, sb.ID, "claimed", "info", "warm-pool standby of template %s (build %s) claimed", tpl.ID, tpl.BuildID)
	return sb, true
}

func samePolicy(a, b network.Policy) bool {
	return a.AllowInternet == b.AllowInternet && slices.Equal(a.AllowOut, b.AllowOut) && slices.Equal(a.DenyOut, b.DenyOut) &&
		len(a.Rules) == 0 && len(b.Rules) == 0 && a.Upstream == nil && b.Upstream == nil && a.DNSServers == nil && b.DNSServers == nil
}

func (m *Manager) standbyTimeout() time.Duration { return min(standbyTimeout, m.cfg.MaxTimeout) }

type poolTarget struct {
	size int               // what the pool fills to: set, or grown to demand
	set  int               // Template.PoolSize
	team string            // the template's team: its standbys count against it
	tpl  template.Template // BuildID "" = no ready build: keep no standbys
}

// poolTargets lists the templates that want a pool.
func (m *Manager) poolTargets(ctx context.Context) (map[string]poolTarget, error) {
	want := map[string]poolTarget{}
	after := ""
	for page := 0; page < poolMaxPages; page++ {
		ts, err := m.store.ListTemplates(ctx, after, 500)
		if err != nil {
			return nil, err
		}
		if len(ts) == 0 {
			break
		}
		for _, t := range ts {
			after = t.ID
			if t.PoolSize <= 0 {
				continue
			}
			tgt := poolTarget{size: t.PoolSize, set: t.PoolSize, team: t.TeamID}
			tpl, err := m.templates.Resolve(ctx, t.ID)
			switch {
			case err == nil:
				tgt.tpl = tpl
			case errors.Is(err, template.ErrNotReady), errors.Is(err, template.ErrNotFound):
			default:
				return nil, err
			}
			want[t.ID] = tgt
		}
	}
	if m.cfg.PoolMemoryMB > 0 {
		if err := m.growToDemand(ctx, want); err != nil {
			return nil, err
		}
	}
	return want, nil
}

// PoolTarget is the number of standbys the pool of templateID refills to
// now: its set size, or more after recent demand (growToDemand); 0 for a
// template without a pool or a ready build.
func (m *Manager) PoolTarget(ctx context.Context, templateID string) (int, error) {
	want, err := m.poolTargets(ctx)
	if err != nil {
		return 0, err
	}
	tgt, ok := want[templateID]
	if !ok || tgt.tpl.BuildID == "" {
		return 0, nil
	}
	return tgt.size, nil
}

// growToDemand raises each pool's size to its recent demand while the
// standbys' memory stays within PoolMemoryMB: set sizes are counted
// first (they are kept whatever the budget), then growth is granted in
// template ID order.
func (m *Manager) growToDemand(ctx context.Context, want map[string]poolTarget) error {
	ids := make([]string, 0, len(want))
	left := m.cfg.PoolMemoryMB
	for id, tgt := range want {
		if tgt.tpl.BuildID == "" {
			continue
		}
		ids = append(ids, id)
		left -= tgt.set * max(tgt.tpl.MemoryMB, 1)
	}
	sort.Strings(ids)
	for _, id := range ids {
		tgt := want[id]
		peak, err := m.demand(ctx, id)
		if err != nil {
			return err
		}
		mem := max(tgt.tpl.MemoryMB, 1)
		extra := min(peak-tgt.set, left/mem)
		if extra > 0 {
			tgt.size = tgt.set + extra
			left -= extra * mem
			want[id] = tgt
		}
	}
	return nil
}

// demand is the most sandboxes of template id (standbys excluded, claimed
// ones included: a claim restarts their clock) started within any
// demandBucket of the last demandWindow.
func (m *Manager) demand(ctx context.Context, id string) (int, error) {
	rows, err := m.store.ListSandboxes(ctx, store.SandboxFilter{Template: id, StartedAfter: time.Now().Add(-demandWindow),
		ExcludeMetadataKey: PoolKey, Limit: demandMaxRows})
	if err != nil {
		return 0, err
	}
	// Rows come newest first; the peak is the most in any window of one
	// demandBucket.
	starts := make([]time.Time, len(rows))
	for i, sb := range rows {
		starts[len(rows)-1-i] = sb.StartedAt
	}
	peak, lo := 0, 0
	for hi, t := range starts {
		for t.Sub(starts[lo]) >= demandBucket {
			lo++
		}
		peak = max(peak, hi-lo+1)
	}
	return peak, nil
}

// reconcilePool retires standbys of stale builds, of templates without a
// pool and beyond the size, and creates missing ones one at a time.
func (m *Manager) reconcilePool(ctx context.Context) error {
	want, err := m.poolTargets(ctx)
	if err != nil {
		return err
	}
	rows, err := m.store.ListSandboxes(ctx, store.SandboxFilter{States: liveStates, Ascending: true})
	if err != nil {
		return err
	}
	keep := map[string][]*store.Sandbox{}
	for _, sb := range rows {
		if !IsStandby(sb) {
			continue
		}
		tplID := sb.Metadata[PoolKey]
		tgt, ok := want[tplID]
		switch {
		case sb.State == store.StatePaused:
			m.retire(ctx, sb.ID, "warm-pool standby was paused")
		case sb.State != store.StateRunning:
			// Creating (by this loop) or in a transition its owner finishes.
		case !ok:
			m.retire(ctx, sb.ID, "warm pool of template "+tplID+" was removed")
		case sb.Metadata[PoolBuildKey] != tgt.tpl.BuildID:
			m.retire(ctx, sb.ID, "warm-pool standby retired: template "+tplID+" has a new ready build")
		default:
			keep[tplID] = append(keep[tplID], sb)
		}
	}
	m.pool.standbys.Reset()
	m.pool.target.Reset()
	ids := make([]string, 0, len(want))
	for id := range want {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	now := time.Now()
	for _, id := range ids {
		tgt, have := want[id], keep[id]
		// rows are oldest first; claims take the oldest, so shed the newest.
		for len(have) > tgt.size {
			m.retire(ctx, have[len(have)-1].ID, "warm pool of template "+id+" shrank")
			have = have[:len(have)-1]
		}
		for _, sb := range have {
			if sb.EndAt.Sub(now) < m.standbyTimeout()/2 {
				m.extendStandby(ctx, sb.ID)
			}
		}
		m.pool.standbys.WithLabelValues(id).Set(float64(len(have)))
		m.pool.target.WithLabelValues(id).Set(float64(tgt.size))
		keep[id] = have
	}
	for _, id := range ids {
		tgt := want[id]
		if tgt.tpl.BuildID == "" {
			continue
		}
		if len(keep[id]) < tgt.size {
			if err := m.prefetch(ctx, tgt.tpl); err != nil {
				// Its standbys would fail the same way; other templates go on.
				m.log.Warn("warm pool not filled: the node cannot pull the template's image", "template", id, "err", err)
				continue
			}
		}
		// User creates come first: no filling while any is booting.
		if ctx.Err() != nil || m.userCreates.Load() > 0 {
			return nil
		}
		made, err := m.fillPool(ctx, tgt, tgt.size-len(keep[id]))
		m.pool.standbys.WithLabelValues(id).Set(float64(len(keep[id]) + made))
		if err != nil {
			if errors.Is(err, store.ErrQuota) {
				continue // this team is full; other templates and teams go on
			}
			if errors.Is(err, ErrCapacity) || errors.Is(err, ErrBusy) {
				return nil // try again next tick
			}
			if errors.Is(err, diskbudget.ErrInsufficientStorage) {
				m.log.Warn("warm pool not filled: no room on the data filesystem", "template", id, "err", err)
				return nil // space may come back; try again next tick
			}
			return fmt.Errorf("create standby of %s: %w", id, err)
		}
	}
	return nil
}

// fillPool boots up to missing standbys of tgt, PoolRefillParallel at a
// time. It stops starting more at the first error (returned) or when a
// user create begins to boot, and reports how many it made.
func (m *Manager) fillPool(ctx context.Context, tgt poolTarget, missing int) (made int, err error) {
	par := m.cfg.PoolRefillParallel
	if par <= 0 {
		par = max(2, goruntime.NumCPU()/2)
	}
	var (
		mu    sync.Mutex
		wg    sync.WaitGroup
		first error
	)
	sem := make(chan struct{}, par)
	failed := func() bool {
		mu.Lock()
		defer mu.Unlock()
		return first != nil
	}
	for range missing {
		sem <- struct{}{}
		if ctx.Err() != nil || m.userCreates.Load() > 0 || failed() {
			<-sem
			break
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			err := m.createStandby(ctx, tgt.team, tgt.tpl)
			mu.Lock()
			defer mu.Unlock()
			if err == nil {
				made++
			} else if first == nil {
				first = err
			}
		}()
	}
	wg.Wait()
	return made, first
}

func (m *Manager) createStandby(ctx context.Context, team string, tpl template.Template) error {
	sb, err := m.createFrom(ctx, CreateOptions{TemplateID: tpl.ID, TeamID: team, Timeout: m.standbyTimeout(),
		Metadata: map[string]string{PoolKey: tpl.ID, PoolBuildKey: tpl.BuildID},
		// The default egress policy, so most claims need no node policy
		// change; no public traffic reaches an unclaimed standby (the
		// proxy reads the row, which the claim rewrites).
		Network: store.Network{AllowInternet: true}, EnvVars: tpl.Env}, tpl)
	if err != nil {
		if sb != nil {
			// Ready command timed out: a standby that is not ready is useless.
			m.retire(context.WithoutCancel(ctx), sb.ID, "warm-pool standby failed its ready command")
		}
		return err
	}
	return nil
}

// retire kills a standby unless a claim took it first.
func (m *Manager) retire(ctx context.Context, id, reason string) {
	unlock, err := m.lock(ctx, id)
	if err != nil {
		m.log.Warn("warm-pool standby", "sandbox", id, "err", err)
		return
	}
	defer unlock()
	cur, err := m.store.GetSandbox(ctx, id)
	if err != nil || !cur.State.Live() || !IsStandby(cur) {
		return
	}
	if err := m.killLocked(ctx, id, reason); err != nil && !errors.Is(err, ErrNotFound) {
		m.log.Error("retire standby", "sandbox", id, "err", err)
	}
}

// extendStandby pushes an idle standby's expiry out again.
func (m *Manager) extendStandby(ctx context.Context, id string) {
	unlock, err := m.lock(ctx, id)
	if err != nil {
		m.log.Warn("warm-pool standby", "sandbox", id, "err", err)
		return
	}
	defer unlock()
	cur, err := m.store.GetSandbox(ctx, id)
	if err != nil || cur.State != store.StateRunning || !IsStandby(cur) {
		return
	}
	cur.EndAt = time.Now().UTC().Add(m.standbyTimeout())
	if err := m.store.UpdateSandbox(ctx, cur); err != nil {
		m.log.Warn("extend standby", "sandbox", id, "err", err)
	}
}
