//go:build linux

package egress_test

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/cubicle-dev/cubicle/internal/egress"
	"github.com/cubicle-dev/cubicle/internal/network"
	"github.com/cubicle-dev/cubicle/internal/servecert"
	"github.com/cubicle-dev/cubicle/internal/testenv"
)

// echoed is what the testnet echo servers answer.
type echoed struct {
	Host    string              `json:"host"`
	Headers map[string][]string `json:"headers"`
	Remote  string              `json:"remote"`
	TLS     bool                `json:"tls"`
}

// fetch runs curl in ns and returns the status and body ("" status when
// the connection failed). The name resolves to ip.
func fetch(t *testing.T, ns, url, host, ip string, extra ...string) (string, string) {
	t.Helper()
	args := []string{"--net=" + ns, "curl", "-sS", "-m", "5", "-w", "\n%{http_code}"}
	if host != "" {
		args = append(args, "--resolve", host+":443:"+ip, "--resolve", host+":80:"+ip, "--resolve", host+":8080:"+ip)
	}
	args = append(args, extra...)
	out, _ := exec.Command("nsenter", append(args, url)...).Output()
	s := strings.TrimSpace(string(out))
	i := strings.LastIndexByte(s, '\n')
	code := s[i+1:]
	if code == "000" {
		code = ""
	}
	if i < 0 {
		return code, ""
	}
	return code, s[:i]
}

// interceptionCA makes an interception CA and writes its certificate
// where curl in a sandbox netns can be told to trust it.
func interceptionCA(t *testing.T) (*servecert.CA, string) {
	t.Helper()
	ca, err := servecert.LoadOrCreateCA(t.TempDir(), "egress test CA")
	if err != nil {
		t.Fatal(err)
	}
	caFile := filepath.Join(t.TempDir(), "egress-ca.pem")
	if err := os.WriteFile(caFile, ca.PEM(), 0o644); err != nil {
		t.Fatal(err)
	}
	return ca, caFile
}

// resolvesIn reports whether a.test resolves from netns ns through the
// DNS server at addr over proto ("udp" or "tcp").
func resolvesIn(ns, proto, addr string) bool {
	var ok bool
	_ = network.RunInNetns(ns, func() error {
		m := new(dns.Msg)
		m.SetQuestion("a.test.", dns.TypeA)
		r, _, err := (&dns.Client{Net: proto, Timeout: 2 * time.Second}).Exchange(m, net.JoinHostPort(addr, "53"))
		ok = err == nil && len(r.Answer) == 1
		return nil
	})
	return ok
}

func TestTransformRules(t *testing.T) {
	testenv.RequireRoot(t, "netns, veth, nftables")
	tn := startTestnet(t)
	ca, caFile := interceptionCA(t)
	testnetCA, err := os.ReadFile(tn.CACert)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(testnetCA)
	var mu sync.Mutex
	secrets := map[string]string{"api-key": "s3cr3t-value"}
	lookup := func(_ context.Context, sandbox, name string) (string, error) {
		mu.Lock()
		defer mu.Unlock()
		if sandbox != "rulestest1" {
			return "", fmt.Errorf("asked for sandbox %q", sandbox)
		}
		if v, ok := secrets[name]; ok {
			return v, nil
		}
		return "", errors.New("no such secret")
	}
	l, _ := startManager(t, testConfig(t, netip.MustParseAddr(tn.DNS)), egress.WithInterception(ca, roots, lookup))
	const id = "rulestest1"
	pol := network.Policy{AllowOut: []string{"api.test", "*.w.test", "plain.test"}, DenyOut: []string{"0.0.0.0/0"},
		Rules: map[string][]network.Rule{
			"api.test":  {{Headers: map[string]string{"X-Api-Key": "Bearer ${e2b.secrets.api-key}", "X-Static": "one"}}, {Headers: map[string]string{"X-Static": "two"}}},
			"*.w.test":  {{Headers: map[string]string{"X-Wild": "yes"}}},
			"gone.test": {{Headers: map[string]string{"X-Gone": "${e2b.secrets.missing}"}}},
			"x.w.test":  {{Headers: map[string]string{"X-Exact": "wins"}}},
		}}
	ep, err := l.Setup(context.Background(), id, pol)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = l.Teardown(context.Background(), id) }()
	ns := ep.NetNSPath

	get := func(url, host string, extra ...string) (string, echoed) {
		t.Helper()
		code, body := fetch(t, ns, url, host, tn.Addr, append([]string{"--cacert", caFile}, extra...)...)
		var e echoed
		if code == "200" {
			if err := json.Unmarshal([]byte(body), &e); err != nil {
				t.Fatalf("%s: %v: %s", url, err, body)
			}
		}
		return code, e
	}
	// The secret is filled in by the proxy and replaces what the sandbox
	// sent; later rules of the list override earlier ones.
	code, e := get("https://api.test/v1", "api.test", "-H", "X-Api-Key: from-the-sandbox")
	if code != "200" || http.Header(e.Headers).Get("X-Api-Key") != "Bearer s3cr3t-value" || http.Header(e.Headers).Get("X-Static") != "two" || !e.TLS {
		t.Fatalf("transformed request: %s %+v", code, e)
	}
	if v := http.Header(e.Headers).Values("X-Api-Key"); len(v) != 1 {
		t.Errorf("X-Api-Key sent %d times: %v", len(v), v)
	}
	// Keep-alive: every request of the connection is transformed.
	_, body := fetch(t, ns, "https://api.test/a", "api.test", tn.Addr, "--cacert", caFile, "https://api.test/b")
	if n := strings.Count(body, `"X-Api-Key":["Bearer s3cr3t-value"]`); n != 2 {
		t.Errorf("two requests on one connection: %d transformed:\n%s", n, body)
	}
	// A sandbox cannot strip the rule's header as hop-by-hop, nor have it
	// echoed back by TRACE.
	if code, e := get("https://api.test/", "api.test", "-H", "Connection: X-Api-Key"); code != "200" || http.Header(e.Headers).Get("X-Api-Key") != "Bearer s3cr3t-value" {
		t.Errorf("Connection: X-Api-Key: %s %+v", code, e.Headers)
	}
	if code, _ := get("https://api.test/", "api.test", "-X", "TRACE"); code != "405" {
		t.Errorf("TRACE: %s, want 405", code)
	}
	// The most specific key wins and sets are not merged.
	if code, e := get("https://x.w.test/", "x.w.test"); code != "200" || http.Header(e.Headers).Get("X-Exact") != "wins" || http.Header(e.Headers).Get("X-Wild") != "" {
		t.Errorf("exact over wildcard: %s %+v", code, e.Headers)
	}
	if code, e := get("https://y.w.test/", "y.w.test"); code != "200" || http.Header(e.Headers).Get("X-Wild") != "yes" {
		t.Errorf("wildcard rule: %s %+v", code, e.Headers)
	}
	// A Host that is not the SNI's name gets none of its rules.
	if code, _ := get("https://api.test/", "api.test", "-H", "Host: other.test"); code != "421" {
		t.Errorf("Host other than the SNI: %s, want 421", code)
	}
	// Hosts without rules are not intercepted: the sandbox sees the real
	// server's certificate, which the interception CA did not issue.
	if code, _ := get("https://plain.test/", "plain.test"); code != "" {
		t.Errorf("a host without rules was intercepted: %s", code)
	}
	if code, _ := fetch(t, ns, "https://plain.test/", "plain.test", tn.Addr, "--cacert", tn.CACert); code != "200" {
		t.Errorf("a host without rules, real certificate: %s", code)
	}
	// Rules do not allow: gone.test is not in allowOut.
	if code, _ := get("https://gone.test/", "gone.test"); code != "" {
		t.Errorf("a rule host outside allowOut: %s", code)
	}
	// A secret that cannot be read: 502, nothing forwarded.
	if err := l.UpdatePolicy(context.Background(), id, network.Policy{AllowOut: []string{"gone.test", "api.test"}, DenyOut: []string{"0.0.0.0/0"},
		Rules: map[string][]network.Rule{"gone.test": {{Headers: map[string]string{"X-Gone": "${e2b.secrets.missing}"}}},
			"api.test": {{Headers: map[string]string{"X-Api-Key": "v2 ${e2b.secrets.api-key}"}}}}}); err != nil {
		t.Fatal(err)
	}
	if code, _ := get("https://gone.test/", "gone.test"); code != "502" {
		t.Errorf("missing secret: %s, want 502", code)
	}
	// Updates apply to the next request; a changed secret value too.
	mu.Lock()
	secrets["api-key"] = "rotated"
	mu.Unlock()
	if code, e := get("https://api.test/", "api.test"); code != "200" || http.Header(e.Headers).Get("X-Api-Key") != "v2 rotated" {
		t.Errorf("after update: %s %+v", code, e.Headers)
	}
	// Plain HTTP is not transformed by HTTPS rules: a secret would travel in
	// the clear.
	code, body = fetch(t, ns, "http://api.test/", "api.test", tn.Addr)
	if code != "200" || strings.Contains(body, "rotated") {
		t.Errorf("plain HTTP: %s %s", code, body)
	}

	// Unless a rule says it is for plain HTTP (CubeSandbox's scheme "http"):
	// then its headers are set on each request to the host, and only there.
	if err := l.UpdatePolicy(context.Background(), id, network.Policy{AllowOut: []string{"api.test", "gone.test"}, DenyOut: []string{"0.0.0.0/0"},
		Rules: map[string][]network.Rule{
			"api.test":  {{Headers: map[string]string{"X-Tls": "tls"}}, {Headers: map[string]string{"X-Api-Key": "plain ${e2b.secrets.api-key}"}, Plain: true}},
			"gone.test": {{Headers: map[string]string{"X-Gone": "${e2b.secrets.missing}"}, Plain: true}},
		}}); err != nil {
		t.Fatal(err)
	}
	plainGet := func(url, host string, extra ...string) (string, echoed) {
		t.Helper()
		code, body := fetch(t, ns, url, host, tn.Addr, extra...)
		var e echoed
		if code == "200" {
			if err := json.Unmarshal([]byte(body), &e); err != nil {
				t.Fatalf("%s: %v: %s", url, err, body)
			}
		}
		return code, e
	}
	if code, e := plainGet("http://api.test/p", "api.test", "-H", "X-Api-Key: from-the-sandbox", "-H", "Connection: X-Api-Key"); code != "200" ||
		http.Header(e.Headers).Values("X-Api-Key")[0] != "plain rotated" || len(http.Header(e.Headers).Values("X-Api-Key")) != 1 || http.Header(e.Headers).Get("X-Tls") != "" || e.TLS {
		t.Errorf("plain rule on plain HTTP: %s %+v", code, e)
	}
	_, body = fetch(t, ns, "http://api.test/a", "api.test", tn.Addr, "http://api.test/b")
	if n := strings.Count(body, `"X-Api-Key":["plain rotated"]`); n != 2 {
		t.Errorf("two plain requests on one connection: %d transformed:\n%s", n, body)
	}
	if code, e := get("https://api.test/", "api.test"); code != "200" || http.Header(e.Headers).Get("X-Tls") != "tls" || http.Header(e.Headers).Get("X-Api-Key") != "" {
		t.Errorf("HTTPS with a plain rule beside: %s %+v", code, e.Headers)
	}
	if code, _ := plainGet("http://api.test/", "api.test", "-X", "TRACE"); code != "405" {
		t.Errorf("plain TRACE: %s, want 405", code)
	}
	if code, _ := plainGet("http://gone.test/", "gone.test"); code != "502" {
		t.Errorf("plain rule, missing secret: %s, want 502", code)
	}
	// A host with only plain rules is not intercepted on HTTPS.
	if code, _ := fetch(t, ns, "https://gone.test/", "gone.test", tn.Addr, "--cacert", tn.CACert); code != "200" {
		t.Errorf("HTTPS to a host with only plain rules, real certificate: %s", code)
	}
}

// CubeSandbox's custom L7 ports: a rule with a port applies on that port
// only, the node redirects the port to the proxy for the sandbox (and stops
// when the rule goes), and an IP address keys plain-HTTP rules.
func TestTransformRulesOnCustomPorts(t *testing.T) {
	testenv.RequireRoot(t, "netns, veth, nftables")
	tn := startTestnet(t)
	ca, _ := interceptionCA(t)
	lookup := func(_ context.Context, _, name string) (string, error) { return "", errors.New("no secrets here") }
	l, _ := startManager(t, testConfig(t, netip.MustParseAddr(tn.DNS)), egress.WithInterception(ca, x509.NewCertPool(), lookup))
	const id = "rulesport1"
	pol := network.Policy{AllowOut: []string{"api.test", tn.Addr + "/32"}, DenyOut: []string{"0.0.0.0/0"},
		Rules: map[string][]network.Rule{
			"api.test": {{Headers: map[string]string{"X-Custom": "on-8080"}, Plain: true, Port: 8080}},
			tn.Addr:    {{Headers: map[string]string{"X-By-Ip": "yes"}, Plain: true, Port: 8080}},
		}}
	if got := pol.RulePorts(); len(got) != 1 || got[0] != 8080 {
		t.Fatalf("RulePorts %v", got)
	}
	ep, err := l.Setup(context.Background(), id, pol)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = l.Teardown(context.Background(), id) }()
	ns := ep.NetNSPath
	get := func(url, host string) (string, http.Header) {
		t.Helper()
		code, body := fetch(t, ns, url, host, tn.Addr)
		var e echoed
		if code == "200" {
			if err := json.Unmarshal([]byte(body), &e); err != nil {
				t.Fatalf("%s: %v: %s", url, err, body)
			}
		}
		return code, http.Header(e.Headers)
	}
	if code, h := get("http://api.test:8080/x", "api.test"); code != "200" || h.Get("X-Custom") != "on-8080" {
		t.Fatalf("rule on its port: %s %v", code, h)
	}
	if code, h := get("http://api.test/x", "api.test"); code != "200" || h.Get("X-Custom") != "" {
		t.Fatalf("the rule's host on port 80: %s %v", code, h)
	}
	if code, h := get("http://"+tn.Addr+":8080/x", ""); code != "200" || h.Get("X-By-Ip") != "yes" || h.Get("X-Custom") != "" {
		t.Fatalf("IP-keyed rule: %s %v", code, h)
	}
	// Without the rule, port 8080 is not redirected any more: the address
	// rules decide, and nothing is added.
	pol.Rules = map[string][]network.Rule{"api.test": {{Headers: map[string]string{"X-Custom": "on-80"}, Plain: true}}}
	if err := l.UpdatePolicy(context.Background(), id, pol); err != nil {
		t.Fatal(err)
	}
	if code, h := get("http://"+tn.Addr+":8080/x", ""); code != "200" || h.Get("X-By-Ip") != "" {
		t.Fatalf("after the port's rule went: %s %v", code, h)
	}
	if code, h := get("http://api.test/x", "api.test"); code != "200" || h.Get("X-Custom") != "on-80" {
		t.Fatalf("a port-80 rule after the update: %s %v", code, h)
	}
	// And back: the update adds the redirect again.
	pol.Rules = map[string][]network.Rule{tn.Addr: {{Headers: map[string]string{"X-By-Ip": "again"}, Plain: true, Port: 8080}}}
	if err := l.UpdatePolicy(context.Background(), id, pol); err != nil {
		t.Fatal(err)
	}
	if code, h := get("http://"+tn.Addr+":8080/x", ""); code != "200" || h.Get("X-By-Ip") != "again" {
		t.Fatalf("the port's rule again: %s %v", code, h)
	}
}

// The proxy verifies the real server before sending it anything: an
// untrusted certificate is a 502 and the secret never leaves.
func TestTransformRulesVerifyUpstream(t *testing.T) {
	testenv.RequireRoot(t, "netns, veth, nftables")
	tn := startTestnet(t)
	ca, caFile := interceptionCA(t)
	lookup := func(context.Context, string, string) (string, error) { return "v", nil }
	// Roots without the testnet CA.
	l, _ := startManager(t, testConfig(t, netip.MustParseAddr(tn.DNS)), egress.WithInterception(ca, x509.NewCertPool(), lookup))
	const id = "rulestest2"
	ep, err := l.Setup(context.Background(), id, network.Policy{AllowOut: []string{"api.test"}, DenyOut: []string{"0.0.0.0/0"},
		Rules: map[string][]network.Rule{"api.test": {{Headers: map[string]string{"X-Key": "${e2b.secrets.k}"}}}}})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = l.Teardown(context.Background(), id) }()
	if code, _ := fetch(t, ep.NetNSPath, "https://api.test/", "api.test", tn.Addr, "--cacert", caFile); code != "502" {
		t.Errorf("untrusted upstream: %s, want 502", code)
	}
}

func TestUpstreamSOCKS5(t *testing.T) {
	testenv.RequireRoot(t, "netns, veth, nftables")
	tn := startTestnetArgs(t, "--socks-user", "alice", "--socks-pass", "pw")
	l, _ := startManager(t, testConfig(t, netip.MustParseAddr(tn.DNS)))
	const id = "sockstest1"
	up := &network.Upstream{Address: tn.Socks, Username: "alice", Password: "pw"}
	ep, err := l.Setup(context.Background(), id, network.Policy{AllowInternet: true, Upstream: up})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = l.Teardown(context.Background(), id) }()
	ns := ep.NetNSPath
	viaProxy := func(what, url, host string) {
		t.Helper()
		code, body := fetch(t, ns, url, host, tn.Addr, "--cacert", tn.CACert)
		var e echoed
		_ = json.Unmarshal([]byte(body), &e)
		// Through the SOCKS server the echo sees the fixture's own address;
		// directly it would see the host's side of the veth.
		if code != "200" || !strings.HasPrefix(e.Remote, tn.Addr+":") {
			t.Errorf("%s: %s %q, want 200 from %s", what, code, e.Remote, tn.Addr)
		}
	}
	viaProxy("HTTP", "http://a.test/", "a.test")
	viaProxy("HTTPS", "https://a.test/", "a.test")
	viaProxy("another port", "http://a.test:8080/", "a.test")
	viaProxy("IP literal", "http://"+tn.Addr+":8080/", "")

	// Down: connections fail, never bypass.
	if ans := tn.ctl("socks stop"); ans != "ok" {
		t.Fatalf("socks stop: %s", ans)
	}
	for _, u := range []string{"http://a.test/", "https://a.test/", "http://a.test:8080/"} {
		if code, _ := fetch(t, ns, u, "a.test", tn.Addr, "--cacert", tn.CACert); code != "" {
			t.Errorf("%s with the proxy down: %s", u, code)
		}
	}
	if ans := tn.ctl("socks start"); ans != "ok" {
		t.Fatalf("socks start: %s", ans)
	}
	viaProxy("HTTP after the proxy is back", "http://a.test/", "a.test")

	// Domains are sent to the proxy by name (remote DNS); what is denied
	// never reaches it.
	if err := l.UpdatePolicy(context.Background(), id, network.Policy{AllowOut: []string{"allowed.test"}, DenyOut: []string{"0.0.0.0/0"}, Upstream: up}); err != nil {
		t.Fatal(err)
	}
	viaProxy("allowed name", "https://allowed.test/", "allowed.test")
	if code, _ := fetch(t, ns, "https://other.test/", "other.test", tn.Addr, "--cacert", tn.CACert); code != "" {
		t.Errorf("denied name through the proxy: %s", code)
	}
	resp, err := http.Get(tn.SocksLog)
	if err != nil {
		t.Fatalf("socks log: %v", err)
	}
	var log []struct{ Target, User string }
	err = json.NewDecoder(resp.Body).Decode(&log)
	resp.Body.Close()
	if err != nil {
		t.Fatalf("socks log: %v", err)
	}
	var targets []string
	for _, e := range log {
		targets = append(targets, e.Target)
		if e.User != "alice" {
			t.Errorf("a CONNECT without the credentials: %+v", e)
		}
	}
	all := strings.Join(targets, " ")
	if !strings.Contains(all, "allowed.test:443") || strings.Contains(all, "other.test") {
		t.Errorf("CONNECT targets: %v", targets)
	}

	// TCP DNS to the node's resolver is answered by the node (never
	// forwarded, TestUpstreamFailsClosedForUDPAndDNS), and refused with
	// dnsServers [].
	tcpDNS := func() bool { return resolvesIn(ns, "tcp", tn.DNS) }
	if !tcpDNS() {
		t.Error("TCP DNS to the resolver through a tunnelled sandbox")
	}
	if err := l.UpdatePolicy(context.Background(), id, network.Policy{AllowOut: []string{"allowed.test"}, DenyOut: []string{"0.0.0.0/0"}, DNSServers: &[]string{}, Upstream: up}); err != nil {
		t.Fatal(err)
	}
	if tcpDNS() {
		t.Error("TCP DNS to the resolver with dnsServers []")
	}

	// Wrong credentials: fails closed.
	if err := l.UpdatePolicy(context.Background(), id, network.Policy{AllowInternet: true, Upstream: &network.Upstream{Address: tn.Socks, Username: "alice", Password: "wrong"}}); err != nil {
		t.Fatal(err)
	}
	if code, _ := fetch(t, ns, "http://a.test/", "a.test", tn.Addr); code != "" {
		t.Errorf("wrong proxy password: %s", code)
	}
}

func TestResolveUpstreamRefusesHostAndInternal(t *testing.T) {
	testenv.RequireRoot(t, "netns, veth, nftables")
	cfg := testConfig(t, netip.MustParseAddr("127.0.0.53"))
	cfg.UpstreamAllow = []netip.Prefix{netip.MustParsePrefix("192.168.77.0/24")}
	l, _ := startManager(t, cfg)
	gw := network.GatewayOf(cfg.Pool)
	for _, a := range []string{"127.0.0.1:1080", "169.254.169.254:80", "10.1.2.3:1080", gw.String() + ":1080", "[::1]:1080", "[2001:db8::1]:1080", "[::ffff:127.0.0.1]:1080", "0.0.0.0:1080", "localhost:1080"} {
		_, err := l.ResolveUpstream(context.Background(), a)
		if !errors.Is(err, network.ErrUpstream) {
			t.Errorf("%s: %v, want ErrUpstream", a, err)
		}
	}
	for _, a := range []string{"192.168.77.9:1080", "198.51.100.7:1080"} {
		if _, err := l.ResolveUpstream(context.Background(), a); err != nil {
			t.Errorf("%s: %v", a, err)
		}
	}
}

// network.dnsServers with domain entries: the default opens the node's
// resolvers on port 53, an empty list opens none, and a list opens all
// traffic to each of its addresses.
func TestDNSServers(t *testing.T) {
	testenv.RequireRoot(t, "netns, veth, nftables")
	tn := startTestnet(t)
	l, _ := newManager(t, netip.MustParseAddr(tn.DNS))
	const id = "dnsservers1"
	base := network.Policy{AllowOut: []string{"allowed.test"}, DenyOut: []string{"0.0.0.0/0"}}
	ep, err := l.Setup(context.Background(), id, base)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = l.Teardown(context.Background(), id) }()
	resolves := func() bool { return resolvesIn(ep.NetNSPath, "udp", tn.DNS) }
	echo := "http://" + tn.Addr + ":8080/"
	if !resolves() {
		t.Error("default: the node's resolver does not answer")
	}
	if code := curl(t, ep.NetNSPath, echo, "", ""); code != "" {
		t.Errorf("default: other traffic to the resolver's address: %q", code)
	}
	none := base
	none.DNSServers = &[]string{}
	if err := l.UpdatePolicy(context.Background(), id, none); err != nil {
		t.Fatal(err)
	}
	if resolves() {
		t.Error("dnsServers []: the node's resolver still answers")
	}
	if code := curl(t, ep.NetNSPath, "https://allowed.test/", "allowed.test", tn.Addr); code != "200" {
		t.Errorf("dnsServers []: allowed name (matched by name): %q", code)
	}
	own := base
	own.DNSServers = &[]string{tn.Addr}
	if err := l.UpdatePolicy(context.Background(), id, own); err != nil {
		t.Fatal(err)
	}
	if !resolves() {
		t.Error("dnsServers [addr]: does not answer")
	}
	if code := curl(t, ep.NetNSPath, echo, "", ""); code != "200" {
		t.Errorf("dnsServers [addr]: all traffic to it: %q", code)
	}
	for _, bad := range [][]string{{"::1"}, {"8.8.8.8/32"}, {"x"}, make([]string, 11)} {
		p := base
		p.DNSServers = &bad
		if err := network.ValidatePolicy(p); !errors.Is(err, network.ErrInvalidPolicy) {
			t.Errorf("dnsServers %q: %v", bad, err)
		}
	}
}
