package idlock

import (
	"testing"
	"time"
)

// The lock still excludes: a waiter on the same ID keeps the entry alive.
func TestLockSerialises(t *testing.T) {
	var l Map
	unlock := l.Lock("a")
	got, released := make(chan struct{}), make(chan struct{})
	go func() {
		u := l.Lock("a")
		close(got)
		u()
		close(released)
	}()
	select {
	case <-got:
		t.Fatal("second holder got the lock while the first held it")
	case <-time.After(50 * time.Millisecond):
	}
	unlock()
	<-got
	<-released // the count is read after the second holder let go
	if n := l.Len(); n != 0 {
		t.Fatalf("%d entries left", n)
	}
}
