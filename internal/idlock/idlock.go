// Package idlock serialises work per string ID (a sandbox, a volume) without
// one mutex per ID living forever.
package idlock

import "sync"

// Map holds one lock per ID. Entries are refcounted and dropped when the last
// holder or waiter is done, so IDs that callers merely ask about (real or made
// up) leave nothing behind. The zero value is ready to use; a Map must not be
// copied after first use.
type Map struct {
	mu sync.Mutex
	m  map[string]*entry
}

type entry struct {
	mu   sync.Mutex
	refs int
}

// Lock blocks until the caller holds id's lock and returns the function that
// releases it. The returned function must be called exactly once.
func (l *Map) Lock(id string) func() {
	l.mu.Lock()
	if l.m == nil {
		l.m = map[string]*entry{}
	}
	e := l.m[id]
	if e == nil {
		e = &entry{}
		l.m[id] = e
	}
	e.refs++
	l.mu.Unlock()
	e.mu.Lock()
	return func() {
		e.mu.Unlock()
		l.mu.Lock()
		if e.refs--; e.refs == 0 {
			delete(l.m, id)
		}
		l.mu.Unlock()
	}
}

// Len is the number of live entries: IDs held or waited on right now.
func (l *Map) Len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.m)
}
