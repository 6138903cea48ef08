//go:build linux

package network

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/cubicle-dev/cubicle/internal/testenv"
)

// All test traffic stays on this machine: sandbox netns, a fake "external"
// netns in the benchmarking range 198.18.0.0/15, and loopback/bridge.

var testSeq atomic.Int32

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func requireRoot(t *testing.T) {
	t.Helper()
	testenv.RequireRoot(t, "netns, veth, nftables")
}

// testConfig returns a config that cannot collide with a running
// `cubicle serve`: own bridge, table, veth prefix, netns dir and pool.
func testConfig(t *testing.T, poolBits int) Config {
	t.Helper()
	n := int(testSeq.Add(1))
	third := (os.Getpid()*7 + n*13) % 250
	return Config{
		Bridge:     "cbt" + randHex(4),
		Pool:       netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 250, byte(third), 0}), poolBits),
		NetnsDir:   filepath.Join(t.TempDir(), "netns"),
		Table:      fmt.Sprintf("cubicle_test_%d_%d", os.Getpid(), n),
		VethPrefix: "x" + randHex(2), // per config, so concurrent test runs never share veth names
		// serve's defaults, so every test runs with the flow limits in place.
		MaxFlows: 2048, NewFlowRate: 100,
	}
}

func newTestManager(t *testing.T, cfg Config) *Linux {
	t.Helper()
	requireRoot(t)
	l, err := NewLinux(cfg)
	if err != nil {
		t.Fatalf("NewLinux: %v", err)
	}
	t.Cleanup(func() {
		if err := l.Destroy(context.Background()); err != nil {
			t.Errorf("Destroy: %v", err)
		}
		if _, err := netlink.LinkByName(cfg.Bridge); err == nil {
			t.Errorf("bridge %s left behind", cfg.Bridge)
		}
		c, _ := nftables.New()
		for _, fam := range []nftables.TableFamily{nftables.TableFamilyINet, nftables.TableFamilyBridge} {
			if tableExists(c, cfg.Table, fam) {
				t.Errorf("table %s family %v left behind", cfg.Table, fam)
			}
		}
	})
	return l
}

// extHost is a fake external host: its own netns reached from the host
// netns over a dedicated veth in 198.18.x.0/30 (never publicly routed).
type extHost struct {
	path   string
	link   string     // host side interface
	hostIP netip.Addr // host side of the link (masquerade source)
	ip     netip.Addr // the external host
}

func newExtHost(t *testing.T) *extHost {
	t.Helper()
	n := byte(testSeq.Add(1))
	return newExtHostAt(t, netip.AddrFrom4([4]byte{198, 18, n, 1}), netip.AddrFrom4([4]byte{198, 18, n, 2}))
}

// newExtHostAt is newExtHost on a /30 of the caller's choosing (a
// link-local or private "neighbour" of the host, say).
func newExtHostAt(t *testing.T, hostIP, ip netip.Addr) *extHost {
	t.Helper()
	e := &extHost{
		path:   filepath.Join(t.TempDir(), "ext"+randHex(2)),
		hostIP: hostIP,
		ip:     ip,
	}
	name := "cbe" + randHex(4)
	e.link = name
	if err := createNetns(e.path); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if lk, err := netlink.LinkByName(name); err == nil {
			_ = netlink.LinkDel(lk)
		}
		if err := deleteNetns(e.path); err != nil {
			t.Error(err)
		}
	})
	ns, err := netns.GetFromPath(e.path)
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: "eth0", PeerNamespace: netlink.NsFd(int(ns))}); err != nil {
		t.Fatal(err)
	}
	host, err := netlink.LinkByName(name)
	if err != nil {
		t.Fatal(err)
	}
	mask := net.CIDRMask(30, 32)
	if err := netlink.AddrAdd(host, &netlink.Addr{IPNet: &net.IPNet{IP: e.hostIP.AsSlice(), Mask: mask}}); err != nil {
		t.Fatal(err)
	}
	if err := netlink.LinkSetUp(host); err != nil {
		t.Fatal(err)
	}
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	eth, err := h.LinkByName("eth0")
	if err != nil {
		t.Fatal(err)
	}
	if err := h.AddrAdd(eth, &netlink.Addr{IPNet: &net.IPNet{IP: e.ip.AsSlice(), Mask: mask}}); err != nil {
		t.Fatal(err)
	}
	if err := h.LinkSetUp(eth); err != nil {
		t.Fatal(err)
	}
	if err := waitOperUp(netlink.LinkByName, name); err != nil {
		t.Fatal(err)
	}
	if err := waitOperUp(h.LinkByName, "eth0"); err != nil {
		t.Fatal(err)
	}
	return e
}

// listen starts a TCP server in the netns at nsPath ("" = host) that writes
// the client's address and closes. Returns "ip:port".
func listen(t *testing.T, nsPath string, ip netip.Addr) string {
	t.Helper()
	return listenAt(t, nsPath, netip.AddrPortFrom(ip, 0))
}

// listenAt is listen on a given port.
func listenAt(t *testing.T, nsPath string, ap netip.AddrPort) string {
	t.Helper()
	var ln net.Listener
	open := func() (err error) {
		ln, err = net.Listen("tcp", ap.String())
		return err
	}
	var err error
	if nsPath == "" {
		err = open()
	} else {
		err = RunInNetns(nsPath, open)
	}
	if err != nil {
		t.Fatalf("listen %s in %q: %v", ap, nsPath, err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			fmt.Fprintf(c, "%s\n", c.RemoteAddr())
			c.Close()
		}
	}()
	return ln.Addr().String()
}

// dial connects from nsPath ("" = host) to target, optionally from a given
// local address, and returns the remote-address line the server sent.
// Negative checks use a 1 s timeout (a dropped SYN never gets through);
// positive ones 2 s, which covers one SYN retransmission on a loaded host.
func dial(nsPath, target string, local netip.Addr) (string, error) {
	return dialTimeout(nsPath, target, local, time.Second)
}

func dialTimeout(nsPath, target string, local netip.Addr, timeout time.Duration) (string, error) {
	var line string
	do := func() error {
		d := net.Dialer{Timeout: timeout}
		if local.IsValid() {
			d.LocalAddr = &net.TCPAddr{IP: local.AsSlice()}
		}
		c, err := d.Dial("tcp", target)
		if err != nil {
			return err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(2 * time.Second))
		line, err = bufio.NewReader(c).ReadString('\n')
		return err
	}
	var err error
	if nsPath == "" {
		err = do()
	} else {
		err = RunInNetns(nsPath, do)
	}
	return strings.TrimSpace(line), err
}

func mustConnect(t *testing.T, what, nsPath, target string) string {
	t.Helper()
	line, err := dialTimeout(nsPath, target, netip.Addr{}, 2*time.Second)
	if err != nil {
		t.Fatalf("%s: expected connection to %s, got %v", what, target, err)
	}
	return line
}

func mustFail(t *testing.T, what, nsPath, target string) {
	t.Helper()
	if line, err := dial(nsPath, target, netip.Addr{}); err == nil {
		t.Fatalf("%s: connection to %s unexpectedly succeeded (server saw %s)", what, target, line)
	}
}

func setup(t *testing.T, l *Linux, id string, p Policy) Endpoint {
	t.Helper()
	ep, err := l.Setup(context.Background(), id, p)
	if err != nil {
		t.Fatalf("Setup %s: %v", id, err)
	}
	return ep
}

func TestRunInNetnsRestoresThread(t *testing.T) {
	requireRoot(t)
	before, err := netns.Get()
	if err != nil {
		t.Fatal(err)
	}
	defer before.Close()
	p := filepath.Join(t.TempDir(), "ns")
	if err := createNetns(p); err != nil {
		t.Fatal(err)
	}
	defer deleteNetns(p)
	var inside string
	if err := RunInNetns(p, func() error {
		cur, err := netns.Get()
		if err != nil {
			return err
		}
		defer cur.Close()
		inside = cur.UniqueId()
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if inside == before.UniqueId() {
		t.Fatal("fn did not run in the target netns")
	}
	for i := 0; i < 20; i++ { // threads are reused; all must be in the host netns
		cur, _ := netns.Get()
		if !cur.Equal(before) {
			t.Fatal("a thread was left in another netns")
		}
		cur.Close()
	}
	sentinel := errors.New("x")
	if err := RunInNetns(p, func() error { return sentinel }); !errors.Is(err, sentinel) {
		t.Fatalf("fn error not returned: %v", err)
	}
}

func TestConnectivityAndIsolation(t *testing.T) {
	cfg := testConfig(t, 24)
	l := newTestManager(t, cfg)
	ext := newExtHost(t)
	a := setup(t, l, "sbxa"+randHex(4), Policy{AllowInternet: true})
	b := setup(t, l, "sbxb"+randHex(4), Policy{AllowInternet: true})
	if a.Addr == b.Addr || !cfg.Pool.Contains(a.Addr) || a.Gateway != cfg.Pool.Addr().Next() {
		t.Fatalf("bad addresses: a=%v b=%v gw=%v", a.Addr, b.Addr, a.Gateway)
	}
	aSrv := listen(t, a.NetNSPath, a.Addr)
	bSrv := listen(t, b.NetNSPath, b.Addr)
	hostSrv := listen(t, "", a.Gateway)
	extSrv := listen(t, ext.path, ext.ip)

	if got := mustConnect(t, "host->A", "", aSrv); !strings.HasPrefix(got, a.Gateway.String()+":") {
		t.Fatalf("host->A source %s, want gateway", got)
	}
	mustConnect(t, "host->B", "", bSrv)
	mustFail(t, "A->B", a.NetNSPath, bSrv)
	mustFail(t, "B->A", b.NetNSPath, aSrv)
	mustFail(t, "A->host service on gateway", a.NetNSPath, hostSrv)
	// Host addresses on other interfaces are host services too.
	mustFail(t, "A->host service on other iface", a.NetNSPath, listen(t, "", ext.hostIP))
	if got := mustConnect(t, "A->external", a.NetNSPath, extSrv); !strings.HasPrefix(got, ext.hostIP.String()+":") {
		t.Fatalf("external saw %s, want masqueraded %s", got, ext.hostIP)
	}

	// Anti-spoofing: a second address inside A (another pool address)
	// must not get out, neither to the external host nor to B.
	spoof := b.Addr.Next()
	ns, _ := netns.GetFromPath(a.NetNSPath)
	h, _ := netlink.NewHandleAt(ns)
	eth, _ := h.LinkByName("eth0")
	if err := h.AddrAdd(eth, &netlink.Addr{IPNet: &net.IPNet{IP: spoof.AsSlice(), Mask: net.CIDRMask(32, 32)}}); err != nil {
		t.Fatal(err)
	}
	h.Close()
	ns.Close()
	if line, err := dial(a.NetNSPath, extSrv, spoof); err == nil {
		t.Fatalf("spoofed source reached external host (saw %s)", line)
	}
	if _, err := dialTimeout(a.NetNSPath, extSrv, a.Addr, 2*time.Second); err != nil {
		t.Fatalf("real source from A stopped working: %v", err)
	}
}

func TestEgressPolicy(t *testing.T) {
	cfg := testConfig(t, 24)
	l := newTestManager(t, cfg)
	ctx := context.Background()
	ext := newExtHost(t)
	extSrv := listen(t, ext.path, ext.ip)
	c := setup(t, l, "sbxc"+randHex(4), Policy{AllowInternet: false})
	mustFail(t, "no internet", c.NetNSPath, extSrv)

	steps := []struct {
		name string
		p    Policy
		ok   bool
	}{
		{"allowOut /32 without internet", Policy{AllowOut: []string{ext.ip.String()}}, true},
		{"internet with denyOut", Policy{AllowInternet: true, DenyOut: []string{ext.ip.String()}}, false},
		{"internet", Policy{AllowInternet: true}, true},
		{"allow wins over deny", Policy{AllowInternet: true, DenyOut: []string{"198.18.0.0/15"}, AllowOut: []string{ext.ip.String() + "/32"}}, true},
		{"deny cidr", Policy{AllowInternet: true, DenyOut: []string{"198.18.0.0/15"}}, false},
		{"allowOut other host only", Policy{AllowOut: []string{"198.19.255.254"}}, false},
	}
	for _, s := range steps {
		if err := l.UpdatePolicy(ctx, c.ID, s.p); err != nil {
			t.Fatalf("%s: UpdatePolicy: %v", s.name, err)
		}
		if s.ok {
			mustConnect(t, s.name, c.NetNSPath, extSrv)
		} else {
			mustFail(t, s.name, c.NetNSPath, extSrv)
		}
	}
	// AllowOut must never open other sandboxes or the host.
	d := setup(t, l, "sbxd"+randHex(4), Policy{AllowInternet: true})
	dSrv := listen(t, d.NetNSPath, d.Addr)
	hostSrv := listen(t, "", c.Gateway)
	if err := l.UpdatePolicy(ctx, c.ID, Policy{AllowInternet: true, AllowOut: []string{cfg.Pool.String()}}); err != nil {
		t.Fatal(err)
	}
	mustFail(t, "allowOut pool -> other sandbox", c.NetNSPath, dSrv)
	mustFail(t, "allowOut pool -> host", c.NetNSPath, hostSrv)

	if err := l.UpdatePolicy(ctx, "nosuchsandbox", Policy{}); !errors.Is(err, ErrNotFound) {
		t.Fatalf("UpdatePolicy unknown: %v", err)
	}
}

func TestInvalidInput(t *testing.T) {
	l := newTestManager(t, testConfig(t, 24))
	ctx := context.Background()
	if _, err := l.Setup(ctx, "sbxbad", Policy{AllowOut: []string{"not-an-ip"}}); !errors.Is(err, ErrInvalidPolicy) {
		t.Fatalf("Setup invalid policy: %v", err)
	}
	if _, err := l.Setup(ctx, "sbxbad", Policy{DenyOut: []string{"10.0.0.0/33"}}); !errors.Is(err, ErrInvalidPolicy) {
		t.Fatalf("Setup invalid deny: %v", err)
	}
	if _, err := l.Get(ctx, "sbxbad"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("failed Setup left an endpoint: %v", err)
	}
	for _, id := range []string{"", "../x", "a/b", ".hidden"} {
		if _, err := l.Setup(ctx, id, Policy{}); !errors.Is(err, ErrInvalidID) {
			t.Fatalf("Setup id %q: %v", id, err)
		}
	}
	ep := setup(t, l, "sbxok", Policy{})
	if err := l.UpdatePolicy(ctx, ep.ID, Policy{AllowOut: []string{"1.2.3"}}); !errors.Is(err, ErrInvalidPolicy) {
		t.Fatalf("UpdatePolicy invalid: %v", err)
	}
	if _, err := l.Setup(ctx, ep.ID, Policy{}); !errors.Is(err, ErrExists) {
		t.Fatalf("duplicate Setup: %v", err)
	}
	if _, err := NewLinux(Config{Pool: netip.MustParsePrefix("fd00::/64")}); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("IPv6 pool: %v", err)
	}
}

func TestPoolExhaustion(t *testing.T) {
	cfg := testConfig(t, 29) // .0 network, .1 gateway, .7 broadcast: 5 usable
	l := newTestManager(t, cfg)
	ctx := context.Background()
	var eps []Endpoint
	for i := 0; i < 5; i++ {
		eps = append(eps, setup(t, l, fmt.Sprintf("sbxpool%d", i), Policy{}))
	}
	for i, ep := range eps {
		want := cfg.Pool.Addr().Next().Next()
		for j := 0; j < i; j++ {
			want = want.Next()
		}
		if ep.Addr != want {
			t.Fatalf("endpoint %d got %v, want lowest free %v", i, ep.Addr, want)
		}
	}
	if _, err := l.Setup(ctx, "sbxpool5", Policy{}); !errors.Is(err, ErrPoolExhausted) {
		t.Fatalf("6th Setup: %v", err)
	}
	if _, err := os.Stat(filepath.Join(cfg.NetnsDir, "sbxpool5")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("failed Setup left a netns file: %v", err)
	}
	// Freeing the middle one hands that address out again.
	if err := l.Teardown(ctx, eps[2].ID); err != nil {
		t.Fatal(err)
	}
	if ep := setup(t, l, "sbxpool5", Policy{}); ep.Addr != eps[2].Addr {
		t.Fatalf("reused %v, want %v", ep.Addr, eps[2].Addr)
	}
}

// assertClean checks that no endpoint state is left on the host.
func assertClean(t *testing.T, l *Linux) {
	t.Helper()
	links, err := netlink.LinkList()
	if err != nil {
		t.Fatal(err)
	}
	br, err := netlink.LinkByName(l.cfg.Bridge)
	if err != nil {
		t.Fatal(err)
	}
	for _, lk := range links {
		if strings.HasPrefix(lk.Attrs().Name, l.cfg.VethPrefix) || lk.Attrs().MasterIndex == br.Attrs().Index {
			t.Errorf("leaked link %s", lk.Attrs().Name)
		}
	}
	for _, d := range []string{".addr", ".policy"} {
		if ents, _ := os.ReadDir(filepath.Join(l.cfg.NetnsDir, d)); len(ents) != 0 {
			t.Errorf("leaked %s records: %d", d, len(ents))
		}
	}
	ents, _ := os.ReadDir(l.cfg.NetnsDir)
	for _, e := range ents {
		if e.Name() != ".addr" && e.Name() != ".policy" {
			t.Errorf("leaked netns file %s", e.Name())
		}
	}
	if len(l.used) != 0 || len(l.endpoints) != 0 {
		t.Errorf("leaked allocations: %v %v", l.used, l.endpoints)
	}
	neighs, err := netlink.NeighList(br.Attrs().Index, netlink.FAMILY_V4)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range neighs {
		if n.State&netlink.NUD_PERMANENT != 0 {
			t.Errorf("leaked permanent neighbour %s", n.IP)
		}
	}
	c, err := nftables.New()
	if err != nil {
		t.Fatal(err)
	}
	tb := l.tables()
	for _, fam := range []nftables.TableFamily{nftables.TableFamilyINet, nftables.TableFamilyBridge} {
		chains, err := c.ListChainsOfTableFamily(fam)
		if err != nil {
			t.Fatal(err)
		}
		for _, ch := range chains {
			if ch.Table.Name == l.cfg.Table && ch.Hooknum == nil {
				t.Errorf("leaked nft chain %s", ch.Name)
			}
		}
	}
	for _, s := range []*nftables.Set{tb.sbx, tb.ports, tb.redir, tb.tunnel} {
		els, err := c.GetSetElements(s)
		if err != nil {
			t.Fatal(err)
		}
		if len(els) != 0 {
			t.Errorf("leaked %d elements in map %s", len(els), s.Name)
		}
	}
}

func TestTeardownCleanAndIdempotent(t *testing.T) {
	l := newTestManager(t, testConfig(t, 24))
	ctx := context.Background()
	ep := setup(t, l, "sbxtd", Policy{AllowInternet: true, AllowOut: []string{"198.18.0.1"}, DenyOut: []string{"198.18.0.0/16"}})
	if _, err := l.Get(ctx, ep.ID); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 2; i++ {
		if err := l.Teardown(ctx, ep.ID); err != nil {
			t.Fatalf("Teardown #%d: %v", i, err)
		}
	}
	if err := l.Teardown(ctx, "neverexisted"); err != nil {
		t.Fatalf("Teardown unknown: %v", err)
	}
	if _, err := l.Get(ctx, ep.ID); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Get after Teardown: %v", err)
	}
	assertClean(t, l)
}

func TestSetupTeardownLoop(t *testing.T) {
	l := newTestManager(t, testConfig(t, 24))
	ctx := context.Background()
	for i := 0; i < 50; i++ {
		a := setup(t, l, fmt.Sprintf("sbxloopa%d", i), Policy{AllowInternet: i%2 == 0, DenyOut: []string{"198.18.0.0/15"}})
		b := setup(t, l, fmt.Sprintf("sbxloopb%d", i), Policy{AllowOut: []string{"198.18.1.1"}})
		if err := l.UpdatePolicy(ctx, a.ID, Policy{AllowInternet: true}); err != nil {
			t.Fatal(err)
		}
		if err := l.Teardown(ctx, a.ID); err != nil {
			t.Fatal(err)
		}
		if err := l.Teardown(ctx, b.ID); err != nil {
			t.Fatal(err)
		}
	}
	assertClean(t, l)
}

func TestRestartRecovery(t *testing.T) {
	cfg := testConfig(t, 24)
	ctx := context.Background()
	l1 := newTestManager(t, cfg)
	ext := newExtHost(t)
	extSrv := listen(t, ext.path, ext.ip)
	a := setup(t, l1, "sbxreca", Policy{AllowInternet: false})
	b := setup(t, l1, "sbxrecb", Policy{AllowInternet: true})
	mustFail(t, "A denied", a.NetNSPath, extSrv)
	mustConnect(t, "B allowed", b.NetNSPath, extSrv)
	c := setup(t, l1, "sbxrecc", Policy{})
	// Policies changed by UpdatePolicy must survive too (both directions).
	if err := l1.UpdatePolicy(ctx, a.ID, Policy{AllowOut: []string{ext.ip.String()}}); err != nil {
		t.Fatal(err)
	}
	if err := l1.UpdatePolicy(ctx, b.ID, Policy{AllowInternet: true, DenyOut: []string{ext.ip.String()}}); err != nil {
		t.Fatal(err)
	}
	if err := l1.Teardown(ctx, c.ID); err != nil { // leaves a hole below b
		t.Fatal(err)
	}
	// A stale endpoint: netns file without veth.
	stalePath := filepath.Join(cfg.NetnsDir, "sbxstale")
	if err := createNetns(stalePath); err != nil {
		t.Fatal(err)
	}
	// An orphan host veth on our bridge with no netns file.
	orphan := cfg.VethPrefix + "deadbeef"
	if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: orphan, MasterIndex: mustLink(t, cfg.Bridge).Attrs().Index}, PeerName: "cbo" + randHex(4)}); err != nil {
		t.Fatal(err)
	}

	l2, err := NewLinux(cfg) // same config, as after `cubicle serve` restart
	if err != nil {
		t.Fatal(err)
	}
	list, err := l2.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]Endpoint{}
	for _, ep := range list {
		got[ep.ID] = ep
	}
	if len(got) != 3 || got[a.ID] != a || got[b.ID] != b {
		t.Fatalf("recovered %+v, want a=%+v b=%+v + stale", list, a, b)
	}
	if st := got["sbxstale"]; !st.Stale || st.Addr.IsValid() {
		t.Fatalf("stale endpoint reported as %+v", st)
	}
	if _, err := netlink.LinkByName(orphan); err == nil {
		t.Fatal("orphan veth not removed")
	}
	// Policies survive the rebuild.
	mustConnect(t, "A allowOut kept after restart", a.NetNSPath, extSrv)
	mustFail(t, "B denyOut kept after restart", b.NetNSPath, extSrv)
	// New allocation does not collide: it takes the freed hole.
	d := setup(t, l2, "sbxrecd", Policy{})
	if d.Addr == a.Addr || d.Addr == b.Addr || d.Addr != c.Addr {
		t.Fatalf("new address %v (a=%v b=%v hole=%v)", d.Addr, a.Addr, b.Addr, c.Addr)
	}
	if err := l2.Teardown(ctx, "sbxstale"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(stalePath); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("stale netns file still there: %v", err)
	}
	// l2 now owns everything; l1's Destroy at cleanup tears down endpoints
	// l2 already removed, which must be a no-op.
	for _, id := range []string{a.ID, b.ID, d.ID} {
		if err := l2.Teardown(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	assertClean(t, l2)
}

func mustLink(t *testing.T, name string) netlink.Link {
	t.Helper()
	lk, err := netlink.LinkByName(name)
	if err != nil {
		t.Fatal(err)
	}
	return lk
}

// tcpInSegs reads the TCP InSegs counter of the netns at path.
func tcpInSegs(t *testing.T, path string) int64 {
	t.Helper()
	var v int64 = -1
	err := RunInNetns(path, func() error {
		// thread-self: /proc/self/net would show the main thread's netns.
		b, err := os.ReadFile("/proc/thread-self/net/snmp")
		if err != nil {
			return err
		}
		var hdr []string
		for _, line := range strings.Split(string(b), "\n") {
			f := strings.Fields(line)
			if len(f) == 0 || f[0] != "Tcp:" {
				continue
			}
			if hdr == nil {
				hdr = f
				continue
			}
			for i, h := range hdr {
				if h == "InSegs" && i < len(f) {
					_, err = fmt.Sscan(f[i], &v)
					return err
				}
			}
		}
		return errors.New("InSegs not found")
	})
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// A sandbox must not borrow another sandbox's address (and so its policy):
// the bridge table drops frames whose IPv4/ARP source is not the port's.
func TestAntiSpoofing(t *testing.T) {
	l := newTestManager(t, testConfig(t, 24))
	ext := newExtHost(t)
	extSrv := listen(t, ext.path, ext.ip)
	a := setup(t, l, "sbxspa", Policy{AllowInternet: false})
	b := setup(t, l, "sbxspb", Policy{AllowInternet: true})
	mustFail(t, "A denied", a.NetNSPath, extSrv) // also resolves the gateway's MAC in A
	mustConnect(t, "B allowed", b.NetNSPath, extSrv)

	h, eth := eth0In(t, a.NetNSPath)
	if err := h.AddrAdd(eth, &netlink.Addr{IPNet: &net.IPNet{IP: b.Addr.AsSlice(), Mask: net.CIDRMask(32, 32)}}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond) // let earlier connections' last segments land
	before := tcpInSegs(t, ext.path)
	if line, err := dial(a.NetNSPath, extSrv, b.Addr); err == nil {
		t.Fatalf("A spoofing B's address connected (server saw %s)", line)
	}
	if after := tcpInSegs(t, ext.path); after != before {
		t.Fatalf("spoofed SYNs reached the external host: InSegs %d -> %d", before, after)
	}
	mustConnect(t, "B unaffected", b.NetNSPath, extSrv)
}

// Setups run concurrently (the manager's lock covers only taking the ID,
// address and veth name): every endpoint gets its own address and works,
// a second Setup of an ID in progress is refused, and Teardowns and policy
// updates racing the Setups of the same IDs leave each endpoint whole or
// gone, never half made.
func TestConcurrentSetup(t *testing.T) {
	l := newTestManager(t, testConfig(t, 24))
	ctx := context.Background()
	ext := newExtHost(t)
	extSrv := listen(t, ext.path, ext.ip)
	const n = 16
	type result struct {
		i   int
		ep  Endpoint
		err error
	}
	res := make(chan result, 2*n)
	for i := 0; i < n; i++ {
		for range 2 {
			go func() {
				ep, err := l.Setup(ctx, fmt.Sprintf("sbxconc%d", i), Policy{AllowInternet: true})
				res <- result{i, ep, err}
			}()
		}
	}
	won := map[int]Endpoint{}
	for range 2 * n {
		r := <-res
		switch {
		case r.err == nil:
			if _, dup := won[r.i]; dup {
				t.Fatalf("two Setups of sbxconc%d both succeeded", r.i)
			}
			won[r.i] = r.ep
		case !errors.Is(r.err, ErrExists):
			t.Fatalf("sbxconc%d: %v", r.i, r.err)
		}
	}
	if len(won) != n {
		t.Fatalf("%d of %d IDs were set up", len(won), n)
	}
	list, _ := l.List(ctx)
	seen := map[netip.Addr]bool{}
	for _, ep := range list {
		if seen[ep.Addr] || ep.Stale {
			t.Fatalf("bad endpoint %+v", ep)
		}
		seen[ep.Addr] = true
	}
	if len(seen) != n {
		t.Fatalf("got %d endpoints", len(seen))
	}
	for i, ep := range won {
		mustConnect(t, fmt.Sprintf("sbxconc%d->external", i), ep.NetNSPath, extSrv)
	}

	// Teardown and UpdatePolicy of each ID race a Setup of a new ID.
	errc := make(chan error, 3*n)
	for i := 0; i < n; i++ {
		go func() { errc <- l.Teardown(ctx, fmt.Sprintf("sbxconc%d", i)) }()
		go func() {
			err := l.UpdatePolicy(ctx, fmt.Sprintf("sbxconc%d", i), Policy{AllowInternet: false})
			if errors.Is(err, ErrNotFound) { // it lost the race to the Teardown
				err = nil
			}
			errc <- err
		}()
		go func() {
			_, err := l.Setup(ctx, fmt.Sprintf("sbxnext%d", i), Policy{AllowInternet: true})
			errc <- err
		}()
	}
	for range 3 * n {
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
	}
	list, _ = l.List(ctx)
	if len(list) != n {
		t.Fatalf("%d endpoints after the teardowns, want the %d new ones", len(list), n)
	}
	for _, ep := range list {
		if !strings.HasPrefix(ep.ID, "sbxnext") || ep.Stale {
			t.Fatalf("left: %+v", ep)
		}
		mustConnect(t, ep.ID+"->external", ep.NetNSPath, extSrv)
		if err := l.Teardown(ctx, ep.ID); err != nil {
			t.Fatal(err)
		}
	}
	assertClean(t, l)
}

func TestEgressIfaceAndOverlap(t *testing.T) {
	requireRoot(t)
	ext := newExtHost(t)
	extSrv := listen(t, ext.path, ext.ip)

	bad := testConfig(t, 24)
	bad.Pool = netip.PrefixFrom(ext.hostIP, 24).Masked()
	if _, err := NewLinux(bad); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("overlapping pool: %v", err)
	}
	if _, err := netlink.LinkByName(bad.Bridge); err == nil {
		t.Fatal("rejected config created a bridge")
	}

	cfg := testConfig(t, 24)
	cfg.EgressIface = ext.link
	l := newTestManager(t, cfg)
	a := setup(t, l, "sbxegr", Policy{AllowInternet: true})
	if got := mustConnect(t, "A->external via EgressIface", a.NetNSPath, extSrv); !strings.HasPrefix(got, ext.hostIP.String()+":") {
		t.Fatalf("external saw %s, want masqueraded %s", got, ext.hostIP)
	}
}

// A Setup that fails late (here: our nftables table vanished) leaves nothing.
func TestSetupFailureLeavesNothing(t *testing.T) {
	l := newTestManager(t, testConfig(t, 24))
	c, err := nftables.New()
	if err != nil {
		t.Fatal(err)
	}
	c.DelTable(l.tables().inet)
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Setup(context.Background(), "sbxfail", Policy{}); err == nil {
		t.Fatal("Setup succeeded without nftables table")
	}
	// Recreate the tables so assertClean can inspect the maps.
	if err := l.rebuildTables(); err != nil {
		t.Fatal(err)
	}
	assertClean(t, l)
}

// Tearing down the endpoint whose MAC the bridge might have adopted must
// not change the gateway MAC seen by other sandboxes.
func TestBridgeMACStable(t *testing.T) {
	l := newTestManager(t, testConfig(t, 24))
	ctx := context.Background()
	before := mustLink(t, l.cfg.Bridge).Attrs().HardwareAddr.String()
	var eps []Endpoint
	for i := 0; i < 4; i++ {
		eps = append(eps, setup(t, l, fmt.Sprintf("sbxmac%d", i), Policy{}))
	}
	srv := listen(t, eps[3].NetNSPath, eps[3].Addr)
	mustConnect(t, "host->sandbox", "", srv)
	for _, ep := range eps[:3] {
		if err := l.Teardown(ctx, ep.ID); err != nil {
			t.Fatal(err)
		}
	}
	if after := mustLink(t, l.cfg.Bridge).Attrs().HardwareAddr.String(); after != before {
		t.Fatalf("bridge MAC changed %s -> %s", before, after)
	}
	mustConnect(t, "host->sandbox after teardowns", "", srv)
}

// gVisor removes the addresses from the netns interfaces once it starts; a
// restarted manager must still know the endpoint's address.
func TestRecoveryWithoutNetnsAddress(t *testing.T) {
	cfg := testConfig(t, 24)
	l := newTestManager(t, cfg)
	ep := setup(t, l, "sbxgvisor", Policy{AllowInternet: true})
	h, eth := eth0In(t, ep.NetNSPath)
	addrs, _ := h.AddrList(eth, netlink.FAMILY_V4)
	for _, a := range addrs {
		if err := h.AddrDel(eth, &a); err != nil {
			t.Fatal(err)
		}
	}
	l2, err := NewLinux(cfg)
	if err != nil {
		t.Fatal(err)
	}
	got, err := l2.Get(context.Background(), "sbxgvisor")
	if err != nil || got.Stale || got.Addr != ep.Addr {
		t.Fatalf("recovered endpoint %+v (err %v), want address %s and not stale", got, err, ep.Addr)
	}
	// The address stays allocated: a new endpoint gets a different one.
	other := setup(t, l2, "sbxother", Policy{})
	if other.Addr == ep.Addr {
		t.Fatalf("address %s handed out twice", ep.Addr)
	}
	for _, id := range []string{"sbxgvisor", "sbxother"} {
		if err := l2.Teardown(context.Background(), id); err != nil {
			t.Fatal(err)
		}
	}
}

func TestMACFollowsAddress(t *testing.T) {
	l := newTestManager(t, testConfig(t, 24))
	ep := setup(t, l, "sbxmac", Policy{})
	_, eth := eth0In(t, ep.NetNSPath)
	if got, want := eth.Attrs().HardwareAddr.String(), macFor(ep.Addr).String(); got != want {
		t.Fatalf("eth0 MAC %s, want %s derived from %s", got, want, ep.Addr)
	}
	if err := l.Teardown(context.Background(), "sbxmac"); err != nil {
		t.Fatal(err)
	}
}

// eth0In opens a netlink handle inside the netns at path (closed at test
// end) and returns it with the sandbox's eth0.
func eth0In(t *testing.T, path string) (*netlink.Handle, netlink.Link) {
	t.Helper()
	ns, err := netns.GetFromPath(path)
	if err != nil {
		t.Fatal(err)
	}
	h, err := netlink.NewHandleAt(ns)
	ns.Close()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Close)
	eth, err := h.LinkByName("eth0")
	if err != nil {
		t.Fatal(err)
	}
	return h, eth
}

// A policy far bigger than nftables rule user data (256 bytes) is set up,
// updated and, after a restart, still enforced: policies are recorded in
// files, not in the table.
func TestLargePolicySurvivesRestart(t *testing.T) {
	cfg := testConfig(t, 24)
	cfg.EgressPort = 1 // rules and upstreams need an egress proxy; none listens in this test
	ctx := context.Background()
	l1 := newTestManager(t, cfg)
	ext := newExtHost(t)
	extSrv := listen(t, ext.path, ext.ip)
	var allow []string
	for i := range MaxPolicyEntries - 1 { // the most a list may hold
		allow = append(allow, fmt.Sprintf("203.0.%d.%d", i/250, i%250+1))
	}
	p := Policy{AllowOut: append(allow, ext.ip.String()), DenyOut: []string{"0.0.0.0/0"},
		Rules:    map[string][]Rule{"api.example.com": {{Headers: map[string]string{"Authorization": "Bearer ${e2b.secrets.k}"}}}},
		Upstream: &Upstream{Address: "198.51.100.7:1080", Username: "u", Password: "p"}}
	a := setup(t, l1, "sbxbig", Policy{AllowOut: allow, DenyOut: []string{"0.0.0.0/0"}})
	mustFail(t, "before the update", a.NetNSPath, extSrv)
	if err := l1.UpdatePolicy(ctx, a.ID, Policy{AllowOut: append(allow, ext.ip.String()), DenyOut: []string{"0.0.0.0/0"}}); err != nil {
		t.Fatal(err)
	}
	mustConnect(t, "after the update", a.NetNSPath, extSrv)
	b := setup(t, l1, "sbxbig2", p)
	if fi, err := os.Stat(l1.policyFile(b.ID)); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("policy file: %v %v", fi, err)
	}

	l2, err := NewLinux(cfg) // as after a restart
	if err != nil {
		t.Fatal(err)
	}
	mustConnect(t, "large allowOut kept after restart", a.NetNSPath, extSrv)
	_, got, ok := l2.SandboxPolicy(b.Addr)
	if !ok || len(got.AllowOut) != len(p.AllowOut) || got.Upstream == nil || got.Upstream.Password != "p" || len(got.Rules) != 1 {
		t.Fatalf("recovered policy %+v", got)
	}
	for _, id := range []string{a.ID, b.ID} {
		if err := l2.Teardown(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	assertClean(t, l2)
}
