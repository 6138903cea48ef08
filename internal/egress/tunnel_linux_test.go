//go:build linux

package egress_test

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/cubicle-dev/cubicle/internal/network"

	"github.com/cubicle-dev/cubicle/internal/testenv"
)

// udpEcho reports whether a datagram from netns ns to addr:port is echoed.
func udpEcho(t *testing.T, ns, addr, port string) bool {
	t.Helper()
	var ok bool
	if err := network.RunInNetns(ns, func() error {
		c, err := net.Dial("udp4", net.JoinHostPort(addr, port))
		if err != nil {
			return err
		}
		defer c.Close()
		buf := make([]byte, 64)
		for range 3 { // UDP may drop one; three tries are enough
			if _, err := c.Write([]byte("ping")); err != nil {
				return nil
			}
			_ = c.SetReadDeadline(time.Now().Add(time.Second))
			if n, err := c.Read(buf); err == nil && string(buf[:n]) == "echo ping" {
				ok = true
				return nil
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return ok
}

// lookup asks the DNS server at addr:53 from netns ns for name's A record.
func lookup(t *testing.T, ns, proto, addr, name string) (netip.Addr, int) {
	t.Helper()
	var a netip.Addr
	rcode := -1
	_ = network.RunInNetns(ns, func() error {
		m := new(dns.Msg)
		m.SetQuestion(dns.Fqdn(name), dns.TypeA)
		r, _, err := (&dns.Client{Net: proto, Timeout: 2 * time.Second}).Exchange(m, net.JoinHostPort(addr, "53"))
		if err != nil {
			return nil
		}
		rcode = r.Rcode
		for _, rr := range r.Answer {
			if ar, ok := rr.(*dns.A); ok {
				a, _ = netip.AddrFromSlice(ar.A.To4())
			}
		}
		return nil
	})
	return a, rcode
}

// With an egressProxy nothing of the sandbox leaves the host except through
// the upstream: UDP (QUIC) is dropped, DNS is answered by the node (never
// forwarded: the resolver sees no query) with a stand-in address, and a
// connection to it is sent to the upstream by name (SOCKS5 remote DNS).
func TestUpstreamFailsClosedForUDPAndDNS(t *testing.T) {
	testenv.RequireRoot(t, "netns, veth, nftables")
	tn := startTestnetArgs(t, "--socks-user", "alice", "--socks-pass", "pw")
	l, _ := startManager(t, testConfig(t, netip.MustParseAddr(tn.DNS)))
	const id = "tunneludp1"
	ep, err := l.Setup(context.Background(), id, network.Policy{AllowInternet: true})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = l.Teardown(context.Background(), id) }()
	ns := ep.NetNSPath

	// Controls, without an upstream: UDP and DNS reach the "internet".
	if !udpEcho(t, ns, tn.Addr, "443") {
		t.Fatal("control: UDP to :443 without an egressProxy")
	}
	before := tn.ctl("dns queries")
	if a, _ := lookup(t, ns, "udp", tn.DNS, "a.test"); a.String() != tn.Addr {
		t.Fatalf("control: a.test resolves to %s without an egressProxy", a)
	}
	if tn.ctl("dns queries") == before {
		t.Fatal("control: the resolver counted no query")
	}

	up := &network.Upstream{Address: tn.Socks, Username: "alice", Password: "pw"}
	if err := l.UpdatePolicy(context.Background(), id, network.Policy{AllowInternet: true, Upstream: up}); err != nil {
		t.Fatal(err)
	}
	for _, port := range []string{"443", "8080"} {
		if udpEcho(t, ns, tn.Addr, port) {
			t.Errorf("UDP to :%s left the host with an egressProxy", port)
		}
	}
	before = tn.ctl("dns queries")
	stand := map[string]netip.Addr{}
	for _, proto := range []string{"udp", "tcp"} {
		for _, name := range []string{"a.test", "b.test", "no-such.example"} {
			a, rcode := lookup(t, ns, proto, tn.DNS, name)
			if rcode != dns.RcodeSuccess || !a.IsValid() || a.String() == tn.Addr {
				t.Errorf("%s over %s: %s rcode %d, want a stand-in address answered locally", name, proto, a, rcode)
			}
			if prev, ok := stand[name]; ok && prev != a {
				t.Errorf("%s: %s over UDP, %s over TCP", name, prev, a)
			}
			stand[name] = a
		}
	}
	if after := tn.ctl("dns queries"); after != before {
		t.Errorf("the sandbox's DNS was forwarded: the resolver counted %s queries, then %s", before, after)
	}

	// The stand-in address is dialled by name, through the upstream.
	for _, u := range []string{"http://a.test:8080/", "https://a.test/"} {
		code, body := fetch(t, ns, u, "a.test", stand["a.test"].String(), "--cacert", tn.CACert)
		var e echoed
		_ = json.Unmarshal([]byte(body), &e)
		if code != "200" || !strings.HasPrefix(e.Remote, tn.Addr+":") {
			t.Errorf("%s at its stand-in address: %s %q, want 200 through the upstream", u, code, e.Remote)
		}
	}
	resp, err := http.Get(tn.SocksLog)
	if err != nil {
		t.Fatalf("socks log: %v", err)
	}
	var log []struct{ Target string }
	err = json.NewDecoder(resp.Body).Decode(&log)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	var targets []string
	for _, e := range log {
		targets = append(targets, e.Target)
	}
	if all := strings.Join(targets, " "); !strings.Contains(all, "a.test:8080") || !strings.Contains(all, "a.test:443") {
		t.Errorf("the upstream was not asked for the names: %v", targets)
	}

	// The policy still applies to a name behind a stand-in address.
	if err := l.UpdatePolicy(context.Background(), id, network.Policy{AllowOut: []string{"a.test"}, DenyOut: []string{"0.0.0.0/0"}, Upstream: up}); err != nil {
		t.Fatal(err)
	}
	other, _ := lookup(t, ns, "udp", tn.DNS, "b.test")
	if code, _ := fetch(t, ns, "http://b.test:8080/", "b.test", other.String()); code != "" {
		t.Errorf("a name the policy denies, at its stand-in address: %s", code)
	}
	a, _ := lookup(t, ns, "udp", tn.DNS, "a.test")
	if code, _ := fetch(t, ns, "http://a.test:8080/", "a.test", a.String()); code != "200" {
		t.Errorf("the allowed name at its stand-in address: %q", code)
	}
	// dnsServers []: no resolver at all, so every query is refused.
	if err := l.UpdatePolicy(context.Background(), id, network.Policy{AllowOut: []string{"a.test"}, DenyOut: []string{"0.0.0.0/0"}, DNSServers: &[]string{}, Upstream: up}); err != nil {
		t.Fatal(err)
	}
	if _, rcode := lookup(t, ns, "udp", tn.DNS, "a.test"); rcode != dns.RcodeRefused {
		t.Errorf("dnsServers []: rcode %d, want REFUSED", rcode)
	}

	// Without the upstream again, UDP flows.
	if err := l.UpdatePolicy(context.Background(), id, network.Policy{AllowInternet: true}); err != nil {
		t.Fatal(err)
	}
	if !udpEcho(t, ns, tn.Addr, "443") {
		t.Error("UDP after the egressProxy was removed")
	}
}
