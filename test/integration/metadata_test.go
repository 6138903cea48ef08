package integration

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"math/big"
	"net"
	"net/netip"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/network"
)

// metadataHost is a stand-in for a cloud's instance metadata service: a
// network namespace the test makes, holding 169.254.169.254 and a control
// address in the benchmarking range (198.19.0.0/16, never routed), both
// with a TCP listener on :80 that counts who connected. It is reached from
// the host over a veth, through a routing table of its own that only the
// server's sandbox pool and the test's own source address use, so the
// host's real metadata route (if any) is never touched.
type metadataHost struct {
	ns       string     // name under /run/netns
	hostAddr netip.Addr // host end of the veth, the host control's source
	meta     netip.Addr // 169.254.169.254
	control  netip.Addr // same namespace, same veth, an ordinary address

	mu   sync.Mutex
	seen map[netip.Addr][]netip.Addr // listener address -> client addresses
}

func ipCmd(t *testing.T, args ...string) {
	t.Helper()
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
	}
}

// newMetadataHost builds the namespace and routes traffic from pool (the
// server's sandbox pool) to it; everything is removed at cleanup.
func newMetadataHost(t *testing.T, pool string) *metadataHost {
	t.Helper()
	b := make([]byte, 3)
	rand.Read(b)
	suffix := hex.EncodeToString(b)
	n, _ := rand.Int(rand.Reader, big.NewInt(250))
	m := &metadataHost{
		ns:       "cbimd" + suffix,
		hostAddr: netip.MustParseAddr("169.254.169.253"),
		meta:     netip.MustParseAddr("169.254.169.254"),
		control:  netip.AddrFrom4([4]byte{198, 19, byte(n.Int64()) + 1, 2}),
		seen:     map[netip.Addr][]netip.Addr{},
	}
	table := fmt.Sprint(20000 + int(b[0])<<4 + int(b[1]&0xf))
	veth := "cbm" + suffix
	ipCmd(t, "netns", "add", m.ns)
	t.Cleanup(func() { exec.Command("ip", "netns", "del", m.ns).Run() })
	// Deleting the namespace deletes the pair; this covers a failure
	// before the peer moved.
	t.Cleanup(func() { exec.Command("ip", "link", "del", veth).Run() })
	ipCmd(t, "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", m.ns)
	// A /32 without a prefix route: the main table stays as it was.
	ipCmd(t, "addr", "add", m.hostAddr.String()+"/32", "dev", veth)
	ipCmd(t, "link", "set", veth, "up")
	ipCmd(t, "-n", m.ns, "link", "set", "lo", "up")
	ipCmd(t, "-n", m.ns, "addr", "add", m.meta.String()+"/32", "dev", "eth0")
	ipCmd(t, "-n", m.ns, "addr", "add", m.control.String()+"/32", "dev", "eth0")
	ipCmd(t, "-n", m.ns, "link", "set", "eth0", "up")
	ipCmd(t, "-n", m.ns, "route", "add", m.hostAddr.String()+"/32", "dev", "eth0")
	ipCmd(t, "-n", m.ns, "route", "add", "default", "via", m.hostAddr.String(), "dev", "eth0")
	ipCmd(t, "route", "add", m.meta.String()+"/32", "dev", veth, "table", table)
	ipCmd(t, "route", "add", m.control.String()+"/32", "dev", veth, "table", table)
	t.Cleanup(func() { exec.Command("ip", "route", "flush", "table", table).Run() })
	for _, from := range []string{pool, m.hostAddr.String()} {
		ipCmd(t, "rule", "add", "from", from, "lookup", table, "pref", table)
		t.Cleanup(func() { exec.Command("ip", "rule", "del", "from", from, "lookup", table, "pref", table).Run() })
	}
	for _, a := range []netip.Addr{m.meta, m.control} {
		var ln net.Listener
		if err := network.RunInNetns("/run/netns/"+m.ns, func() (err error) {
			ln, err = net.Listen("tcp", netip.AddrPortFrom(a, 80).String())
			return err
		}); err != nil {
			t.Fatalf("listen on %s:80 in %s: %v", a, m.ns, err)
		}
		t.Cleanup(func() { ln.Close() })
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				m.mu.Lock()
				m.seen[a] = append(m.seen[a], c.RemoteAddr().(*net.TCPAddr).AddrPort().Addr().Unmap())
				m.mu.Unlock()
				fmt.Fprintln(c, "metadata")
				c.Close()
			}
		}()
	}
	// Positive controls from the host: both listeners answer over the veth.
	for _, a := range []netip.Addr{m.meta, m.control} {
		d := net.Dialer{Timeout: 5 * time.Second, LocalAddr: net.TCPAddrFromAddrPort(netip.AddrPortFrom(m.hostAddr, 0))}
		c, err := d.Dial("tcp", netip.AddrPortFrom(a, 80).String())
		if err != nil {
			t.Fatalf("host control: dial %s:80 in the metadata namespace: %v", a, err)
		}
		c.Close()
	}
	if got := m.waitClients(m.meta, 1); len(got) != 1 {
		t.Fatalf("host control: metadata listener saw %v, want one connection", got)
	}
	return m
}

// waitClients waits (bounded) until the listener on a has seen n
// connections: a client's connect returns before the accept is recorded.
func (m *metadataHost) waitClients(a netip.Addr, n int) []netip.Addr {
	for i := 0; len(m.clients(a)) < n && i < 250; i++ {
		time.Sleep(20 * time.Millisecond)
	}
	return m.clients(a)
}

// clients returns the client addresses the listener on a has seen.
func (m *metadataHost) clients(a netip.Addr) []netip.Addr {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]netip.Addr(nil), m.seen[a]...)
}

// poolOf is the --pool a server was started with.
func (s *server) poolOf(t *testing.T) string {
	t.Helper()
	for i, a := range s.args {
		if a == "--pool" && i+1 < len(s.args) {
			return s.args[i+1]
		}
	}
	t.Fatal("server has no --pool")
	return ""
}
