package control

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/cubicle-dev/cubicle/internal/node"
	"github.com/cubicle-dev/cubicle/internal/store"
)

// ContentHolder is the node holder name of volume-content API attachments
// on the in-process node. On a remote node each replica attaches as
// ContentHolder + "-" + its own random suffix (leases.holder), so two
// replicas' leases on one node are two holders, counted by the node, and
// one replica's idle detach never pulls the volume from under the other.
const ContentHolder = "volume-content"

// ContentTarget is where a volume-content request is served: Dir on the
// in-process node (read directly, as in embedded mode), or the remote
// Node that holds the volume attached, through its data plane.
type ContentTarget struct {
	Dir  string
	Node string
}

// ErrVolumeUnavailable: no node can serve the volume's files now (the
// node that holds it is down, or no ready node has its driver): 503.
var ErrVolumeUnavailable = errors.New("volume files unavailable")

// leases keeps a volume attached on one node while the volume-content API
// uses it, so an unmounted volume can be read and written, and detaches it
// after an idle period. The node holds one ref per volume for all of this
// process's requests.
type leases struct {
	m    *Manager
	idle time.Duration
	// remoteHolder is this process's holder name on remote nodes.
	remoteHolder string
	// recheck is how often a lease on a remote node checks that the node
	// is still live.
	recheck time.Duration

	mu sync.Mutex
	by map[string]*lease
}

type lease struct {
	// node, hostPath and touched are guarded by the volume's content lock;
	// node is "" until the attach is done.
	node     string
	hostPath string
	touched  time.Time // the node's ref was last written (remote nodes)
	checked  time.Time // the node was last seen live (remote nodes)
	users    int       // guarded by leases.mu
	timer    *time.Timer
	gen      int // bumps on every acquire so a stale timer does nothing
}

func newLeases(m *Manager, idle time.Duration) *leases {
	return &leases{m: m, idle: idle, remoteHolder: ContentHolder + "-" + token(8), recheck: time.Second, by: map[string]*lease{}}
}

// holder is this process's holder name on node nodeID.
func (l *leases) holder(nodeID string) string {
	if l.m.nodes.IsLocal(nodeID) {
		return ContentHolder
	}
	return l.remoteHolder
}

// staleRemote is how old another replica's content ref on a remote node
// must be before the reconciler takes it as left behind: a lease touches
// its ref at least every idle period while requests come.
func (l *leases) staleRemote() time.Duration { return max(10*time.Minute, 4*l.idle) }

// volLock serialises attach/detach of one volume's content ref, so an
// expiring lease cannot detach the ref a newer lease just reused.
// The leases are this process's own state, so the lock is too.
func (l *leases) volLock(volID string) func() { return l.m.localLocks.Lock("volume-content/" + volID) }

// holdsOn reports whether this process leases volID on node nodeID (or is
// attaching it somewhere right now).
func (l *leases) holdsOn(volID, nodeID string) bool {
	l.mu.Lock()
	ls, ok := l.by[volID]
	l.mu.Unlock()
	if !ok {
		return false
	}
	unlock := l.volLock(volID)
	defer unlock()
	return ls.node == "" || ls.node == nodeID
}

func (l *leases) acquire(ctx context.Context, v *store.Volume) (ContentTarget, func(), error) {
	l.mu.Lock()
	ls, ok := l.by[v.ID]
	if !ok {
		ls = &lease{}
		l.by[v.ID] = ls
	}
	ls.users++
	ls.gen++
	if ls.timer != nil {
		ls.timer.Stop()
		ls.timer = nil
	}
	l.mu.Unlock()

	unlock := l.volLock(v.ID)
	fail := func(err error) (ContentTarget, func(), error) {
		unlock()
		l.release(v.ID, ls)
		return ContentTarget{}, nil, err
	}
	att := node.VolumeAttachment{VolumeID: v.ID, Driver: v.Driver, PrivateData: v.PrivateData}
	if ls.hostPath != "" && !l.m.nodes.IsLocal(ls.node) && time.Since(ls.checked) >= l.recheck {
		// Requests that keep coming would keep a lease on a lost node
		// forever: lease elsewhere instead. The lost node keeps its ref
		// until it returns and the reconciler (no lease holds it) detaches it.
		if l.m.nodeLive(ctx, ls.node) {
			ls.checked = time.Now()
		} else {
			l.m.log.Warn("volume-content lease: node lost, leasing elsewhere", "volume", v.ID, "node", ls.node)
			ls.node, ls.hostPath = "", ""
		}
	}
	switch {
	case ls.hostPath == "":
		id, err := l.m.contentNodeFor(ctx, v)
		if err != nil {
			return fail(err)
		}
		nd, err := l.m.nodeFor(ctx, id)
		if err != nil {
			return fail(fmt.Errorf("%w: volume '%s': %v", ErrVolumeUnavailable, v.ID, err))
		}
		hp, err := nd.AttachVolume(context.WithoutCancel(ctx), l.holder(id), att)
		if err != nil {
			return fail(fmt.Errorf("attach volume '%s' on node %s for file access: %w", v.ID, id, err))
		}
		ls.node, ls.hostPath, ls.touched, ls.checked = id, hp, time.Now(), time.Now()
	case !l.m.nodes.IsLocal(ls.node) && time.Since(ls.touched) > l.idle:
		// Re-attaching an attached holder rewrites the node's ref, which
		// tells other replicas' reconcilers it is in use.
		if nd, err := l.m.nodeFor(ctx, ls.node); err == nil {
			if _, err := nd.AttachVolume(context.WithoutCancel(ctx), l.holder(ls.node), att); err == nil {
				ls.touched = time.Now()
			}
		}
	}
	t := ContentTarget{Node: ls.node}
	if l.m.nodes.IsLocal(ls.node) {
		t = ContentTarget{Dir: ls.hostPath}
	}
	unlock()
	var once sync.Once
	return t, func() { once.Do(func() { l.release(v.ID, ls) }) }, nil
}

func (l *leases) release(volID string, ls *lease) {
	l.mu.Lock()
	defer l.mu.Unlock()
	ls.users--
	if ls.users > 0 {
		return
	}
	gen := ls.gen
	ls.timer = time.AfterFunc(l.idle, func() { l.expire(volID, ls, gen) })
}

func (l *leases) expire(volID string, ls *lease, gen int) {
	unlock := l.volLock(volID)
	defer unlock()
	l.mu.Lock()
	if ls.users > 0 || ls.gen != gen || l.by[volID] != ls {
		l.mu.Unlock()
		return
	}
	delete(l.by, volID)
	l.mu.Unlock()
	if ls.hostPath == "" {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	nd, err := l.m.nodeFor(ctx, ls.node)
	if err == nil {
		err = nd.DetachVolume(ctx, l.holder(ls.node), volID)
	}
	if err != nil {
		// The node keeps the ref; the reconciler retries since no lease holds it.
		l.m.log.Error("detach idle volume-content attachment", "volume", volID, "node", ls.node, "err", err)
	}
	ls.node, ls.hostPath = "", ""
}

var errLeaseBusy = errors.New("file operations on the volume are still in progress")

// drop detaches the volume now for a delete; it waits briefly for requests
// in flight (new ones are refused because the volume is already deleting).
func (l *leases) drop(ctx context.Context, volID string) error {
	deadline := time.Now().Add(10 * time.Second)
	var held *lease
	for {
		l.mu.Lock()
		ls, ok := l.by[volID]
		if !ok || ls.users == 0 {
			if ok {
				if ls.timer != nil {
					ls.timer.Stop()
				}
				delete(l.by, volID)
				held = ls
			}
			l.mu.Unlock()
			break
		}
		l.mu.Unlock()
		if time.Now().After(deadline) {
			return errLeaseBusy
		}
		time.Sleep(50 * time.Millisecond)
	}
	unlock := l.volLock(volID)
	defer unlock()
	var errs []error
	if held != nil && held.node != "" && !l.m.nodes.IsLocal(held.node) {
		nd, err := l.m.nodeFor(ctx, held.node)
		if err == nil {
			err = nd.DetachVolume(ctx, l.holder(held.node), volID)
		}
		errs = append(errs, err)
	}
	// The in-process node: also covers a ref left by a previous process.
	if nd := l.m.nodes.LocalNode(); nd != nil {
		errs = append(errs, nd.DetachVolume(ctx, ContentHolder, volID))
	}
	return errors.Join(errs...)
}

// nodeLive reports whether node id's heartbeat is within NodeLostAfter
// (the in-process node always is).
func (m *Manager) nodeLive(ctx context.Context, id string) bool {
	if m.nodes.IsLocal(id) {
		return true
	}
	row, err := m.store.GetNode(ctx, id)
	return err == nil && time.Since(row.HeartbeatAt) <= m.cfg.NodeLostAfter
}

// contentNodeFor chooses the node that serves v's files. A volume of a
// host-bound driver (local) is files of the control plane's host: only the
// in-process node has them (its sandboxes are pinned there too), and a
// control plane without one cannot serve them (409). Otherwise: a live
// node where a live sandbox holds the volume already (no second mount),
// the in-process node first; else the in-process node when it has the
// driver (no extra hop); else the first ready, uncordoned node that has
// it (503 when none).
func (m *Manager) contentNodeFor(ctx context.Context, v *store.Volume) (string, error) {
	localID, hasLocal := m.nodes.Local()
	if p, err := m.plugin(v.Driver); err == nil && hostBound(p) {
		if hasLocal {
			return localID, nil
		}
		return "", fmt.Errorf("%w: volume '%s' (driver %s) is kept on the control plane's host, and this control plane runs no node to serve its files", ErrConflict, v.ID, v.Driver)
	}
	live, err := m.nodes.Live(ctx, m.cfg.NodeLostAfter, time.Now())
	if err != nil {
		return "", err
	}
	isLive := map[string]bool{}
	for _, mb := range live {
		isLive[mb.ID] = true
	}
	atts, err := m.store.ListVolumeAttachments(ctx, v.ID, "")
	if err != nil {
		return "", err
	}
	var holders []string
	for _, a := range atts {
		id := a.Node
		if id == "" && hasLocal {
			id = localID
		}
		if isLive[id] {
			holders = append(holders, id)
		}
	}
	if hasLocal && slices.Contains(holders, localID) {
		return localID, nil
	}
	if len(holders) > 0 {
		slices.Sort(holders)
		return holders[0], nil
	}
	if hasLocal {
		info, err := m.nodeInfo(ctx, m.nodes.LocalNode(), localID)
		if err == nil && slices.Contains(info.VolumeDrivers, v.Driver) {
			return localID, nil
		}
	}
	for _, mb := range live {
		if mb.Row == nil || m.nodes.IsLocal(mb.ID) || mb.Row.Cordoned || mb.Row.Draining {
			continue
		}
		if slices.Contains(mb.Row.VolumeDrivers, v.Driver) {
			return mb.ID, nil
		}
	}
	return "", fmt.Errorf("%w: no ready node has volume driver %q", ErrVolumeUnavailable, v.Driver)
}
