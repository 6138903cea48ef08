package control

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"
)

// Lifecycle calls on IDs that do not exist (or do) must leave no lock entry
// behind, or the map grows with every ID ever asked for.
func TestLockMapEmptyAfterLookups(t *testing.T) {
	ctx := context.Background()
	m, _, _ := newPoolManager(t)
	var wg sync.WaitGroup
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := 0; j < 50; j++ {
				id := NewID()
				if err := m.Kill(ctx, id, "user"); !errors.Is(err, ErrNotFound) {
					t.Errorf("Kill %s: %v", id, err)
				}
				_ = m.SetTimeout(ctx, id, time.Minute)
				_ = m.Refresh(ctx, id, time.Minute)
				_ = m.Pause(ctx, id, true)
			}
		}()
	}
	wg.Wait()
	if n := m.locks.Held(); n != 0 {
		t.Fatalf("lock map holds %d entries after lookups of made-up IDs", n)
	}
}
