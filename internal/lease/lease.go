// Package lease makes a background loop (reaper, pool reconciler, snapshot
// GC...) run on exactly one control-plane replica at a time, and move to
// another replica when its holder dies.
package lease

import (
	"context"
	"sync"
)

// Leaser runs work under named, cluster-wide leases.
type Leaser interface {
	// Run blocks until ctx is done. Whenever this replica holds the lease
	// name, it runs fn with a context that is cancelled when the lease is
	// lost or ctx ends; fn must then return promptly (another replica may
	// start its fn soon after: see the implementation's timing). Run waits
	// for fn to return before it tries to take the lease again, so fn may
	// run several times, never twice at once. When Run returns, fn has
	// returned and the lease is released.
	Run(ctx context.Context, name string, fn func(ctx context.Context))
}

// Local is the Leaser of a single control plane (SQLite, embedded): it
// always holds every lease, except that two Runs of one name on the same
// Local take turns, as two replicas would.
type Local struct {
	mu    sync.Mutex
	names map[string]chan struct{}
}

var _ Leaser = (*Local)(nil)

// NewLocal returns an in-process Leaser.
func NewLocal() *Local { return &Local{names: map[string]chan struct{}{}} }

func (l *Local) sem(name string) chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	c, ok := l.names[name]
	if !ok {
		c = make(chan struct{}, 1)
		l.names[name] = c
	}
	return c
}

// Run implements Leaser: fn runs at once (or when another Run of name on
// this Local returns) and its context is ctx.
func (l *Local) Run(ctx context.Context, name string, fn func(ctx context.Context)) {
	sem := l.sem(name)
	select {
	case sem <- struct{}{}:
	case <-ctx.Done():
		return
	}
	defer func() { <-sem }()
	fn(ctx)
	<-ctx.Done()
}
