package control

import "sync"

// idLocks serialises lifecycle operations per sandbox ID. Entries are
// refcounted and dropped when the last holder or waiter is done, so IDs that
// callers merely ask about (real or made up) leave nothing behind.
type idLocks struct {
	mu sync.Mutex
	m  map[string]*idLock
}

type idLock struct {
	mu   sync.Mutex
	refs int
}

func (l *idLocks) lock(id string) func() {
	l.mu.Lock()
	if l.m == nil {
		l.m = map[string]*idLock{}
	}
	e := l.m[id]
	if e == nil {
		e = &idLock{}
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

// size is the number of live entries (tests).
func (l *idLocks) size() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.m)
}
