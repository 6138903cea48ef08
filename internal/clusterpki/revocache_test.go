package clusterpki

import (
	"context"
	"errors"
	"testing"
	"time"
)

type countingRevs struct {
	at    time.Time
	err   error
	reads int
}

func (c *countingRevs) NodeRevokedAt(context.Context, string) (time.Time, error) {
	c.reads++
	return c.at, c.err
}

// The cache answers from memory for less than its TTL and reads the source
// again from then on, so a forget is seen within the TTL; a failed read is
// not kept.
func TestRevocationCacheTTL(t *testing.T) {
	src := &countingRevs{}
	c := NewRevocationCache(src, 5*time.Second)
	now := time.Unix(1000, 0)
	c.now = func() time.Time { return now }
	ctx := context.Background()
	if at, err := c.NodeRevokedAt(ctx, "n"); err != nil || !at.IsZero() || src.reads != 1 {
		t.Fatalf("first read: %v %v, %d reads", at, err, src.reads)
	}
	forgot := time.Unix(1001, 0)
	src.at = forgot
	now = now.Add(4 * time.Second)
	if at, _ := c.NodeRevokedAt(ctx, "n"); !at.IsZero() || src.reads != 1 {
		t.Fatalf("within the TTL: %v, %d reads", at, src.reads)
	}
	now = now.Add(time.Second)
	if at, _ := c.NodeRevokedAt(ctx, "n"); !at.Equal(forgot) || src.reads != 2 {
		t.Fatalf("at the TTL: %v, %d reads; want the forget", at, src.reads)
	}
	// A clock that went back does not stretch an entry.
	now = now.Add(-time.Minute)
	if _, _ = c.NodeRevokedAt(ctx, "n"); src.reads != 3 {
		t.Fatalf("clock went back: %d reads, want a new read", src.reads)
	}
	src.err = errors.New("store down")
	now = now.Add(time.Hour)
	if _, err := c.NodeRevokedAt(ctx, "n"); !errors.Is(err, src.err) {
		t.Fatalf("failed read: %v", err)
	}
	src.err = nil
	if at, err := c.NodeRevokedAt(ctx, "n"); err != nil || !at.Equal(forgot) || src.reads != 5 {
		t.Fatalf("after a failed read: %v %v, %d reads", at, err, src.reads)
	}
}
