package control

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/cubicle-dev/cubicle/internal/idlock"
	"github.com/cubicle-dev/cubicle/internal/loop"
	"github.com/cubicle-dev/cubicle/internal/node"
	"github.com/cubicle-dev/cubicle/internal/runtime"
	"github.com/cubicle-dev/cubicle/internal/store"
)

// liveStates hold node resources. A lost sandbox may still run on its
// node: its row keeps its snapshot layers, and a restart re-adopts it.
var liveStates = []store.SandboxState{store.StateCreating, store.StateRunning, store.StatePausing, store.StatePaused, store.StateResuming, store.StateLost}

// Recover makes the store and the nodes agree after a restart of cubicle
// serve, node by node: sandboxes still alive on their node are re-adopted,
// rows whose sandbox is gone (or was caught mid-transition) are marked
// killed with a reason, and node leftovers that no live row of that node
// owns are deleted. A node that cannot be reached is skipped (logged):
// its sandboxes are not judged gone.
func (m *Manager) Recover(ctx context.Context) error {
	rows, err := m.store.ListSandboxes(ctx, store.SandboxFilter{States: liveStates})
	if err != nil {
		return err
	}
	err = m.eachNode(ctx, "recover", func(id string, nd node.Node, present map[string]node.Sandbox) error {
		return m.recoverNode(ctx, id, nd, present, rows)
	})
	if err != nil {
		return err
	}
	// Volume rows mid-operation are any age's to finish only when no other
	// replica shares the store (in-process locks); beside others, only
	// those stale enough to be abandoned.
	_, alone := m.locks.(*idlock.Map)
	if err := m.reconcileVolumes(ctx, alone); err != nil {
		// Not fatal: the periodic reconciler keeps retrying.
		m.log.Error("recover volumes", "err", err)
	}
	return nil
}

// eachNode calls fn for every node of the set with what it holds now. A
// remote node that cannot be reached is logged and skipped; the
// in-process node's failure is returned (it is this process).
func (m *Manager) eachNode(ctx context.Context, what string, fn func(id string, nd node.Node, present map[string]node.Sandbox) error) error {
	members, err := m.nodes.Members(ctx)
	if err != nil {
		return err
	}
	for _, mb := range members {
		if !m.nodes.IsLocal(mb.ID) && mb.Row.Address == "" {
			continue // another replica's in-process node; it reconciles its own
		}
		nd, err := m.nodes.Get(ctx, mb.ID)
		var present map[string]node.Sandbox
		if err == nil {
			// Bounded: a node whose address no longer answers must not
			// hold up the others (or serve's start) for a TCP timeout.
			lctx, cancel := context.WithTimeout(ctx, nodeListTimeout)
			present, err = nodeSandboxes(lctx, nd)
			cancel()
		}
		if err != nil {
			if m.nodes.IsLocal(mb.ID) {
				return err
			}
			m.log.Warn(what+": node unreachable; its sandboxes are left as they are", "node", mb.ID, "err", err)
			continue
		}
		if err := fn(mb.ID, nd, present); err != nil {
			return err
		}
	}
	return nil
}

// nodeListTimeout bounds one node's List in the reconcilers.
const nodeListTimeout = 15 * time.Second

// rowNode is the node a row names; "" (rows from before nodes had names)
// is the in-process node's.
func (m *Manager) rowNode(sb *store.Sandbox) string {
	if sb.Node == "" {
		id, _ := m.nodes.Local()
		return id
	}
	return sb.Node
}

// staleOperation bounds how long an operation keeps a row in a
// transitional state (a create's or resume's node work is bounded by 2
// minutes): one left longer was abandoned by a replica that died.
const staleOperation = 10 * time.Minute

func (m *Manager) recoverNode(ctx context.Context, nodeID string, nd node.Node, present map[string]node.Sandbox, rows []*store.Sandbox) error {
	// Only this process drives its in-process node, so at its start nothing
	// is in flight there. A remote node is also driven by the other
	// replicas, which keep working while this one starts.
	remote := !m.nodes.IsLocal(nodeID)
	owned := map[string]bool{}
	for _, sb := range rows {
		if m.rowNode(sb) != nodeID {
			continue // another node's sandbox; not this node's to judge
		}
		if remote && transitional(sb.State) && time.Since(sb.UpdatedAt) < staleOperation {
			owned[sb.ID] = true // another replica's operation in flight
			continue
		}
		ns, ok := present[sb.ID]
		switch {
		case sb.State == store.StateCreating:
			m.reapLost(ctx, sb, "control plane restarted while the sandbox was being created")
		case !ok || ns.State == runtime.StateStopped:
			m.reapLost(ctx, sb, "sandbox was not running on its node after a control-plane restart")
		case IsStandby(sb) && (ns.State != runtime.StateRunning || sb.State != store.StateRunning):
			// An idle standby is only worth keeping running; the pool
			// reconciler replaces it.
			m.reapLost(ctx, sb, "warm-pool standby was not running after a control-plane restart")
		default:
			owned[sb.ID] = true
			want := store.StateRunning
			if ns.State == runtime.StatePaused {
				want = store.StatePaused
			}
			if sb.State != want || (want == store.StateRunning && sb.PausePackage != nil) {
				sb.State = want
				if want == store.StateRunning {
					sb.PausePackage = nil // it runs: a pause's package is stale
				}
				if err := m.store.UpdateSandbox(ctx, sb); err != nil {
					return err
				}
			}
			m.event(ctx, sb.ID, "recovered", "info", "re-adopted after control-plane restart (state %s)", want)
		}
	}
	for id := range present {
		if !owned[id] {
			if remote {
				// Created by another replica since rows were read.
				if sb, err := m.store.GetSandbox(ctx, id); err == nil && sb.State.Live() && m.rowNode(sb) == nodeID {
					continue
				}
			}
			m.log.Info("deleting orphaned sandbox", "sandbox", id, "node", nodeID)
			if err := nd.Delete(ctx, id); err != nil {
				m.log.Error("delete orphan", "sandbox", id, "node", nodeID, "err", err)
			}
		}
	}
	return nil
}

func (m *Manager) reapLost(ctx context.Context, sb *store.Sandbox, reason string) {
	unlock, err := m.lock(ctx, sb.ID)
	if err != nil {
		m.log.Error("recover", "sandbox", sb.ID, "err", err)
		return
	}
	defer unlock()
	// Judged from rows read before the lock: an operation that changed
	// the row meanwhile (another replica's) decides instead.
	if cur, err := m.store.GetSandbox(ctx, sb.ID); err != nil || cur.State != sb.State || !cur.UpdatedAt.Equal(sb.UpdatedAt) {
		return
	}
	derr := m.deleteOn(ctx, sb)
	m.markKilled(ctx, sb, reason, derr)
}

// transitional: a state an operation holds a row in while it works.
func transitional(s store.SandboxState) bool {
	return s == store.StateCreating || s == store.StatePausing || s == store.StateResuming
}

// Run enforces timeouts and repairs drift until ctx ends. The
// cluster-wide loops run under the Leaser, on one replica at a time; the
// node's own loops (heartbeat, disk watch) and this process's (the
// metrics sampler, which serves this replica's API) run everywhere.
func (m *Manager) Run(ctx context.Context) {
	r := m.loops
	r.Go(ctx, loop.Spec{Name: "reaper", Every: reapInterval, Leased: true}, m.reapExpired)
	r.Go(ctx, loop.Spec{Name: "reconcile", Every: reconcileInterval, Leased: true}, func(ctx context.Context) {
		if err := m.reconcile(ctx); err != nil && ctx.Err() == nil {
			m.log.Error("reconcile", "err", err)
		}
	})
	r.Go(ctx, loop.Spec{Name: "pool", Every: poolInterval, Leased: true, Kick: m.poolKick}, func(ctx context.Context) {
		if err := m.reconcilePool(ctx); err != nil && ctx.Err() == nil {
			m.log.Error("warm-pool reconcile", "err", err)
		}
	})
	r.Go(ctx, loop.Spec{Name: "snapshots", Every: reconcileInterval, Leased: true, Kick: m.snapKick, Now: true}, func(ctx context.Context) {
		if err := m.reconcileSnapshots(ctx); err != nil && ctx.Err() == nil {
			m.log.Error("snapshot reconcile", "err", err)
		}
	})
	r.Go(ctx, loop.Spec{Name: "node-loss", Every: nodeLossInterval(m.cfg.NodeLostAfter), Leased: true}, func(ctx context.Context) {
		if err := m.detectNodeLoss(ctx); err != nil && ctx.Err() == nil {
			m.log.Error("node-loss detection", "err", err)
		}
	})
	// Sampling has its own loop: an agent slow to answer a metrics call
	// must never hold up timeout enforcement.
	r.Go(ctx, loop.Spec{Name: "sampler", Every: m.sampleEvery}, m.sampleAll)
	if _, ok := m.nodes.Local(); ok {
		r.Go(ctx, loop.Spec{Name: "heartbeat", Every: heartbeatInterval}, func(ctx context.Context) {
			if err := m.heartbeat(ctx); err != nil && ctx.Err() == nil {
				m.log.Error("node heartbeat", "err", err)
			}
		})
	}
	go m.runExits(ctx)
	if w, ok := m.cfg.Disk.(DiskWatcher); ok {
		r.Go(ctx, loop.Spec{Name: "disk-watch", Every: diskWatchInterval}, m.diskWatcher(w))
	}
	<-ctx.Done()
	r.Wait()
}

// reapExpired kills (or pauses, with autoPause) running sandboxes past EndAt.
func (m *Manager) reapExpired(ctx context.Context) {
	rows, err := m.store.ListSandboxes(ctx, store.SandboxFilter{States: []store.SandboxState{store.StateRunning}})
	if err != nil {
		m.log.Error("reaper list", "err", err)
		return
	}
	now := time.Now()
	for _, sb := range rows {
		if now.Before(sb.EndAt) {
			continue
		}
		m.expire(ctx, sb.ID, now)
	}
}

// expire pauses (autoPause) or kills a sandbox whose timeout passed. The
// re-check and the action share one lock hold, so a concurrent setTimeout
// either lands first (and saves the sandbox) or after (and finds it gone).
func (m *Manager) expire(ctx context.Context, id string, now time.Time) {
	unlock, err := m.lock(ctx, id)
	if err != nil {
		m.log.Error("reap", "sandbox", id, "err", err)
		return
	}
	defer unlock()
	cur, err := m.store.GetSandbox(ctx, id)
	if err != nil || cur.State != store.StateRunning || now.Before(cur.EndAt) {
		return
	}
	// Devices cannot be checkpointed: an accelerator sandbox's timeout kills it.
	if cur.AutoPause && !hasAccelerators(cur) {
		if err := m.pauseLocked(ctx, id, "paused on timeout", cur.PauseMemory); err != nil {
			m.log.Error("auto-pause", "sandbox", id, "err", err)
		}
		return
	}
	if err := m.killLocked(ctx, id, "timeout"); err != nil && !errors.Is(err, ErrNotFound) {
		m.log.Error("reap", "sandbox", id, "err", err)
	}
}

// reconcile removes node leftovers of killed rows and kills rows whose
// sandbox disappeared from its node (e.g. its agent crashed), node by node
// (eachNode: an unreachable node is skipped, never taken as empty).
func (m *Manager) reconcile(ctx context.Context) error {
	rows, err := m.store.ListSandboxes(ctx, store.SandboxFilter{States: []store.SandboxState{store.StateRunning, store.StatePaused, store.StateLost}})
	if err != nil {
		return err
	}
	err = m.eachNode(ctx, "reconcile", func(id string, nd node.Node, present map[string]node.Sandbox) error {
		m.reconcileNode(ctx, id, nd, present, rows)
		return nil
	})
	if err != nil {
		return err
	}
	return m.reconcileVolumes(ctx, false)
}

func (m *Manager) reconcileNode(ctx context.Context, nodeID string, nd node.Node, present map[string]node.Sandbox, rows []*store.Sandbox) {
	live := map[string]bool{}
	for _, sb := range rows {
		if m.rowNode(sb) != nodeID {
			continue
		}
		live[sb.ID] = true
		if sb.State == store.StateLost {
			continue // node loss (nodeloss.go) decides
		}
		if ns, ok := present[sb.ID]; !ok || ns.State == runtime.StateStopped {
			// Double-check under the lock so an in-flight kill is not misreported.
			unlock, err := m.lock(ctx, sb.ID)
			if err != nil {
				m.log.Error("reconcile", "sandbox", sb.ID, "err", err)
				return
			}
			cur, err := m.store.GetSandbox(ctx, sb.ID)
			if err == nil && (cur.State == store.StateRunning || cur.State == store.StatePaused) {
				again, err := nd.Get(ctx, sb.ID)
				if errors.Is(err, node.ErrNotFound) && cur.State == store.StatePaused && movesWhenLost(cur) {
					// Gone from its node, but its pause package boots it
					// elsewhere at its next connect (resumePaused).
					unlock()
					continue
				}
				if errors.Is(err, node.ErrNotFound) || (err == nil && again.State == runtime.StateStopped) {
					derr := nd.Delete(ctx, sb.ID)
					m.markKilled(ctx, cur, reasonExited, derr)
				}
			}
			unlock()
		}
	}
	for id := range present {
		if live[id] {
			continue
		}
		sb, err := m.store.GetSandbox(ctx, id)
		if err == nil && sb.State.Live() && m.rowNode(sb) == nodeID {
			continue // transitional state; its own operation owns it
		}
		// No row, a dead row, or a row that names another node (a create
		// retried elsewhere after this node failed it).
		if errors.Is(err, store.ErrNotFound) || err == nil {
			m.log.Info("reconcile: deleting leftover", "sandbox", id, "node", nodeID)
			_ = nd.Delete(ctx, id)
		}
	}
}

// nodeSandboxes indexes what a node currently holds by sandbox ID.
func nodeSandboxes(ctx context.Context, nd node.Node) (map[string]node.Sandbox, error) {
	onNode, err := nd.List(ctx)
	if err != nil {
		return nil, err
	}
	present := make(map[string]node.Sandbox, len(onNode))
	for _, s := range onNode {
		present[s.ID] = s
	}
	return present, nil
}

// Kill reasons the node's exit watch records (see EndedError).
const (
	reasonExited = "killed: the sandbox's process exited unexpectedly"
	reasonOOM    = "killed: out of memory"
)

// runExits keeps one exit reader per node: the in-process node's from the
// start, a remote node's from when it is first seen, again after its
// stream ended (the connection dropped). Exits missed meanwhile are found
// by the periodic reconcile.
func (m *Manager) runExits(ctx context.Context) {
	var mu sync.Mutex
	watching := map[string]bool{}
	scan := func() {
		members, err := m.nodes.Members(ctx)
		if err != nil {
			m.log.Error("exit readers: list nodes", "err", err)
			return
		}
		for _, mb := range members {
			mu.Lock()
			busy := watching[mb.ID]
			mu.Unlock()
			if busy {
				continue
			}
			nd, err := m.nodes.Get(ctx, mb.ID)
			var exits <-chan node.Exit
			if err == nil {
				exits, err = nd.Exits(ctx)
			}
			if err != nil {
				m.log.Warn("node exit reports; exits are found by the periodic reconcile", "node", mb.ID, "err", err)
				continue
			}
			if exits == nil {
				continue // this node does not watch; the reconcile finds exits
			}
			mu.Lock()
			watching[mb.ID] = true
			mu.Unlock()
			go func(id string) {
				m.watchExits(ctx, id, exits)
				mu.Lock()
				delete(watching, id)
				mu.Unlock()
			}(mb.ID)
		}
	}
	scan()
	if !m.nodes.Remote() {
		return // one in-process node: its one stream lasts as long as ctx
	}
	t := time.NewTicker(heartbeatInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			scan()
		}
	}
}

// exitWorkers bounds the exit reports of one node handled at once: a
// node (hostile by assumption) that floods reports is slowed down on its
// own stream instead of growing this process's goroutines and lock waits.
const exitWorkers = 16

// watchExits marks sandboxes killed as soon as node nodeID reports their
// process gone, instead of at the next reconcile (up to 30 s later). It
// returns once the stream ended and its reports are handled.
func (m *Manager) watchExits(ctx context.Context, nodeID string, exits <-chan node.Exit) {
	sem := make(chan struct{}, exitWorkers)
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		select {
		case <-ctx.Done():
			return
		case e, ok := <-exits:
			if !ok {
				return
			}
			select {
			case sem <- struct{}{}:
			case <-ctx.Done():
				return
			}
			wg.Add(1)
			go func() {
				defer func() { <-sem; wg.Done() }()
				m.exited(ctx, nodeID, e)
			}()
		}
	}
}

// exited handles one exit report of node nodeID. The node reports exits
// of running sandboxes only (it stops watching before it pauses or
// deletes one), so a row still running under the lock is a sandbox that
// died; any other state means an operation of ours got there first. A
// report of a sandbox whose row names another node is refused: a node
// speaks only for its own sandboxes.
func (m *Manager) exited(ctx context.Context, nodeID string, e node.Exit) {
	// Judged once before the lock, so a report of a sandbox that is not
	// the node's running one costs a read, not a lock (a database
	// connection with idlock.Postgres), and again under it.
	if _, ok := m.exitApplies(ctx, nodeID, e.ID); !ok {
		return
	}
	unlock, err := m.lock(ctx, e.ID)
	if err != nil {
		m.log.Error("sandbox exit", "sandbox", e.ID, "err", err)
		return
	}
	defer unlock()
	sb, ok := m.exitApplies(ctx, nodeID, e.ID)
	if !ok {
		return
	}
	reason := reasonExited
	if e.OOM {
		reason = reasonOOM
	}
	m.log.Warn("sandbox died", "sandbox", e.ID, "reason", reason)
	nctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	derr := m.deleteOn(nctx, sb)
	m.markKilled(nctx, sb, reason, derr)
	if IsStandby(sb) {
		m.PoolTrigger("") // replace the standby now
	}
}

// exitApplies returns sandbox id's row when it is running on node nodeID,
// the only case in which that node's exit report of it is acted on.
func (m *Manager) exitApplies(ctx context.Context, nodeID, id string) (*store.Sandbox, bool) {
	sb, err := m.store.GetSandbox(ctx, id)
	if err != nil || sb.State != store.StateRunning {
		return nil, false
	}
	if m.rowNode(sb) != nodeID {
		m.log.Warn("exit report refused: the sandbox is not on the reporting node", "sandbox", id, "node", nodeID, "sandbox_node", sb.Node)
		return nil, false
	}
	return sb, true
}

// endedRetention is how long the not-found for a killed sandbox keeps
// naming how and when it ended.
const endedRetention = 24 * time.Hour

// endedError is the not-found err (from get) as Get's caller should see
// it: when id is a sandbox the caller may see (teamSees) that ended within
// endedRetention, it names the end and its time ("sandbox 'x' not found:
// killed: out of memory at 2026-…Z"), so users learn why; otherwise err.
func (m *Manager) endedError(ctx context.Context, id string, err error) error {
	if !errors.Is(err, ErrNotFound) {
		return err
	}
	sb, gerr := m.store.GetSandbox(ctx, id)
	if gerr != nil || !teamSees(ctx, sb) {
		return err
	}
	if how := EndedReason(sb); how != "" {
		return fmt.Errorf("%w: sandbox '%s' not found: %s", ErrNotFound, id, how)
	}
	return err
}

// EndedReason says how and when a killed sandbox ended ("killed: out of
// memory at 2026-…Z", "timeout at …"), or "" for a warm-pool standby, once
// that is older than endedRetention, or when unknown.
func EndedReason(sb *store.Sandbox) string {
	if sb.State != store.StateKilled || IsStandby(sb) || sb.KilledAt.IsZero() || time.Since(sb.KilledAt) > endedRetention {
		return ""
	}
	reason := sb.KillReason
	if reason == "" {
		reason = "killed"
	}
	return reason + " at " + sb.KilledAt.UTC().Format(time.RFC3339)
}
