package clientrate

import (
	"net/netip"
	"testing"
	"time"
)

// The bucket table never outgrows its bound: idle buckets are dropped,
// and a new address past the bound is refused rather than stored.
func TestLimiterIsBounded(t *testing.T) {
	c := New(1, 2, 8)
	now := time.Now()
	for i := range 8 {
		if ok, _ := c.Allow(netip.AddrFrom4([4]byte{10, 0, 0, byte(i)}), now); !ok {
			t.Fatalf("address %d refused", i)
		}
	}
	if ok, retry := c.Allow(netip.MustParseAddr("10.0.1.1"), now); ok || retry <= 0 || len(c.buckets) != 8 {
		t.Fatalf("a 9th address while 8 are busy: ok %v retry %v, %d buckets", ok, retry, len(c.buckets))
	}
	// Two seconds later the 8 are full again and make room.
	if ok, _ := c.Allow(netip.MustParseAddr("10.0.1.1"), now.Add(2*time.Second)); !ok || len(c.buckets) != 1 {
		t.Fatalf("after the others refilled: ok %v, %d buckets", ok, len(c.buckets))
	}
	// One IPv6 /64 is one client; IPv4-mapped is the IPv4 address.
	if clientKey(netip.MustParseAddr("2001:db8::1")) != clientKey(netip.MustParseAddr("2001:db8::ffff:1")) ||
		clientKey(netip.MustParseAddr("::ffff:10.0.0.1")) != clientKey(netip.MustParseAddr("10.0.0.1")) {
		t.Fatal("client keys")
	}
}
