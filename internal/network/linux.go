//go:build linux

package network

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/cubicle-dev/cubicle/internal/phase"
	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Config configures the Linux manager. Zero fields get the defaults below.
type Config struct {
	Bridge     string       // default "cubicle0"
	Pool       netip.Prefix // IPv4, default 10.211.0.0/16; gateway = first host address
	NetnsDir   string       // default "/run/cubicle/netns"
	Table      string       // nftables table name (inet and bridge family), default "cubicle"
	VethPrefix string       // host veth prefix, default "cbv"; name = prefix + 8 hex of sha256(id)
	// EgressIface, if set, limits masquerading to pool traffic leaving by
	// that interface; empty masquerades via any interface but the bridge.
	EgressIface string
	// Resolvers are the DNS servers written into sandboxes' resolv.conf.
	// They stay reachable on port 53 although they usually sit in a range
	// the internal-network default deny covers (cloud resolvers are
	// private or link-local addresses).
	Resolvers []netip.Addr
	// EgressPort is where the node's egress proxy listens on the gateway
	// address: TCP to ports 80 and 443 of sandboxes whose policy has
	// domain entries is redirected there. 0: no egress proxy, and such
	// policies are refused.
	EgressPort uint16
	// HostFirewall is HostFirewallAuto (default: accept rules for the
	// bridge in iptables when the host's FORWARD chain would drop its
	// traffic; see hostfw_linux.go) or HostFirewallOff.
	HostFirewall string
	// UpstreamAllow are internal ranges where a sandbox's SOCKS5 egress
	// proxy may be (network.egressProxy); by default only public
	// addresses are.
	UpstreamAllow []netip.Prefix
	// MaxFlows caps the connections (conntrack entries; TCP in TIME_WAIT
	// excluded) one sandbox may have open at once, NewFlowRate the new
	// ones it may start per second (bursts of twice that), whatever their
	// destination, the egress proxy included: the host's conntrack table
	// is shared, and when it is full the host drops new flows for
	// everyone. Past either, new flows are dropped. 0: no cap.
	MaxFlows    int
	NewFlowRate int
}

func (c *Config) applyDefaults() error {
	if c.Bridge == "" {
		c.Bridge = "cubicle0"
	}
	if !c.Pool.IsValid() {
		c.Pool = netip.MustParsePrefix("10.211.0.0/16")
	}
	if c.NetnsDir == "" {
		c.NetnsDir = "/run/cubicle/netns"
	}
	if c.Table == "" {
		c.Table = "cubicle"
	}
	if c.VethPrefix == "" {
		c.VethPrefix = "cbv"
	}
	if c.HostFirewall == "" {
		c.HostFirewall = HostFirewallAuto
	}
	c.Pool = c.Pool.Masked()
	switch {
	case !c.Pool.Addr().Is4() || c.Pool.Bits() > 30 || c.Pool.Bits() < 8:
		return fmt.Errorf("%w: pool %s must be IPv4 /8../30", ErrInvalidConfig, c.Pool)
	case len(c.Bridge) > 15:
		return fmt.Errorf("%w: bridge name too long", ErrInvalidConfig)
	case len(c.VethPrefix)+8 > 15:
		return fmt.Errorf("%w: veth prefix too long", ErrInvalidConfig)
	case c.HostFirewall != HostFirewallAuto && c.HostFirewall != HostFirewallOff:
		return fmt.Errorf("%w: host firewall mode %q (want auto or off)", ErrInvalidConfig, c.HostFirewall)
	case c.MaxFlows < 0 || c.NewFlowRate < 0:
		return fmt.Errorf("%w: per-sandbox flow limits must not be negative (max flows %d, new flows/s %d)", ErrInvalidConfig, c.MaxFlows, c.NewFlowRate)
	case c.NewFlowRate > 1<<30:
		return fmt.Errorf("%w: new flows/s %d is too large", ErrInvalidConfig, c.NewFlowRate)
	}
	return nil
}

// Linux implements Manager with netns + veth + bridge + nftables.
// Setting it up enables net.ipv4.ip_forward=1 host-wide (required for NAT).
type Linux struct {
	cfg     Config
	gateway netip.Addr
	bcast   netip.Addr
	// internal is denied to every sandbox unless its allowOut re-opens it:
	// InternalRanges plus the host's uplink networks, read at start.
	internal []netip.Prefix

	fw *hostFirewall // nil when HostFirewallOff or no iptables
	// policies are the live endpoints' policies, for the egress proxy.
	policies map[string]Policy

	// mu guards the maps only. The slow work of an endpoint (netns, veth,
	// nftables: milliseconds each) runs outside it, so concurrent creates
	// are not serialised behind one another; busy keeps two operations on
	// one ID apart instead.
	mu        sync.Mutex
	endpoints map[string]Endpoint // includes stale ones (they keep their address)
	used      map[netip.Addr]string
	busy      map[string]*endpointOp
}

// endpointOp is a Setup, Teardown or UpdatePolicy in progress on one ID.
// A setup's endpoint is not in endpoints until it is complete, but its
// address and host veth name are taken from the moment it starts.
type endpointOp struct {
	done  chan struct{}
	setup *Endpoint
}

var _ Manager = (*Linux)(nil)

func idHash(id string) string {
	h := sha256.Sum256([]byte(id))
	return hex.EncodeToString(h[:4])
}

func validID(id string) bool {
	if id == "" || len(id) > 64 || id[0] == '.' {
		return false
	}
	for _, r := range id {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' || r == '.') {
			return false
		}
	}
	return true
}

// NewLinux ensures the bridge, ip_forward and nftables tables exist and
// rebuilds its state from endpoints already on the host (restart recovery).
// The nftables tables are rebuilt atomically, keeping each live endpoint's
// policy (read back from the previous table).
func NewLinux(cfg Config) (*Linux, error) {
	if err := cfg.applyDefaults(); err != nil {
		return nil, err
	}
	l := &Linux{
		cfg:       cfg,
		gateway:   cfg.Pool.Addr().Next(),
		bcast:     lastAddr(cfg.Pool),
		endpoints: map[string]Endpoint{},
		used:      map[netip.Addr]string{},
		policies:  map[string]Policy{},
		busy:      map[string]*endpointOp{},
	}
	if err := os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1"), 0o644); err != nil {
		return nil, fmt.Errorf("network: enable ip_forward: %w", err)
	}
	if err := l.checkOverlap(); err != nil {
		return nil, err
	}
	uplinks, err := uplinkNetworks()
	if err != nil {
		return nil, err
	}
	l.internal = mergePrefixes(append(append([]netip.Prefix(nil), InternalRanges...), uplinks...))
	br, err := l.ensureBridge()
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(cfg.NetnsDir, 0o755); err != nil {
		return nil, fmt.Errorf("network: netns dir: %w", err)
	}
	if err := l.recover(br); err != nil {
		return nil, err
	}
	if err := l.rebuildTables(); err != nil {
		return nil, err
	}
	if cfg.HostFirewall == HostFirewallAuto {
		if l.fw, err = openHostFirewall(cfg.Bridge); err != nil {
			return nil, err
		}
	}
	return l, nil
}

// HostFirewallChain names the iptables chain holding the bridge's accept
// rules, or "" when the host's firewall needed none (or the mode is off).
func (l *Linux) HostFirewallChain() string { return l.fw.Chain() }

// Close removes what the manager added to the host's iptables. Sandboxes
// and their endpoints stay (serve leaves them running); on a host whose
// FORWARD chain drops, they have no egress until the next start adds the
// rules again.
func (l *Linux) Close() error { return l.fw.close() }

func lastAddr(p netip.Prefix) netip.Addr {
	a := p.Addr().As4()
	host := uint32(1)<<(32-p.Bits()) - 1
	v := uint32(a[0])<<24 | uint32(a[1])<<16 | uint32(a[2])<<8 | uint32(a[3]) | host
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

// uplinkNetworks returns the IPv4 networks of the interfaces that carry a
// default route: the LAN or VPC the host sits on, whose neighbours are
// nobody's internet.
func uplinkNetworks() ([]netip.Prefix, error) {
	routes, err := netlink.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Table: unix.RT_TABLE_MAIN}, netlink.RT_FILTER_TABLE)
	if err != nil {
		return nil, fmt.Errorf("network: list routes: %w", err)
	}
	var out []netip.Prefix
	for _, r := range routes {
		if r.Dst != nil && r.Dst.IP != nil && !r.Dst.IP.IsUnspecified() {
			continue
		}
		lk, err := netlink.LinkByIndex(r.LinkIndex)
		if err != nil {
			continue
		}
		addrs, err := netlink.AddrList(lk, netlink.FAMILY_V4)
		if err != nil {
			return nil, fmt.Errorf("network: list addresses: %w", err)
		}
		for _, a := range addrs {
			ip, ok := netip.AddrFromSlice(a.IP.To4())
			if !ok {
				continue
			}
			bits, _ := a.Mask.Size()
			out = append(out, netip.PrefixFrom(ip, bits).Masked())
		}
	}
	return out, nil
}

// checkOverlap refuses a pool that overlaps an address on another
// interface: sandboxes would shadow (or be shadowed by) a real network.
func (l *Linux) checkOverlap() error {
	addrs, err := netlink.AddrList(nil, netlink.FAMILY_V4)
	if err != nil {
		return fmt.Errorf("network: list addresses: %w", err)
	}
	for _, a := range addrs {
		lk, err := netlink.LinkByIndex(a.LinkIndex)
		if err != nil || lk.Attrs().Name == l.cfg.Bridge {
			continue
		}
		ip, ok := netip.AddrFromSlice(a.IP.To4())
		if !ok {
			continue
		}
		bits, _ := a.Mask.Size()
		if p := netip.PrefixFrom(ip, bits).Masked(); p.Overlaps(l.cfg.Pool) {
			return fmt.Errorf("%w: pool %s overlaps %s on %s", ErrInvalidConfig, l.cfg.Pool, p, lk.Attrs().Name)
		}
	}
	return nil
}

func (l *Linux) ensureBridge() (netlink.Link, error) {
	br, err := netlink.LinkByName(l.cfg.Bridge)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if !errors.As(err, &nf) {
			return nil, fmt.Errorf("network: lookup bridge: %w", err)
		}
		if err := netlink.LinkAdd(&netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: l.cfg.Bridge}}); err != nil {
			return nil, fmt.Errorf("network: create bridge: %w", err)
		}
		if br, err = netlink.LinkByName(l.cfg.Bridge); err != nil {
			return nil, fmt.Errorf("network: lookup bridge: %w", err)
		}
	}
	if br.Type() != "bridge" {
		return nil, fmt.Errorf("%w: %s exists and is not a bridge", ErrInvalidConfig, l.cfg.Bridge)
	}
	// A bridge without an explicitly set MAC takes the lowest port MAC and
	// changes it as veths come and go, which leaves sandboxes' ARP entries
	// for the gateway pointing at a dead MAC. Pin a stable one derived
	// from the bridge name (locally administered, unicast).
	h := sha256.Sum256([]byte("cubicle-bridge:" + l.cfg.Bridge))
	mac := net.HardwareAddr{0x02, h[0], h[1], h[2], h[3], h[4]}
	if br.Attrs().HardwareAddr.String() != mac.String() {
		if err := netlink.LinkSetHardwareAddr(br, mac); err != nil {
			return nil, fmt.Errorf("network: bridge mac: %w", err)
		}
	}
	if err := disableIPv6(l.cfg.Bridge); err != nil {
		return nil, err
	}
	gw := &netlink.Addr{IPNet: &net.IPNet{IP: l.gateway.AsSlice(), Mask: net.CIDRMask(l.cfg.Pool.Bits(), 32)}}
	if err := netlink.AddrReplace(br, gw); err != nil {
		return nil, fmt.Errorf("network: bridge address: %w", err)
	}
	if err := netlink.LinkSetUp(br); err != nil {
		return nil, fmt.Errorf("network: bridge up: %w", err)
	}
	return br, nil
}

// recover scans NetnsDir and the host's veths. Healthy endpoints and stale
// ones (kept so their address is not reused until Teardown) go into the
// maps; host veths with our prefix on our bridge that no netns file claims
// are deleted (their sandbox is gone; deleting the host end frees the pair).
func (l *Linux) recover(br netlink.Link) error {
	entries, err := os.ReadDir(l.cfg.NetnsDir)
	if err != nil {
		return fmt.Errorf("network: read netns dir: %w", err)
	}
	claimed := map[string]bool{}
	for _, e := range entries {
		id := e.Name()
		if !e.Type().IsRegular() || !validID(id) {
			continue
		}
		ep := l.inspect(id, br.Attrs().Index)
		claimed[ep.HostVeth] = true
		if ep.Addr.IsValid() {
			if other, dup := l.used[ep.Addr]; dup {
				// Two netns claim one address: keep neither usable.
				ep.Stale = true
				o := l.endpoints[other]
				o.Stale = true
				l.endpoints[other] = o
			} else {
				l.used[ep.Addr] = id
			}
		}
		l.endpoints[id] = ep
	}
	links, err := netlink.LinkList()
	// A dump that raced a link change elsewhere on the host is
	// incomplete: ask again (bounded) rather than judge from part of it.
	for i := 0; i < 5 && errors.Is(err, netlink.ErrDumpInterrupted); i++ {
		links, err = netlink.LinkList()
	}
	if err != nil {
		return fmt.Errorf("network: list links: %w", err)
	}
	for _, lk := range links {
		a := lk.Attrs()
		if lk.Type() == "veth" && a.MasterIndex == br.Attrs().Index &&
			strings.HasPrefix(a.Name, l.cfg.VethPrefix) && !claimed[a.Name] {
			_ = netlink.LinkDel(lk)
		}
	}
	return nil
}

// inspect builds the endpoint for a netns file, marking it stale when any
// part of the wiring is missing.
func (l *Linux) inspect(id string, brIndex int) Endpoint {
	ep := l.endpointFor(id)
	ep.Stale = true
	if !isNetnsMount(ep.NetNSPath) {
		return ep
	}
	if ns, err := netns.GetFromPath(ep.NetNSPath); err == nil {
		if h, err := netlink.NewHandleAt(ns); err == nil {
			if eth, err := h.LinkByName("eth0"); err == nil {
				addrs, _ := h.AddrList(eth, netlink.FAMILY_V4)
				for _, a := range addrs {
					if ip, ok := netip.AddrFromSlice(a.IP.To4()); ok && l.cfg.Pool.Contains(ip) && l.assignable(ip) {
						ep.Addr = ip
						break
					}
				}
			}
			h.Close()
		}
		ns.Close()
	}
	if !ep.Addr.IsValid() {
		ep.Addr = l.recordedAddr(id)
	}
	hv, err := netlink.LinkByName(ep.HostVeth)
	if err == nil && hv.Attrs().MasterIndex == brIndex && ep.Addr.IsValid() {
		// Endpoints wired by an older build lack the port hardening;
		// one that cannot be hardened carries no traffic.
		ep.Stale = l.hardenPort(hv, brIndex, ep.Addr) != nil
	}
	return ep
}

func (l *Linux) assignable(a netip.Addr) bool {
	return a != l.cfg.Pool.Addr() && a != l.gateway && a != l.bcast
}

// NetNSPath implements Manager.
func (l *Linux) NetNSPath(id string) string { return l.endpointFor(id).NetNSPath }

func (l *Linux) endpointFor(id string) Endpoint {
	return Endpoint{
		ID:        id,
		NetNSPath: filepath.Join(l.cfg.NetnsDir, id),
		Gateway:   l.gateway,
		HostVeth:  l.cfg.VethPrefix + idHash(id),
	}
}

// rebuildTables replaces our tables in one transaction with base rules plus
// every healthy endpoint, keeping policies stored in the old table (deny-all
// for an endpoint whose policy cannot be read back).
func (l *Linux) rebuildTables() error {
	c, err := newNftConn()
	if err != nil {
		return fmt.Errorf("network: nftables: %w", err)
	}
	t := l.tables()
	legacy := map[string]Policy{}
	if tableExists(c, l.cfg.Table, nftables.TableFamilyINet) {
		legacy = storedPolicies(c, t.inet)
		c.DelTable(t.inet)
	}
	if tableExists(c, l.cfg.Table, nftables.TableFamilyBridge) {
		c.DelTable(t.bridge)
	}
	if err := l.addBase(c, t); err != nil {
		return fmt.Errorf("network: nftables base: %w", err)
	}
	for _, ep := range l.endpoints {
		if ep.Stale {
			continue
		}
		p, ok := l.recordedPolicy(ep.ID)
		if !ok {
			p = legacy[sandboxChainName(ep.ID)] // written by an older build
		}
		if p.NeedsProxy() && l.cfg.EgressPort == 0 {
			p = Policy{} // no proxy to judge names now: deny all rather than allow
		}
		l.policies[ep.ID] = p
		allow, deny, _ := parsePolicy(p)
		if err := l.addEndpoint(c, t, ep, p, allow, deny); err != nil {
			return fmt.Errorf("network: nftables endpoint %s: %w", ep.ID, err)
		}
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("network: nftables apply: %w", err)
	}
	return nil
}

// parsePolicy validates p and returns its IPv4 prefixes. IPv6 entries are
// valid but have no effect: sandboxes have no IPv6 connectivity at all.
func parsePolicy(p Policy) (allow, deny []netip.Prefix, err error) {
	if err := ValidatePolicy(p); err != nil {
		return nil, nil, err
	}
	conv := func(in []string) []netip.Prefix {
		var out []netip.Prefix
		for _, s := range in {
			pr, _ := ParsePrefix(s)
			if pr.Addr().Is4In6() {
				pr = netip.PrefixFrom(pr.Addr().Unmap(), pr.Bits()-96)
			}
			if pr.Addr().Is4() {
				out = append(out, pr)
			}
		}
		return out
	}
	return conv(p.AllowOut), conv(p.DenyOut), nil
}

func (l *Linux) allocate(id string) (netip.Addr, error) {
	for a := l.gateway.Next(); a.IsValid() && a != l.bcast && l.cfg.Pool.Contains(a); a = a.Next() {
		if _, taken := l.used[a]; !taken {
			l.used[a] = id
			return a, nil
		}
	}
	return netip.Addr{}, ErrPoolExhausted
}

// acquireLocked waits, with mu held (and released while it waits), until
// no other operation is in progress on id, then marks op as id's. The
// caller releases it with release.
func (l *Linux) acquireLocked(ctx context.Context, id string, op *endpointOp) error {
	for {
		other, ok := l.busy[id]
		if !ok {
			l.busy[id] = op
			return nil
		}
		l.mu.Unlock()
		select {
		case <-other.done:
		case <-ctx.Done():
			l.mu.Lock()
			return ctx.Err()
		}
		l.mu.Lock()
	}
}

// release ends op on id; mu must be held.
func (l *Linux) releaseLocked(id string, op *endpointOp) {
	if l.busy[id] == op {
		delete(l.busy, id)
	}
	close(op.done)
}

// vethTakenLocked reports whether another live or half-made endpoint
// already has the host veth name (IDs hash to 32 bits).
func (l *Linux) vethTakenLocked(id, name string) bool {
	for oid, ep := range l.endpoints {
		if oid != id && ep.HostVeth == name {
			return true
		}
	}
	for oid, op := range l.busy {
		if oid != id && op.setup != nil && op.setup.HostVeth == name {
			return true
		}
	}
	return false
}

// Setup implements Manager. Only taking the ID, address and veth name is
// serialised (under mu, shown as lock_wait in the create trace); making
// the endpoint runs concurrently with other creates.
func (l *Linux) Setup(ctx context.Context, id string, p Policy) (ep Endpoint, err error) {
	if !validID(id) {
		return Endpoint{}, ErrInvalidID
	}
	allow, deny, err := l.parsePolicy(p)
	if err != nil {
		return Endpoint{}, err
	}
	if err := ctx.Err(); err != nil {
		return Endpoint{}, err
	}
	ep = l.endpointFor(id)
	op := &endpointOp{done: make(chan struct{}), setup: &ep}
	endWait := phase.Start(ctx, phase.LockWait)
	l.mu.Lock()
	endWait()
	if _, ok := l.busy[id]; ok {
		l.mu.Unlock()
		return Endpoint{}, fmt.Errorf("%w: an operation on %s is in progress", ErrExists, id)
	}
	if _, ok := l.endpoints[id]; ok {
		l.mu.Unlock()
		return Endpoint{}, ErrExists
	}
	if l.vethTakenLocked(id, ep.HostVeth) {
		l.mu.Unlock()
		return Endpoint{}, fmt.Errorf("%w: host veth %s belongs to another endpoint", ErrExists, ep.HostVeth)
	}
	if ep.Addr, err = l.allocate(id); err != nil {
		l.mu.Unlock()
		return Endpoint{}, err
	}
	l.busy[id] = op
	l.mu.Unlock()

	created := false
	defer func() {
		if err != nil && created && !errors.Is(err, ErrExists) { // never remove a netns file we did not create
			_ = l.cleanup(ep, Policy{}, false)
		}
		l.mu.Lock()
		defer l.mu.Unlock()
		if err != nil {
			delete(l.used, ep.Addr)
		} else {
			l.endpoints[id] = ep
			l.policies[id] = p
		}
		l.releaseLocked(id, op)
	}()
	if _, err := netlink.LinkByName(ep.HostVeth); err == nil {
		// Never remove what another (or an older) process made.
		return ep, fmt.Errorf("%w: host veth %s already present", ErrExists, ep.HostVeth)
	}
	created = true
	if err = createNetns(ep.NetNSPath); err != nil {
		return ep, err
	}
	if err = l.wire(ep); err != nil {
		return ep, err
	}
	if err = l.recordAddr(ep); err != nil {
		return ep, err
	}
	if err = l.recordPolicy(id, p); err != nil {
		return ep, err
	}
	c, err := newNftConn()
	if err != nil {
		return ep, fmt.Errorf("network: nftables: %w", err)
	}
	if err = l.addEndpoint(c, l.tables(), ep, p, allow, deny); err == nil {
		err = c.Flush()
	}
	if err != nil {
		return ep, fmt.Errorf("network: nftables endpoint: %w", err)
	}
	return ep, nil
}

// wire creates the veth pair, attaches and configures both ends.
func (l *Linux) wire(ep Endpoint) error {
	br, err := netlink.LinkByName(l.cfg.Bridge)
	if err != nil {
		return fmt.Errorf("network: lookup bridge: %w", err)
	}
	ns, err := netns.GetFromPath(ep.NetNSPath)
	if err != nil {
		return fmt.Errorf("network: open netns: %w", err)
	}
	defer ns.Close()
	// The peer is created directly inside the netns as eth0, so it never
	// needs a unique temporary name on the host.
	veth := &netlink.Veth{
		LinkAttrs:     netlink.LinkAttrs{Name: ep.HostVeth, MTU: br.Attrs().MTU},
		PeerName:      "eth0",
		PeerNamespace: netlink.NsFd(int(ns)),
	}
	if err := netlink.LinkAdd(veth); err != nil {
		return fmt.Errorf("network: create veth: %w", err)
	}
	host, err := netlink.LinkByName(ep.HostVeth)
	if err != nil {
		return fmt.Errorf("network: lookup veth: %w", err)
	}
	if err := netlink.LinkSetMaster(host, br); err != nil {
		return fmt.Errorf("network: attach veth: %w", err)
	}
	if err := l.hardenPort(host, br.Attrs().Index, ep.Addr); err != nil {
		return err
	}
	if err := disableIPv6(ep.HostVeth); err != nil {
		return err
	}
	if err := netlink.LinkSetUp(host); err != nil {
		return fmt.Errorf("network: veth up: %w", err)
	}

	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return fmt.Errorf("network: netlink in netns: %w", err)
	}
	defer h.Close()
	lo, err := h.LinkByName("lo")
	if err != nil {
		return fmt.Errorf("network: lookup lo: %w", err)
	}
	if err := h.LinkSetUp(lo); err != nil {
		return fmt.Errorf("network: lo up: %w", err)
	}
	eth, err := h.LinkByName("eth0")
	if err != nil {
		return fmt.Errorf("network: lookup eth0: %w", err)
	}
	// A MAC derived from the address (as Docker does) keeps the host's
	// neighbour entry valid when an address is reused by the next sandbox;
	// a random MAC would leave the host sending to the previous sandbox's
	// MAC for as long as that entry stays REACHABLE (~30 s).
	if err := h.LinkSetHardwareAddr(eth, macFor(ep.Addr)); err != nil {
		return fmt.Errorf("network: eth0 mac: %w", err)
	}
	addr := &netlink.Addr{IPNet: &net.IPNet{IP: ep.Addr.AsSlice(), Mask: net.CIDRMask(l.cfg.Pool.Bits(), 32)}}
	if err := h.AddrAdd(eth, addr); err != nil {
		return fmt.Errorf("network: eth0 address: %w", err)
	}
	if err := h.LinkSetUp(eth); err != nil {
		return fmt.Errorf("network: eth0 up: %w", err)
	}
	if err := h.RouteAdd(&netlink.Route{LinkIndex: eth.Attrs().Index, Gw: ep.Gateway.AsSlice()}); err != nil {
		return fmt.Errorf("network: default route: %w", err)
	}
	if err := waitOperUp(netlink.LinkByName, ep.HostVeth); err != nil {
		return err
	}
	return waitOperUp(h.LinkByName, "eth0")
}

// waitOperUp waits (bounded) until the kernel's linkwatch has processed the
// carrier change of a freshly created link: before that its qdisc is noop
// and the bridge port is disabled, so the first packets (e.g. a SYN) are
// silently dropped and a client only recovers on its 1 s retransmit.
func waitOperUp(byName func(string) (netlink.Link, error), name string) error {
	deadline := time.Now().Add(3 * time.Second)
	for {
		lk, err := byName(name)
		if err != nil {
			return fmt.Errorf("network: lookup %s: %w", name, err)
		}
		if lk.Attrs().OperState == netlink.OperUp {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("network: %s not operationally up after 3s (state %s)", name, lk.Attrs().OperState)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// cleanup removes whatever exists of ep; withNft also removes its rules
// (p is its policy: which sets hold its address).
func (l *Linux) cleanup(ep Endpoint, p Policy, withNft bool) error {
	var errs []error
	if withNft {
		if err := l.removeNft(ep, p); err != nil {
			errs = append(errs, fmt.Errorf("network: nftables remove: %w", err))
		}
	}
	if lk, err := netlink.LinkByName(ep.HostVeth); ep.HostVeth != "" && err == nil {
		if err := netlink.LinkDel(lk); err != nil {
			errs = append(errs, fmt.Errorf("network: delete veth: %w", err))
		}
	}
	if ep.Addr.IsValid() {
		if br, err := netlink.LinkByName(l.cfg.Bridge); err == nil {
			// The permanent neighbour entry would otherwise outlive the sandbox.
			if err := netlink.NeighDel(&netlink.Neigh{LinkIndex: br.Attrs().Index, IP: ep.Addr.AsSlice(), Family: netlink.FAMILY_V4}); err != nil && !errors.Is(err, unix.ENOENT) {
				errs = append(errs, fmt.Errorf("network: delete neighbour: %w", err))
			}
		}
	}
	if err := deleteNetns(ep.NetNSPath); err != nil {
		errs = append(errs, err)
	}
	for _, f := range []string{l.addrFile(ep.ID), l.policyFile(ep.ID)} {
		if err := os.Remove(f); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// addrFile records an endpoint's address beside its netns file. gVisor
// (runsc) takes the addresses off the netns interfaces when it starts, so
// after a restart the netns alone cannot tell which address is in use.
// The ".addr" dir is skipped by recover: it is a directory and not a valid ID.
func (l *Linux) addrFile(id string) string {
	return filepath.Join(l.cfg.NetnsDir, ".addr", id)
}

func (l *Linux) recordAddr(ep Endpoint) error {
	if err := os.MkdirAll(filepath.Dir(l.addrFile(ep.ID)), 0o755); err != nil {
		return fmt.Errorf("network: record address: %w", err)
	}
	if err := os.WriteFile(l.addrFile(ep.ID), []byte(ep.Addr.String()), 0o644); err != nil {
		return fmt.Errorf("network: record address: %w", err)
	}
	return nil
}

// policyFile holds an endpoint's policy, for a restarted manager: rules
// and credentials make it too big for nftables rule user data (256 bytes).
// 0600: it may hold the egress proxy's password and transform values.
func (l *Linux) policyFile(id string) string {
	return filepath.Join(l.cfg.NetnsDir, ".policy", id)
}

func (l *Linux) recordPolicy(id string, p Policy) error {
	b, err := json.Marshal(p)
	if err != nil {
		return fmt.Errorf("network: record policy: %w", err)
	}
	f := l.policyFile(id)
	if err := os.MkdirAll(filepath.Dir(f), 0o700); err != nil {
		return fmt.Errorf("network: record policy: %w", err)
	}
	tmp := f + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return fmt.Errorf("network: record policy: %w", err)
	}
	if err := os.Rename(tmp, f); err != nil {
		return fmt.Errorf("network: record policy: %w", err)
	}
	return nil
}

// recordedPolicy reads what recordPolicy wrote; false when there is none
// or it does not validate (the caller then denies all).
func (l *Linux) recordedPolicy(id string) (Policy, bool) {
	b, err := os.ReadFile(l.policyFile(id))
	if err != nil {
		return Policy{}, false
	}
	var p Policy
	if json.Unmarshal(b, &p) != nil || ValidatePolicy(p) != nil {
		return Policy{}, false
	}
	return p, true
}

// recordedAddr returns the address written by recordAddr, if any.
func (l *Linux) recordedAddr(id string) netip.Addr {
	b, err := os.ReadFile(l.addrFile(id))
	if err != nil {
		return netip.Addr{}
	}
	a, err := netip.ParseAddr(strings.TrimSpace(string(b)))
	if err != nil || !l.cfg.Pool.Contains(a) || !l.assignable(a) {
		return netip.Addr{}
	}
	return a
}

// removeNft deletes ep's nftables state in one transaction. If that fails
// (part of it is already gone, e.g. another manager instance removed it)
// each object is removed on its own and "does not exist" is ignored.
func (l *Linux) removeNft(ep Endpoint, p Policy) error {
	t := l.tables()
	c, err := newNftConn()
	if err != nil {
		return err
	}
	if err = l.delEndpoint(c, t, ep, p); err == nil {
		err = c.Flush()
	}
	if err == nil {
		return nil
	}
	steps := []func(c *nftables.Conn) error{
		func(c *nftables.Conn) error {
			return c.SetDeleteElements(t.sbx, []nftables.SetElement{{Key: ep.Addr.AsSlice()}})
		},
		func(c *nftables.Conn) error {
			return c.SetDeleteElements(t.ports, []nftables.SetElement{{Key: ifname(ep.HostVeth)}})
		},
		func(c *nftables.Conn) error {
			return c.SetDeleteElements(t.redir, []nftables.SetElement{{Key: ep.Addr.AsSlice()}})
		},
		func(c *nftables.Conn) error {
			return c.SetDeleteElements(t.tunnel, []nftables.SetElement{{Key: ep.Addr.AsSlice()}})
		},
		func(c *nftables.Conn) error {
			ch := &nftables.Chain{Name: sandboxChainName(ep.ID), Table: t.inet}
			c.FlushChain(ch)
			c.DelChain(ch)
			return nil
		},
		func(c *nftables.Conn) error {
			ch := &nftables.Chain{Name: portChainName(ep.ID), Table: t.bridge}
			c.FlushChain(ch)
			c.DelChain(ch)
			return nil
		},
	}
	var errs []error
	for _, step := range steps {
		if err := step(c); err == nil {
			err = c.Flush()
			if err != nil && !errors.Is(err, unix.ENOENT) {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// Teardown implements Manager. The removal runs outside mu; the endpoint
// keeps its address and veth name until it is gone.
func (l *Linux) Teardown(ctx context.Context, id string) error {
	if !validID(id) {
		return ErrInvalidID
	}
	op := &endpointOp{done: make(chan struct{})}
	l.mu.Lock()
	if err := l.acquireLocked(ctx, id, op); err != nil {
		l.mu.Unlock()
		return err
	}
	ep, known := l.endpoints[id]
	p := l.policies[id]
	clash := !known && l.vethTakenLocked(id, l.endpointFor(id).HostVeth)
	l.mu.Unlock()
	defer func() {
		l.mu.Lock()
		l.releaseLocked(id, op)
		l.mu.Unlock()
	}()
	if !known {
		// Nothing recorded, but remove leftovers with our deterministic
		// names (not a veth whose name another endpoint holds).
		ep = l.endpointFor(id)
		if clash {
			ep.HostVeth = ""
		}
		return l.cleanup(ep, Policy{}, false)
	}
	if err := l.cleanup(ep, p, !ep.Stale); err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.endpoints, id)
	delete(l.policies, id)
	if ep.Addr.IsValid() && l.used[ep.Addr] == id {
		delete(l.used, ep.Addr)
	}
	return nil
}

// UpdatePolicy implements Manager; the sandbox chain is flushed and
// refilled in one nftables transaction, so no packet sees a partial policy.
func (l *Linux) UpdatePolicy(ctx context.Context, id string, p Policy) error {
	allow, deny, err := l.parsePolicy(p)
	if err != nil {
		return err
	}
	op := &endpointOp{done: make(chan struct{})}
	l.mu.Lock()
	if err := l.acquireLocked(ctx, id, op); err != nil {
		l.mu.Unlock()
		return err
	}
	ep, ok := l.endpoints[id]
	old := l.policies[id]
	l.mu.Unlock()
	defer func() {
		l.mu.Lock()
		l.releaseLocked(id, op)
		l.mu.Unlock()
	}()
	if !ok || ep.Stale {
		return ErrNotFound
	}
	c, err := newNftConn()
	if err != nil {
		return fmt.Errorf("network: nftables: %w", err)
	}
	t := l.tables()
	ch := &nftables.Chain{Name: sandboxChainName(id), Table: t.inet}
	c.FlushChain(ch)
	l.addPolicyRules(c, t, ch, p, allow, deny)
	for _, set := range []struct {
		s        *nftables.Set
		was, now bool
	}{{t.redir, old.NeedsProxy(), p.NeedsProxy()}, {t.tunnel, old.Tunnels(), p.Tunnels()}} {
		switch {
		case set.now && !set.was:
			err = c.SetAddElements(set.s, []nftables.SetElement{{Key: ep.Addr.AsSlice()}})
		case set.was && !set.now:
			err = c.SetDeleteElements(set.s, []nftables.SetElement{{Key: ep.Addr.AsSlice()}})
		}
		if err != nil {
			return fmt.Errorf("network: nftables update: %w", err)
		}
	}
	var wasPorts, nowPorts []uint16
	if old.NeedsProxy() {
		wasPorts = old.RulePorts()
	}
	if p.NeedsProxy() {
		nowPorts = p.RulePorts()
	}
	gone := slices.DeleteFunc(slices.Clone(wasPorts), func(x uint16) bool { return slices.Contains(nowPorts, x) })
	added := slices.DeleteFunc(slices.Clone(nowPorts), func(x uint16) bool { return slices.Contains(wasPorts, x) })
	if len(gone) > 0 {
		if err := c.SetDeleteElements(t.redirPort, portElements(ep.Addr, gone)); err != nil {
			return fmt.Errorf("network: nftables update: %w", err)
		}
	}
	if len(added) > 0 {
		if err := c.SetAddElements(t.redirPort, portElements(ep.Addr, added)); err != nil {
			return fmt.Errorf("network: nftables update: %w", err)
		}
	}
	// Recorded first: a crash after the flush must not bring the old
	// policy back at the next start.
	if err := l.recordPolicy(id, p); err != nil {
		return err
	}
	if err := c.Flush(); err != nil {
		_ = l.recordPolicy(id, old)
		return fmt.Errorf("network: nftables update: %w", err)
	}
	l.mu.Lock()
	l.policies[id] = p
	l.mu.Unlock()
	return nil
}

// parsePolicy is parsePolicy, refusing domain entries when there is no
// egress proxy to judge them.
func (l *Linux) parsePolicy(p Policy) (allow, deny []netip.Prefix, err error) {
	if allow, deny, err = parsePolicy(p); err != nil {
		return nil, nil, err
	}
	if l.cfg.EgressPort == 0 && p.NeedsProxy() {
		return nil, nil, fmt.Errorf("%w: domain entries, rules and an egress proxy need the node's egress proxy", ErrInvalidPolicy)
	}
	return allow, deny, nil
}

// Get implements Manager.
func (l *Linux) Get(ctx context.Context, id string) (Endpoint, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	ep, ok := l.endpoints[id]
	if !ok {
		return Endpoint{}, ErrNotFound
	}
	return ep, nil
}

// List implements Manager; stale endpoints are included with Stale set.
func (l *Linux) List(ctx context.Context) ([]Endpoint, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]Endpoint, 0, len(l.endpoints))
	for _, ep := range l.endpoints {
		out = append(out, ep)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}

// Destroy tears down every endpoint, then deletes our nftables tables and
// the bridge. For tests and uninstall; `cubicle serve` should not call it
// on shutdown (endpoints must survive restarts).
func (l *Linux) Destroy(ctx context.Context) error {
	fwErr := l.fw.close()
	l.mu.Lock()
	ids := make([]string, 0, len(l.endpoints))
	for id := range l.endpoints {
		ids = append(ids, id)
	}
	l.mu.Unlock()
	errs := []error{fwErr}
	for _, id := range ids {
		if err := l.Teardown(ctx, id); err != nil {
			errs = append(errs, err)
		}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if c, err := newNftConn(); err == nil {
		for _, fam := range []nftables.TableFamily{nftables.TableFamilyINet, nftables.TableFamilyBridge} {
			if tableExists(c, l.cfg.Table, fam) {
				c.DelTable(&nftables.Table{Family: fam, Name: l.cfg.Table})
			}
		}
		if err := c.Flush(); err != nil {
			errs = append(errs, fmt.Errorf("network: delete tables: %w", err))
		}
	} else {
		errs = append(errs, err)
	}
	if br, err := netlink.LinkByName(l.cfg.Bridge); err == nil {
		if err := netlink.LinkDel(br); err != nil {
			errs = append(errs, fmt.Errorf("network: delete bridge: %w", err))
		}
	}
	return errors.Join(errs...)
}

// hardenPort makes a sandbox's bridge port accept nothing it can use to
// impersonate another port: the bridge learns no MAC from it (a frame with
// a neighbour's source MAC cannot steal that neighbour's traffic), unknown
// unicast is not flooded to it, the sandbox's own MAC is a static FDB entry
// on it, and the host's neighbour entry for its address is permanent, so
// no ARP answer can redirect host traffic. The nftables port chain
// additionally drops frames whose Ethernet, ARP or IPv4 source is not the
// sandbox's. Isolated ports exchange frames only with the bridge itself.
// Idempotent.
func (l *Linux) hardenPort(port netlink.Link, brIndex int, addr netip.Addr) error {
	mac := macFor(addr)
	steps := []struct {
		what string
		do   func() error
	}{
		{"isolate", func() error { return netlink.LinkSetIsolated(port, true) }},
		{"learning off", func() error { return netlink.LinkSetLearning(port, false) }},
		{"flood off", func() error { return netlink.LinkSetFlood(port, false) }},
		{"static fdb", func() error {
			return netlink.NeighSet(&netlink.Neigh{LinkIndex: port.Attrs().Index, Family: unix.AF_BRIDGE,
				State: netlink.NUD_NOARP, Flags: netlink.NTF_MASTER, HardwareAddr: mac})
		}},
		{"permanent neighbour", func() error {
			return netlink.NeighSet(&netlink.Neigh{LinkIndex: brIndex, Family: netlink.FAMILY_V4,
				State: netlink.NUD_PERMANENT, IP: addr.AsSlice(), HardwareAddr: mac})
		}},
	}
	for _, st := range steps {
		if err := st.do(); err != nil {
			return fmt.Errorf("network: port %s: %s: %w", port.Attrs().Name, st.what, err)
		}
	}
	return nil
}

// disableIPv6 turns IPv6 off on a host-side interface: sandboxes are IPv4
// only, and without it the host would talk IPv6 (MLD, DAD, link-local
// services) on the sandbox-facing links that the IPv4 rules do not cover.
func disableIPv6(ifname string) error {
	p := "/proc/sys/net/ipv6/conf/" + ifname + "/disable_ipv6"
	if err := os.WriteFile(p, []byte("1"), 0o644); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("network: disable IPv6 on %s: %w", ifname, err)
	}
	return nil
}

// macFor is a locally administered unicast MAC 02:42:<IPv4>.
func macFor(a netip.Addr) net.HardwareAddr {
	b := a.As4()
	return net.HardwareAddr{0x02, 0x42, b[0], b[1], b[2], b[3]}
}
