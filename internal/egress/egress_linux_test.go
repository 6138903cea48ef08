//go:build linux

package egress_test

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/egress"
	"github.com/cubicle-dev/cubicle/internal/network"
	"github.com/cubicle-dev/cubicle/internal/testenv"
)

// The stand-in internet is test/testnet (a netns in 198.18.128.0/17 with a
// DNS server answering every *.test name with its own address, and HTTP/HTTPS
// echo servers); the sandbox is a netns of a real network manager. Nothing
// leaves the machine.

type testnet struct {
	HostAddr, Addr, DNS string
	CACert              string
	Socks, SocksLog     string
	// ctl sends a control line ("socks stop") and returns the answer.
	ctl func(line string) string
}

func startTestnet(t testing.TB, records ...string) testnet {
	t.Helper()
	var args []string
	for _, r := range records {
		args = append(args, "-record", r)
	}
	return startTestnetArgs(t, args...)
}

func startTestnetArgs(t testing.TB, args ...string) testnet {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	root := filepath.Join(filepath.Dir(file), "..", "..")
	bin := filepath.Join(t.TempDir(), "cubicle-testnet")
	if out, err := exec.Command("go", "build", "-C", root, "-o", bin, "./test/testnet").CombinedOutput(); err != nil {
		t.Fatalf("build testnet: %v: %s", err, out)
	}
	cmd := exec.Command(bin, args...)
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		stdin.Close() // the fixture removes its netns, veth and files
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			_ = cmd.Process.Kill()
			<-done
			t.Error("testnet did not exit on stdin close")
		}
	})
	out := bufio.NewReader(stdout)
	line, err := out.ReadString('\n')
	if err != nil {
		t.Fatalf("testnet: %v", err)
	}
	var tn testnet
	if err := json.Unmarshal([]byte(line), &tn); err != nil {
		t.Fatalf("testnet ready line %q: %v", line, err)
	}
	tn.ctl = func(cmd string) string {
		if _, err := io.WriteString(stdin, cmd+"\n"); err != nil {
			t.Fatalf("testnet %s: %v", cmd, err)
		}
		ans, err := out.ReadString('\n')
		if err != nil {
			t.Fatalf("testnet %s: %v", cmd, err)
		}
		return strings.TrimSpace(ans)
	}
	return tn
}

var seq atomic.Int32

func newManager(t testing.TB, resolver netip.Addr) (*network.Linux, *egress.Proxy) {
	t.Helper()
	return startManager(t, testConfig(t, resolver))
}

func testConfig(t testing.TB, resolver netip.Addr) network.Config {
	n := int(seq.Add(1))
	pool := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 251, byte((os.Getpid()*7 + n*13) % 250), 0}), 24)
	b := make([]byte, 2)
	_, _ = rand.Read(b)
	return network.Config{
		Bridge:     "cbe" + hex.EncodeToString(b) + fmt.Sprint(n%10),
		Pool:       pool,
		NetnsDir:   filepath.Join(t.TempDir(), "netns"),
		Table:      fmt.Sprintf("cubicle_egress_test_%d_%d", os.Getpid(), n),
		VethPrefix: "e" + hex.EncodeToString(b),
		Resolvers:  []netip.Addr{resolver},
	}
}

// startManager starts a network manager and its egress proxy on a new port,
// as `cubicle serve` does at each start.
func startManager(t testing.TB, cfg network.Config, opts ...egress.Option) (*network.Linux, *egress.Proxy) {
	t.Helper()
	ln, err := egress.ListenFreebind(netip.AddrPortFrom(network.GatewayOf(cfg.Pool), 0))
	if err != nil {
		t.Fatal(err)
	}
	cfg.EgressPort = uint16(ln.Addr().(*net.TCPAddr).Port)
	pc, err := egress.ListenPacketFreebind(netip.AddrPortFrom(network.GatewayOf(cfg.Pool), cfg.EgressPort))
	if err != nil {
		ln.Close()
		t.Fatal(err)
	}
	opts = append(opts, egress.WithDNS(pc))
	l, err := network.NewLinux(cfg)
	if err != nil {
		ln.Close()
		pc.Close()
		t.Fatalf("NewLinux: %v", err)
	}
	p := egress.New(ln, l, nil, nil, opts...)
	go func() { _ = p.Serve() }()
	t.Cleanup(func() {
		_ = p.Close()
		if err := l.Destroy(context.Background()); err != nil {
			t.Errorf("Destroy: %v", err)
		}
	})
	return l, p
}

// curl runs curl in the sandbox's netns; name resolution is pinned to ip so
// the sandbox's own DNS does not matter. It returns the HTTP status, or ""
// when the connection failed.
func curl(t *testing.T, ns, url, host, ip string, extra ...string) string {
	t.Helper()
	args := []string{"--net=" + ns, "curl", "-sS", "-k", "-m", "5", "-o", "/dev/null", "-w", "%{http_code}"}
	if host != "" {
		args = append(args, "--resolve", host+":443:"+ip, "--resolve", host+":80:"+ip)
	}
	args = append(args, extra...)
	args = append(args, url)
	out, _ := exec.Command("nsenter", args...).Output()
	s := strings.TrimSpace(string(out))
	if s == "000" {
		return ""
	}
	return s
}

func TestDomainPolicy(t *testing.T) {
	testenv.RequireRoot(t, "netns, veth, nftables")
	// rebind.test answers with a host loopback address where this test
	// listens: a name allowed by a domain entry must not reach the host.
	loop, err := net.Listen("tcp4", "127.0.0.77:80")
	if err != nil {
		t.Fatal(err)
	}
	defer loop.Close()
	var hostHits atomic.Int32
	go func() {
		for {
			c, err := loop.Accept()
			if err != nil {
				return
			}
			hostHits.Add(1)
			c.Close()
		}
	}()
	tn := startTestnet(t, "rebind.test=127.0.0.77")
	l, _ := newManager(t, netip.MustParseAddr(tn.DNS))
	const id = "egresstest1"
	ep, err := l.Setup(context.Background(), id, network.Policy{AllowOut: []string{"allowed.test", "rebind.test"}, DenyOut: []string{"0.0.0.0/0"}})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = l.Teardown(context.Background(), id) }()
	ns, addr := ep.NetNSPath, tn.Addr

	check := func(what, want, url, host string, extra ...string) {
		t.Helper()
		if got := curl(t, ns, url, host, addr, extra...); got != want {
			t.Errorf("%s: %s got %q, want %q", what, url, got, want)
		}
	}
	check("allowed name over TLS", "200", "https://allowed.test/", "allowed.test")
	check("allowed name over HTTP", "200", "http://allowed.test/", "allowed.test")
	check("HTTP/2 by SNI", "200", "https://allowed.test/", "allowed.test", "--http2")
	check("other name over TLS", "", "https://other.test/", "other.test")
	check("other name over HTTP", "", "http://other.test/", "other.test")
	check("IP literal over HTTP", "", "http://"+addr+"/", "")
	check("SNI-less TLS", "", "https://"+addr+"/", "")
	check("CONNECT on :80 to another name", "", "https://other.test/", "other.test", "-p", "-x", "http://allowed.test:80")
	check("allowed name resolving to the host", "", "http://rebind.test/", "rebind.test")
	if n := hostHits.Load(); n != 0 {
		t.Errorf("the host's loopback got %d connections", n)
	}

	// A later request on a kept-alive connection naming another host: the
	// first is answered, the second never reaches a server.
	raw := "GET /1 HTTP/1.1\r\nHost: allowed.test\r\n\r\nGET /2 HTTP/1.1\r\nHost: other.test\r\n\r\n"
	out, _ := exec.Command("nsenter", "--net="+ns, "bash", "-c",
		fmt.Sprintf(`exec 3<>/dev/tcp/%s/80; printf '%s' >&3; timeout 5 cat <&3`, addr, raw)).Output()
	if n := strings.Count(string(out), "HTTP/1.1 200"); n != 1 || strings.Contains(string(out), "other.test") {
		t.Errorf("pipelined requests for two hosts: %d answers:\n%s", n, out)
	}

	// Runtime update: wildcards, effective on the next connection.
	if err := l.UpdatePolicy(context.Background(), id, network.Policy{AllowOut: []string{"*.w.test"}, DenyOut: []string{"0.0.0.0/0"}}); err != nil {
		t.Fatal(err)
	}
	check("wildcard subdomain", "200", "https://a.w.test/", "a.w.test")
	check("deep wildcard subdomain", "200", "http://b.a.w.test/", "b.a.w.test")
	check("wildcard apex", "", "https://w.test/", "w.test")
	check("previously allowed name", "", "https://allowed.test/", "allowed.test")

	// A domain deny with internet access: only that name is blocked.
	if err := l.UpdatePolicy(context.Background(), id, network.Policy{AllowInternet: true, DenyOut: []string{"blocked.test"}}); err != nil {
		t.Fatal(err)
	}
	check("denied name", "", "https://blocked.test/", "blocked.test")
	check("other name with internet", "200", "https://fine.test/", "fine.test")
	// Allow wins over deny.
	if err := l.UpdatePolicy(context.Background(), id, network.Policy{AllowOut: []string{"x.test"}, DenyOut: []string{"x.test", "0.0.0.0/0"}}); err != nil {
		t.Fatal(err)
	}
	check("allow over deny", "200", "https://x.test/", "x.test")

	// Back to IP rules only: no redirect, the chain decides.
	if err := l.UpdatePolicy(context.Background(), id, network.Policy{AllowOut: []string{addr}, DenyOut: []string{"0.0.0.0/0"}}); err != nil {
		t.Fatal(err)
	}
	check("IP allow without domains", "200", "https://any.test/", "any.test")
}

// After a restart (a new manager over the same table, a proxy on a new port)
// a sandbox's domain policy is still enforced: the rebuilt table redirects
// it to the new proxy.
func TestDomainPolicySurvivesRestart(t *testing.T) {
	testenv.RequireRoot(t, "netns, veth, nftables")
	tn := startTestnet(t)
	cfg := testConfig(t, netip.MustParseAddr(tn.DNS))
	l1, p1 := startManager(t, cfg)
	const id = "egressrestart1"
	ep, err := l1.Setup(context.Background(), id, network.Policy{AllowOut: []string{"allowed.test"}, DenyOut: []string{"0.0.0.0/0"}})
	if err != nil {
		t.Fatal(err)
	}
	_ = p1.Close() // the old serve is gone
	l2, _ := startManager(t, cfg)
	defer func() { _ = l2.Teardown(context.Background(), id) }()
	if got := curl(t, ep.NetNSPath, "https://allowed.test/", "allowed.test", tn.Addr); got != "200" {
		t.Errorf("allowed name after restart: %q", got)
	}
	if got := curl(t, ep.NetNSPath, "https://other.test/", "other.test", tn.Addr); got != "" {
		t.Errorf("other name after restart: %q", got)
	}
	if got := curl(t, ep.NetNSPath, "http://"+tn.Addr+"/", "", ""); got != "" {
		t.Errorf("IP literal after restart: %q", got)
	}
}
