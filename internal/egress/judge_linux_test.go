//go:build linux

package egress_test

import (
	"context"
	"crypto/x509"
	"net"
	"net/netip"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/egress"
	"github.com/cubicle-dev/cubicle/internal/network"
	"github.com/cubicle-dev/cubicle/internal/servecert"

	"github.com/cubicle-dev/cubicle/internal/testenv"
)

// interception applies rules with ca, trusting the testnet's servers.
func interception(t *testing.T, ca *servecert.CA, tn testnet) egress.Option {
	t.Helper()
	pem, err := os.ReadFile(tn.CACert)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(pem)
	return egress.WithInterception(ca, roots, nil)
}

// countAccepts counts the connections ln accepts (and closes them) until
// it is closed.
func countAccepts(t *testing.T, ln net.Listener) *atomic.Int32 {
	t.Helper()
	var n atomic.Int32
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			n.Add(1)
			c.Close()
		}
	}()
	t.Cleanup(func() { ln.Close() })
	return &n
}

// The pool, the host's loopback and link-local are refused on every path
// of the egress proxy whatever allowOut says (0.0.0.0/0 included): a name
// allowed by a domain entry that resolves there (by /etc/hosts for
// localhost, by DNS for another sandbox's address), by address through an
// upstream SOCKS5 proxy, and for a host with transform rules.
func TestForbiddenOnEveryPath(t *testing.T) {
	testenv.RequireRoot(t, "netns, veth, nftables")
	// The host's loopback, where the API and other host services listen.
	var hostHits []*atomic.Int32
	for _, port := range []string{"80", "443"} {
		ln, err := net.Listen("tcp4", "127.0.0.1:"+port)
		if err != nil {
			t.Fatalf("a listener on the host's loopback: %v", err)
		}
		hostHits = append(hostHits, countAccepts(t, ln))
	}
	cfg := testConfig(t, netip.Addr{})
	// Addresses are handed out lowest-free: the first sandbox (the victim)
	// gets the one after the gateway.
	victimAddr := network.GatewayOf(cfg.Pool).Next()
	tn := startTestnetArgs(t, "--socks-user", "alice", "--socks-pass", "pw",
		"-record", "victim.test="+victimAddr.String())
	cfg.Resolvers = []netip.Addr{netip.MustParseAddr(tn.DNS)}
	ca, caFile := interceptionCA(t)
	l, _ := startManager(t, cfg, interception(t, ca, tn))

	victim, err := l.Setup(context.Background(), "forbidvictim", network.Policy{})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = l.Teardown(context.Background(), "forbidvictim") }()
	if victim.Addr != victimAddr {
		t.Fatalf("victim at %s, want %s", victim.Addr, victimAddr)
	}
	var vln net.Listener
	if err := network.RunInNetns(victim.NetNSPath, func() (err error) {
		vln, err = net.Listen("tcp4", ":80")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	victimHits := countAccepts(t, vln)
	// Positive control: the victim's listener answers (from the host).
	if c, err := net.Dial("tcp4", netip.AddrPortFrom(victimAddr, 80).String()); err != nil {
		t.Fatalf("control: the victim's listener: %v", err)
	} else {
		c.Close()
	}
	for i := 0; victimHits.Load() == 0 && i < 500; i++ {
		time.Sleep(10 * time.Millisecond)
	}
	if victimHits.Load() != 1 {
		t.Fatal("control: the victim's listener saw no connection")
	}

	const id = "forbidattacker"
	pol := network.Policy{AllowOut: []string{"0.0.0.0/0", "localhost", "victim.test", "a.test"}}
	ep, err := l.Setup(context.Background(), id, pol)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = l.Teardown(context.Background(), id) }()
	ns := ep.NetNSPath
	check := func(what, want, url, host string, extra ...string) {
		t.Helper()
		if got := curl(t, ns, url, host, tn.Addr, extra...); got != want {
			t.Errorf("%s: %s got %q, want %q", what, url, got, want)
		}
	}
	// Positive control: a permitted name is reached through the same path.
	check("allowed name", "200", "http://a.test/", "a.test")
	check("localhost over HTTP", "", "http://localhost/", "localhost")
	check("localhost over TLS", "", "https://localhost/", "localhost")
	check("another sandbox by name", "", "http://victim.test/", "victim.test")

	// Transform rules for the same names (the interception path).
	rules := pol
	rules.Rules = map[string][]network.Rule{"localhost": {{Headers: map[string]string{"X-A": "1"}}}, "victim.test": {{Headers: map[string]string{"X-A": "1"}}}, "a.test": {{Headers: map[string]string{"X-A": "1"}}}}
	if err := l.UpdatePolicy(context.Background(), id, rules); err != nil {
		t.Fatal(err)
	}
	check("allowed name with rules", "200", "https://a.test/", "a.test", "--cacert", caFile)
	check("localhost with rules", "", "https://localhost/", "localhost", "--cacert", caFile)

	// Through an upstream SOCKS5 proxy: an address is judged before it is
	// handed to the proxy.
	tunnel := network.Policy{AllowInternet: true, AllowOut: []string{"0.0.0.0/0"}, Upstream: &network.Upstream{Address: tn.Socks, Username: "alice", Password: "pw"}}
	if err := l.UpdatePolicy(context.Background(), id, tunnel); err != nil {
		t.Fatal(err)
	}
	check("an internet address through the upstream", "200", "http://"+tn.Addr+":8080/", "")
	check("another sandbox through the upstream", "", "http://"+victimAddr.String()+"/", "")

	for i, n := range hostHits {
		if n.Load() != 0 {
			t.Errorf("the host's loopback listener %d got %d connections", i, n.Load())
		}
	}
	if n := victimHits.Load() - 1; n != 0 {
		t.Errorf("the other sandbox got %d connections", n)
	}
}
