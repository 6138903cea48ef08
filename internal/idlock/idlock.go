// Package idlock serialises work per string ID (a sandbox, a volume) without
// one lock per ID living forever: in one process (Map) or across every
// control-plane replica on one PostgreSQL database (Postgres).
package idlock

import (
	"context"
	"fmt"
	"sync"
)

// Locker serialises work per ID among everything that shares it.
// Implementations are safe for concurrent use.
type Locker interface {
	// Acquire blocks until the caller holds id's lock, and returns the
	// function that releases it (call it exactly once). When ctx ends
	// first it returns an error matching ctx's error and holds nothing.
	Acquire(ctx context.Context, id string) (release func(), err error)
	// Held counts what this Locker holds for callers now (lock entries,
	// connections): 0 once every lock is released and no call waits, so
	// tests can see a leak.
	Held() int
}

// Map holds one lock per ID in this process. Entries are refcounted and
// dropped when the last holder or waiter is done, so IDs that callers
// merely ask about (real or made up) leave nothing behind. The zero value
// is ready to use; a Map must not be copied after first use.
type Map struct {
	mu sync.Mutex
	m  map[string]*entry
}

var _ Locker = (*Map)(nil)

type entry struct {
	sem  chan struct{} // one slot: a lock a waiter can give up on
	refs int
}

func (l *Map) ref(id string) *entry {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.m == nil {
		l.m = map[string]*entry{}
	}
	e := l.m[id]
	if e == nil {
		e = &entry{sem: make(chan struct{}, 1)}
		l.m[id] = e
	}
	e.refs++
	return e
}

func (l *Map) unref(id string, e *entry) {
	l.mu.Lock()
	if e.refs--; e.refs == 0 {
		delete(l.m, id)
	}
	l.mu.Unlock()
}

// Lock blocks until the caller holds id's lock and returns the function that
// releases it. The returned function must be called exactly once.
func (l *Map) Lock(id string) func() {
	release, _ := l.Acquire(context.Background(), id)
	return release
}

// Acquire implements Locker.
func (l *Map) Acquire(ctx context.Context, id string) (func(), error) {
	e := l.ref(id)
	select {
	case e.sem <- struct{}{}: // free: no wait, even with ctx already done
	default:
		select {
		case e.sem <- struct{}{}:
		case <-ctx.Done():
			l.unref(id, e)
			return nil, fmt.Errorf("lock %s: %w", id, ctx.Err())
		}
	}
	return func() {
		<-e.sem
		l.unref(id, e)
	}, nil
}

// Len is the number of live entries: IDs held or waited on right now.
func (l *Map) Len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.m)
}

// Held implements Locker: the live entries.
func (l *Map) Held() int { return l.Len() }
