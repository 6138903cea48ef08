package node

import (
	"net/netip"
	"testing"
)

func TestSandboxHostRoundTrip(t *testing.T) {
	for _, s := range []string{"10.213.4.2:49983", "[fd00::7]:8080"} {
		ap := netip.MustParseAddrPort(s)
		h := SandboxHost("abcdefghij0123456789", ap)
		got, ok := sandboxAddr(h)
		if !ok || got != ap {
			t.Fatalf("%s -> %s -> %v %v", ap, h, got, ok)
		}
		if other := SandboxHost("zyxwvutsrq9876543210", ap); other == h {
			t.Fatalf("two sandboxes at %s share the pool host %s", ap, h)
		}
	}
	for _, h := range []string{"10.0.0.1:80", "example.com:80", "x.zz" + sandboxDomain + ":1", "nohost"} {
		if _, ok := sandboxAddr(h); ok {
			t.Fatalf("%q decoded as a sandbox host", h)
		}
	}
}
