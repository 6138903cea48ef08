package control

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/cubicle-dev/cubicle/internal/node"
	"github.com/cubicle-dev/cubicle/internal/store"
)

// ContentHolder is the node holder name of volume-content API attachments.
const ContentHolder = "volume-content"

// leases keeps a volume attached on the node while the volume-content API
// uses it, so an unmounted volume can be read and written, and detaches it
// after an idle period. The node holds one ref per volume for all of them.
type leases struct {
	m    *Manager
	idle time.Duration

	mu sync.Mutex
	by map[string]*lease
}

type lease struct {
	hostPath string // guarded by the volume's content lock
	users    int    // guarded by leases.mu
	timer    *time.Timer
	gen      int // bumps on every acquire so a stale timer does nothing
}

func newLeases(m *Manager, idle time.Duration) *leases {
	return &leases{m: m, idle: idle, by: map[string]*lease{}}
}

// volLock serialises attach/detach of one volume's content ref, so an
// expiring lease cannot detach the ref a newer lease just reused.
// The leases are this process's own state, so the lock is too.
func (l *leases) volLock(volID string) func() { return l.m.localLocks.Lock("volume-content/" + volID) }

func (l *leases) holds(volID string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	_, ok := l.by[volID]
	return ok
}

func (l *leases) acquire(ctx context.Context, v *store.Volume) (string, func(), error) {
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
	if ls.hostPath == "" {
		nd, err := l.m.contentNode()
		if err != nil {
			unlock()
			l.release(v.ID, ls)
			return "", nil, err
		}
		hp, err := nd.AttachVolume(context.WithoutCancel(ctx), ContentHolder,
			node.VolumeAttachment{VolumeID: v.ID, Driver: v.Driver, PrivateData: v.PrivateData})
		if err != nil {
			unlock()
			l.release(v.ID, ls)
			return "", nil, fmt.Errorf("attach volume '%s' for file access: %w", v.ID, err)
		}
		ls.hostPath = hp
	}
	hp := ls.hostPath
	unlock()
	var once sync.Once
	return hp, func() { once.Do(func() { l.release(v.ID, ls) }) }, nil
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
	nd, err := l.m.contentNode()
	if err == nil {
		err = nd.DetachVolume(ctx, ContentHolder, volID)
	}
	if err != nil {
		// The node keeps the ref; the reconciler retries since no lease holds it.
		l.m.log.Error("detach idle volume-content attachment", "volume", volID, "err", err)
	}
	ls.hostPath = ""
}

var errLeaseBusy = errors.New("file operations on the volume are still in progress")

// drop detaches the volume now for a delete; it waits briefly for requests
// in flight (new ones are refused because the volume is already deleting).
func (l *leases) drop(ctx context.Context, volID string) error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		l.mu.Lock()
		ls, ok := l.by[volID]
		if !ok || ls.users == 0 {
			if ok {
				if ls.timer != nil {
					ls.timer.Stop()
				}
				delete(l.by, volID)
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
	// Also covers a ref left by a previous process.
	nd, err := l.m.contentNode()
	if err != nil {
		if errors.Is(err, ErrNoLocalNode) {
			return nil // no in-process node, so no content attachment
		}
		return err
	}
	return nd.DetachVolume(ctx, ContentHolder, volID)
}
