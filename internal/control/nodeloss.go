package control

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/cubicle-dev/cubicle/internal/node"
	"github.com/cubicle-dev/cubicle/internal/runtime"
	"github.com/cubicle-dev/cubicle/internal/store"
)

// Node loss defaults (serve's --node-lost-after, --node-lost-grace).
const (
	// DefaultNodeLostAfter is three heartbeat intervals: two missed
	// beats are not a loss.
	DefaultNodeLostAfter = 15 * time.Second
	DefaultNodeLostGrace = 10 * time.Minute
)

// errNodeLost is the node error of a sandbox killed while its node was
// lost: the node never confirmed it let go of the sandbox's volumes, so
// their attachments stay (markKilled drops them only on a confirmed
// delete) until the node comes back or `cubicle node forget`.
var errNodeLost = errors.New("node lost")

// nodeLossInterval is the node-loss loop's period: a third of lostAfter,
// so a loss is seen at most lostAfter*4/3 after the last heartbeat.
func nodeLossInterval(lostAfter time.Duration) time.Duration {
	return max(lostAfter/3, 10*time.Millisecond)
}

// lostLockWait bounds the wait for a sandbox's lock: a sandbox whose lock
// is held is in an operation that settles its state; the next pass looks
// again.
const lostLockWait = time.Second

// detectNodeLoss is one pass of the node-loss loop (leased: one replica
// judges). A node silent for longer than NodeLostAfter is lost: its
// running and paused sandboxes become lost (the row keeps the node and
// its reservation; an event says why), and past NodeLostGrace they are
// killed with a reason. A lost node that heartbeats again gets its lost
// sandboxes back in the state it reports (nodeReturned).
//
// Creating rows are left to their create, whose node call fails against
// the silent node and kills the row with that reason (a replica that
// died mid-create leaves them to Recover); marking them lost would race
// a create that has written its row but not yet taken the lock.
func (m *Manager) detectNodeLoss(ctx context.Context) error {
	nodes, err := m.store.ListNodes(ctx)
	if err != nil {
		return err
	}
	lost, err := m.store.ListSandboxes(ctx, store.SandboxFilter{States: []store.SandboxState{store.StateLost}})
	if err != nil {
		return err
	}
	lostOn := map[string][]*store.Sandbox{}
	for _, sb := range lost {
		lostOn[sb.Node] = append(lostOn[sb.Node], sb)
	}
	now := time.Now()
	var silent []*store.Node
	var errs []error
	for _, n := range nodes {
		if now.Sub(n.HeartbeatAt) > m.cfg.NodeLostAfter {
			silent = append(silent, n)
			m.wasSilent.Store(n.ID, true)
		} else if _, was := m.wasSilent.Load(n.ID); was || len(lostOn[n.ID]) > 0 {
			// A node back from silence is repaired even with no lost row
			// left: a paused sandbox that resumed elsewhere meanwhile is a
			// leftover there (its row names another node).
			if err := m.nodeReturned(ctx, n.ID, lostOn[n.ID]); err != nil {
				errs = append(errs, fmt.Errorf("node %s returned: %w", n.ID, err))
			} else {
				m.wasSilent.Delete(n.ID)
			}
		}
	}
	if len(silent) == 0 {
		return errors.Join(errs...)
	}
	live, err := m.store.ListSandboxes(ctx, store.SandboxFilter{States: []store.SandboxState{store.StateRunning, store.StatePaused}})
	if err != nil {
		return errors.Join(append(errs, err)...)
	}
	liveOn := map[string][]*store.Sandbox{}
	for _, sb := range live {
		liveOn[sb.Node] = append(liveOn[sb.Node], sb)
	}
	for _, n := range silent {
		since := now.Sub(n.HeartbeatAt)
		for _, sb := range liveOn[n.ID] {
			m.markLost(ctx, n, sb.ID)
		}
		if since > m.cfg.NodeLostAfter+m.cfg.NodeLostGrace {
			reason := fmt.Sprintf("killed: node %s lost for %s (no heartbeat since %s)", n.ID, since.Round(time.Second), n.HeartbeatAt.UTC().Format(time.RFC3339))
			for _, sb := range append(lostOn[n.ID], liveOn[n.ID]...) {
				if movesWhenLost(sb) {
					// It resumes on another node at its next connect: the
					// grace does not end it.
					continue
				}
				m.killLost(ctx, sb.ID, reason)
			}
		}
	}
	return errors.Join(errs...)
}

// lockSettled takes a sandbox's lock for node-loss work, waiting at most
// lostLockWait (ok false: busy, or ctx ended).
func (m *Manager) lockSettled(ctx context.Context, id string) (func(), bool) {
	lctx, cancel := context.WithTimeout(ctx, lostLockWait)
	defer cancel()
	unlock, err := m.lock(lctx, id)
	return unlock, err == nil
}

// markLost moves one running or paused sandbox of silent node n to lost.
func (m *Manager) markLost(ctx context.Context, n *store.Node, id string) {
	unlock, ok := m.lockSettled(ctx, id)
	if !ok {
		return
	}
	defer unlock()
	cur, err := m.store.GetSandbox(ctx, id)
	if err != nil || cur.Node != n.ID {
		return
	}
	was := cur.State
	if _, err := m.store.CompareAndSetState(ctx, id, []store.SandboxState{store.StateRunning, store.StatePaused}, store.StateLost); err != nil {
		return // an operation moved it first
	}
	m.log.Warn("sandbox lost with its node", "sandbox", id, "node", n.ID, "was", was)
	if movesWhenLost(cur) {
		how := "its next connect"
		if cur.PausePackage.FilesOnly {
			how = "a connect with memory: false (onResume: 'reboot')"
		}
		m.event(ctx, id, "lost", "warn", "node %s lost: no heartbeat since %s; the sandbox was paused, and its pause package lets it resume on another node at %s, so it is not killed after the grace",
			n.ID, n.HeartbeatAt.UTC().Format(time.RFC3339), how)
		return
	}
	m.event(ctx, id, "lost", "warn", "node %s lost: no heartbeat since %s; the sandbox was %s and is killed after %s unless the node returns",
		n.ID, n.HeartbeatAt.UTC().Format(time.RFC3339), was, m.cfg.NodeLostGrace)
}

// movesWhenLost: sb, lost while paused, can resume on another node
// while its node stays lost (movePaused): its pause has a package
// (packagePause made one only for a sandbox nothing pins), and it mounts
// no volume, which a lost node holds until it confirms or is forgotten.
func movesWhenLost(sb *store.Sandbox) bool {
	return sb.State != store.StateRunning && sb.PausePackage != nil && len(sb.Volumes) == 0
}

// killLost kills a lost sandbox whose node stayed silent past the grace.
// Its reservation ends with the row; its volume attachments stay (see
// errNodeLost); the node deletes it, if it ever returns, at its reconcile.
func (m *Manager) killLost(ctx context.Context, id, reason string) {
	unlock, ok := m.lockSettled(ctx, id)
	if !ok {
		return
	}
	defer unlock()
	cur, err := m.store.GetSandbox(ctx, id)
	if err != nil || cur.State != store.StateLost {
		return
	}
	m.log.Warn("killing a sandbox of a lost node", "sandbox", id, "reason", reason)
	m.markKilled(ctx, cur, reason, errNodeLost)
}

// nodeReturned repairs both sides once a lost node heartbeats again: a
// lost sandbox the node still has is back in the state the node reports
// (running or paused, the two states a sandbox is lost from); one it no
// longer has is killed; then the node's reconcile deletes what the
// control plane killed meanwhile. A node it cannot reach yet is left for
// a later pass.
func (m *Manager) nodeReturned(ctx context.Context, nodeID string, lost []*store.Sandbox) error {
	nd, err := m.nodeFor(ctx, nodeID)
	if err != nil {
		return err
	}
	lctx, cancel := context.WithTimeout(ctx, nodeListTimeout)
	present, err := nodeSandboxes(lctx, nd)
	cancel()
	if err != nil {
		return err
	}
	for _, sb := range lost {
		m.restoreLost(ctx, nodeID, nd, sb.ID, present)
	}
	rows, err := m.store.ListSandboxes(ctx, store.SandboxFilter{States: []store.SandboxState{store.StateRunning, store.StatePaused, store.StateLost}})
	if err != nil {
		return err
	}
	m.reconcileNode(ctx, nodeID, nd, present, rows)
	return nil
}

func (m *Manager) restoreLost(ctx context.Context, nodeID string, nd node.Node, id string, present map[string]node.Sandbox) {
	unlock, ok := m.lockSettled(ctx, id)
	if !ok {
		return
	}
	defer unlock()
	cur, err := m.store.GetSandbox(ctx, id)
	if err != nil || cur.State != store.StateLost {
		return
	}
	ns, ok := present[id]
	var want store.SandboxState
	switch {
	case ok && ns.State == runtime.StateRunning:
		want = store.StateRunning
	case ok && ns.State == runtime.StatePaused:
		want = store.StatePaused
	case movesWhenLost(cur):
		// The node is back without it (its data dir was lost or wiped),
		// but its pause package can still boot it elsewhere: paused again,
		// its next connect finds it missing there and moves it.
		if _, err := m.store.CompareAndSetState(ctx, id, []store.SandboxState{store.StateLost}, store.StatePaused); err == nil {
			m.event(ctx, id, "recovered", "warn", "node %s returned without the sandbox; it stays paused, and its pause package lets it resume on another node at its next connect", nodeID)
		}
		return
	default:
		// The node is back without it: it confirms nothing holds the
		// volumes, so the attachments go too.
		derr := nd.Delete(ctx, id)
		m.markKilled(ctx, cur, fmt.Sprintf("killed: node %s returned without the sandbox", nodeID), derr)
		return
	}
	if _, err := m.store.CompareAndSetState(ctx, id, []store.SandboxState{store.StateLost}, want); err != nil {
		return
	}
	if want == store.StateRunning && cur.PausePackage != nil {
		// It runs: its pause's package is stale (the lock is held).
		cur.State, cur.PausePackage = want, nil
		if err := m.store.UpdateSandbox(ctx, cur); err != nil {
			m.log.Error("clearing a stale pause package", "sandbox", id, "err", err)
		}
	}
	m.event(ctx, id, "recovered", "info", "node %s returned; the sandbox is %s again", nodeID, want)
}
