//go:build linux

package network

import (
	"encoding/json"
	"errors"
	"net/netip"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// nftables layout (all inside our own tables, never anything else):
//
//	table inet <Table>
//	  map sbx { ipv4_addr : verdict }         sandbox addr -> jump s_<hash>
//	  chain forward   (filter/forward, accept)
//	    oif br, iif != br, ct established,related  accept   replies to sandboxes
//	    oif br, iif != br                          drop     nothing unsolicited in
//	    iif br, ipv4, ip saddr vmap @sbx                     per-sandbox policy
//	    iif br                                     drop     unknown source / ipv6
//	  chain input     (filter/input, accept)
//	    iif br, ct established,related accept; iif br drop  host services unreachable
//	    iif br, ip saddr @redir, tcp dport <egress> accept (the egress proxy)
//	  set redir { ipv4_addr }                 sandboxes with domains, rules or an upstream
//	  set tunnel { ipv4_addr }                sandboxes with an upstream (a subset of redir)
//	  set redirport { ipv4_addr . inet_service }  ports other than 80|443 rules name (RulePorts)
//	    iif br, ip saddr @tunnel, udp dport <egress> accept (its DNS answers)
//	  chain prerouting (nat/prerouting)
//	    iif br, ip saddr @redir, tcp dport 80|443 redirect to :<egress>
//	    iif br, ip saddr . tcp dport @redirport redirect to :<egress>
//	    iif br, ip saddr @tunnel, tcp redirect to :<egress>
//	    iif br, ip saddr @tunnel, udp dport 53 redirect to :<egress>
//	  chain postrouting (nat/postrouting)
//	    ipv4, ip saddr <pool>, oif != br (or oif == EgressIface) masquerade
//	  chain s_<hash>  per sandbox, replaced atomically by UpdatePolicy: the
//	    steps of judge_linux.go (pool, ForbiddenRanges, host addresses drop;
//	    with an upstream everything but TCP drop; with domain rules:
//	    resolvers:53 accept; allow... accept; deny... drop; then no
//	    internet: drop; else resolvers:53 accept, internal ranges drop, accept)
//	  set flows, set rate { ipv4_addr }       dynamic, per sandbox address
//	  chain limits (filter/prerouting, -150, after conntrack)
//	    iif br, ct state new, update @rate { ip saddr limit rate over R/s burst 2R } drop
//	    iif br, ct state new, add @flows { ip saddr ct count over N } drop
//	table bridge <Table>
//	  map ports { ifname : verdict }          host veth -> jump p_<hash>
//	  chain prerouting (filter/prerouting, accept): iifname vmap @ports
//	  chain p_<hash>: anti-spoofing (Ethernet, ARP and IPv4 sources must be the
//	    sandbox's), only IPv4 and ARP pass (no IPv6/NDP, no VLAN tags)
const (
	setSandboxes = "sbx"
	setPorts     = "ports"
	setRedirect  = "redir"
	setTunnel    = "tunnel"
	setRedirPort = "redirport"
	setFlows     = "flows"
	setRate      = "rate"
)

type nftTables struct {
	inet, bridge              *nftables.Table
	sbx, ports, redir, tunnel *nftables.Set
	redirPort                 *nftables.Set
}

func (l *Linux) tables() nftTables {
	inet := &nftables.Table{Family: nftables.TableFamilyINet, Name: l.cfg.Table}
	br := &nftables.Table{Family: nftables.TableFamilyBridge, Name: l.cfg.Table}
	return nftTables{
		inet:   inet,
		bridge: br,
		sbx:    &nftables.Set{Table: inet, Name: setSandboxes, IsMap: true, KeyType: nftables.TypeIPAddr, DataType: nftables.TypeVerdict},
		redir:  &nftables.Set{Table: inet, Name: setRedirect, KeyType: nftables.TypeIPAddr},
		tunnel: &nftables.Set{Table: inet, Name: setTunnel, KeyType: nftables.TypeIPAddr},
		redirPort: &nftables.Set{Table: inet, Name: setRedirPort, Concatenation: true,
			KeyType: nftables.MustConcatSetType(nftables.TypeIPAddr, nftables.TypeInetService)},
		ports: &nftables.Set{Table: br, Name: setPorts, IsMap: true, KeyType: nftables.TypeIFName, DataType: nftables.TypeVerdict, KeyByteOrder: binaryutil.NativeEndian}, // only affects how nft(8) prints the names
	}
}

// newNftConn opens a netlink connection for one transaction. A policy of
// a thousand entries is that many rules, and the kernel acknowledges each:
// the default receive buffer (rmem_default) overflows with ENOBUFS. Root may
// force a bigger one; it costs memory only while messages are queued.
func newNftConn() (*nftables.Conn, error) {
	return nftables.New(nftables.WithSockOptions(func(c *netlink.Conn) error {
		rc, err := c.SyscallConn()
		if err != nil {
			return err
		}
		var serr error
		if err := rc.Control(func(fd uintptr) {
			// The whole batch is one sendmsg, bounded by the send buffer.
			// Forcing needs CAP_NET_ADMIN in the initial user namespace;
			// elsewhere the plain options give what rmem_max allows.
			for _, o := range [][2]int{{unix.SO_RCVBUFFORCE, unix.SO_RCVBUF}, {unix.SO_SNDBUFFORCE, unix.SO_SNDBUF}} {
				if err := unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, o[0], 32<<20); err != nil {
					serr = errors.Join(serr, unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, o[1], 32<<20))
				}
			}
		}); err != nil {
			return err
		}
		return serr
	}))
}

func sandboxChainName(id string) string { return "s_" + idHash(id) }
func portChainName(id string) string    { return "p_" + idHash(id) }

func ifname(n string) []byte {
	b := make([]byte, 16)
	copy(b, n)
	return b
}

func cmpEq(data []byte) expr.Any {
	return &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: data}
}
func cmpNeq(data []byte) expr.Any {
	return &expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: data}
}
func meta(k expr.MetaKey) expr.Any { return &expr.Meta{Key: k, Register: 1} }

func iif(name string, eq bool) []expr.Any {
	if eq {
		return []expr.Any{meta(expr.MetaKeyIIFNAME), cmpEq(ifname(name))}
	}
	return []expr.Any{meta(expr.MetaKeyIIFNAME), cmpNeq(ifname(name))}
}

func oif(name string, eq bool) []expr.Any {
	if eq {
		return []expr.Any{meta(expr.MetaKeyOIFNAME), cmpEq(ifname(name))}
	}
	return []expr.Any{meta(expr.MetaKeyOIFNAME), cmpNeq(ifname(name))}
}

func ipv4Only() []expr.Any {
	return []expr.Any{meta(expr.MetaKeyNFPROTO), cmpEq([]byte{unix.NFPROTO_IPV4})}
}

func ctEstablished() []expr.Any {
	return []expr.Any{
		&expr.Ct{Register: 1, Key: expr.CtKeySTATE},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(expr.CtStateBitESTABLISHED | expr.CtStateBitRELATED),
			Xor:  binaryutil.NativeEndian.PutUint32(0)},
		cmpNeq(binaryutil.NativeEndian.PutUint32(0)),
	}
}

// ipMatch loads the IPv4 source (off 12) or destination (off 16) and compares
// it against prefix p.
func ipMatch(off uint32, p netip.Prefix) []expr.Any {
	out := []expr.Any{&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: 4}}
	if p.Bits() < 32 {
		m := make([]byte, 4)
		for i := 0; i < p.Bits(); i++ {
			m[i/8] |= 0x80 >> (i % 8)
		}
		out = append(out, &expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: m, Xor: make([]byte, 4)})
	}
	return append(out, cmpEq(p.Masked().Addr().AsSlice()))
}

func verdict(k expr.VerdictKind) expr.Any { return &expr.Verdict{Kind: k} }

func concat(parts ...[]expr.Any) []expr.Any {
	var out []expr.Any
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

// addBase queues the tables, maps and base chains.
func (l *Linux) addBase(c *nftables.Conn, t nftTables) error {
	br := l.cfg.Bridge
	accept := nftables.ChainPolicyAccept
	c.AddTable(t.inet)
	c.AddTable(t.bridge)
	if err := c.AddSet(t.sbx, nil); err != nil {
		return err
	}
	if err := c.AddSet(t.ports, nil); err != nil {
		return err
	}
	if err := c.AddSet(t.redir, nil); err != nil {
		return err
	}
	if err := c.AddSet(t.tunnel, nil); err != nil {
		return err
	}
	if err := c.AddSet(t.redirPort, nil); err != nil {
		return err
	}

	fwd := c.AddChain(&nftables.Chain{Name: "forward", Table: t.inet, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityFilter, Policy: &accept})
	c.AddRule(&nftables.Rule{Table: t.inet, Chain: fwd, Exprs: concat(oif(br, true), iif(br, false), ctEstablished(), []expr.Any{verdict(expr.VerdictAccept)})})
	c.AddRule(&nftables.Rule{Table: t.inet, Chain: fwd, Exprs: concat(oif(br, true), iif(br, false), []expr.Any{verdict(expr.VerdictDrop)})})
	c.AddRule(&nftables.Rule{Table: t.inet, Chain: fwd, Exprs: concat(iif(br, true), ipv4Only(), []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 12, Len: 4},
		&expr.Lookup{SourceRegister: 1, DestRegister: 0, IsDestRegSet: true, SetName: t.sbx.Name, SetID: t.sbx.ID},
	})})
	c.AddRule(&nftables.Rule{Table: t.inet, Chain: fwd, Exprs: concat(iif(br, true), []expr.Any{verdict(expr.VerdictDrop)})})

	in := c.AddChain(&nftables.Chain{Name: "input", Table: t.inet, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookInput, Priority: nftables.ChainPriorityFilter, Policy: &accept})
	c.AddRule(&nftables.Rule{Table: t.inet, Chain: in, Exprs: concat(iif(br, true), ctEstablished(), []expr.Any{verdict(expr.VerdictAccept)})})
	if port := l.cfg.EgressPort; port != 0 {
		c.AddRule(&nftables.Rule{Table: t.inet, Chain: in, Exprs: concat(iif(br, true), inSet(t.redir), tcpDport(port), []expr.Any{verdict(expr.VerdictAccept)})})
		c.AddRule(&nftables.Rule{Table: t.inet, Chain: in, Exprs: concat(iif(br, true), inSet(t.tunnel), udpDport(port), []expr.Any{verdict(expr.VerdictAccept)})})
		nat := c.AddChain(&nftables.Chain{Name: "prerouting", Table: t.inet, Type: nftables.ChainTypeNAT,
			Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityNATDest, Policy: &accept})
		redirect := []expr.Any{
			&expr.Immediate{Register: 1, Data: binaryutil.BigEndian.PutUint16(port)},
			&expr.Redir{RegisterProtoMin: 1},
		}
		for _, dport := range []uint16{80, 443} {
			c.AddRule(&nftables.Rule{Table: t.inet, Chain: nat, Exprs: concat(iif(br, true), inSet(t.redir), tcpDport(dport), redirect)})
		}
		// Source address and destination port, concatenated into
		// registers 1 and 9 as nft(8) lays out "ip saddr . tcp dport".
		c.AddRule(&nftables.Rule{Table: t.inet, Chain: nat, Exprs: concat(iif(br, true), ipv4Only(),
			[]expr.Any{meta(expr.MetaKeyL4PROTO), cmpEq([]byte{unix.IPPROTO_TCP}),
				&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 12, Len: 4},
				&expr.Payload{DestRegister: 9, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
				&expr.Lookup{SourceRegister: 1, SetName: t.redirPort.Name, SetID: t.redirPort.ID}}, redirect)})
		c.AddRule(&nftables.Rule{Table: t.inet, Chain: nat, Exprs: concat(iif(br, true), inSet(t.tunnel),
			[]expr.Any{meta(expr.MetaKeyL4PROTO), cmpEq([]byte{unix.IPPROTO_TCP})}, redirect)})
		// A tunnelled sandbox's DNS is answered by the egress proxy (its
		// TCP, port 53 included, is redirected just above).
		c.AddRule(&nftables.Rule{Table: t.inet, Chain: nat, Exprs: concat(iif(br, true), inSet(t.tunnel), udpDport(53), redirect)})
	}
	c.AddRule(&nftables.Rule{Table: t.inet, Chain: in, Exprs: concat(iif(br, true), []expr.Any{verdict(expr.VerdictDrop)})})

	post := c.AddChain(&nftables.Chain{Name: "postrouting", Table: t.inet, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityNATSource, Policy: &accept})
	egress := oif(br, false)
	if l.cfg.EgressIface != "" {
		egress = oif(l.cfg.EgressIface, true)
	}
	c.AddRule(&nftables.Rule{Table: t.inet, Chain: post, Exprs: concat(ipv4Only(), ipMatch(12, l.cfg.Pool), egress, []expr.Any{&expr.Masq{}})})

	pre := c.AddChain(&nftables.Chain{Name: "prerouting", Table: t.bridge, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityConntrack, Policy: &accept})
	c.AddRule(&nftables.Rule{Table: t.bridge, Chain: pre, Exprs: []expr.Any{
		meta(expr.MetaKeyIIFNAME),
		&expr.Lookup{SourceRegister: 1, DestRegister: 0, IsDestRegSet: true, SetName: t.ports.Name, SetID: t.ports.ID},
	}})
	return l.addFlowLimits(c, t)
}

// addFlowLimits queues the per-sandbox conntrack budget (Config.MaxFlows,
// Config.NewFlowRate). It sits at prerouting, so every new flow from a
// sandbox counts, forwarded, redirected to the egress proxy or dropped
// later. Dynamic sets keyed by the (anti-spoofed) source address keep one
// counter and one token bucket per sandbox; a flow dropped here is never
// confirmed, so it takes no conntrack entry.
func (l *Linux) addFlowLimits(c *nftables.Conn, t nftTables) error {
	if l.cfg.MaxFlows == 0 && l.cfg.NewFlowRate == 0 {
		return nil
	}
	accept := nftables.ChainPolicyAccept
	ch := c.AddChain(&nftables.Chain{Name: "limits", Table: t.inet, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityMangle, Policy: &accept})
	newFromSandbox := concat(iif(l.cfg.Bridge, true), ipv4Only(), ctNew(), []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 12, Len: 4},
	})
	size := uint32(1) << (32 - l.cfg.Pool.Bits())
	if r := l.cfg.NewFlowRate; r > 0 {
		set := &nftables.Set{Table: t.inet, Name: setRate, KeyType: nftables.TypeIPAddr, Dynamic: true, Size: size}
		if err := c.AddSet(set, nil); err != nil {
			return err
		}
		c.AddRule(&nftables.Rule{Table: t.inet, Chain: ch, Exprs: concat(newFromSandbox, []expr.Any{
			&expr.Dynset{SrcRegKey: 1, SetName: set.Name, SetID: set.ID, Operation: uint32(unix.NFT_DYNSET_OP_UPDATE),
				Exprs: []expr.Any{&expr.Limit{Type: expr.LimitTypePkts, Rate: uint64(r), Unit: expr.LimitTimeSecond, Burst: uint32(2 * r), Over: true}}},
			verdict(expr.VerdictDrop),
		})})
	}
	if n := l.cfg.MaxFlows; n > 0 {
		set := &nftables.Set{Table: t.inet, Name: setFlows, KeyType: nftables.TypeIPAddr, Dynamic: true, Size: size}
		if err := c.AddSet(set, nil); err != nil {
			return err
		}
		c.AddRule(&nftables.Rule{Table: t.inet, Chain: ch, Exprs: concat(newFromSandbox, []expr.Any{
			&expr.Dynset{SrcRegKey: 1, SetName: set.Name, SetID: set.ID, Operation: uint32(unix.NFT_DYNSET_OP_ADD),
				Exprs: []expr.Any{&expr.Connlimit{Count: uint32(n), Flags: expr.NFT_CONNLIMIT_F_INV}}},
			verdict(expr.VerdictDrop),
		})})
	}
	return nil
}

func ctNew() []expr.Any {
	return []expr.Any{
		&expr.Ct{Register: 1, Key: expr.CtKeySTATE},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(expr.CtStateBitNEW),
			Xor:  binaryutil.NativeEndian.PutUint32(0)},
		cmpNeq(binaryutil.NativeEndian.PutUint32(0)),
	}
}

// portElements are redirport's elements for a sandbox's rule ports: the
// address, then the port in network order padded to a 32-bit register.
func portElements(addr netip.Addr, ports []uint16) []nftables.SetElement {
	out := make([]nftables.SetElement, 0, len(ports))
	for _, port := range ports {
		key := append(addr.AsSlice(), byte(port>>8), byte(port), 0, 0)
		out = append(out, nftables.SetElement{Key: key})
	}
	return out
}

// inSet matches IPv4 packets from a sandbox in set (redir or tunnel).
func inSet(set *nftables.Set) []expr.Any {
	return concat(ipv4Only(), []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 12, Len: 4},
		&expr.Lookup{SourceRegister: 1, SetName: set.Name, SetID: set.ID},
	})
}

func udpDport(port uint16) []expr.Any {
	return []expr.Any{meta(expr.MetaKeyL4PROTO), cmpEq([]byte{unix.IPPROTO_UDP}),
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		cmpEq(binaryutil.BigEndian.PutUint16(port))}
}

func tcpDport(port uint16) []expr.Any {
	return []expr.Any{meta(expr.MetaKeyL4PROTO), cmpEq([]byte{unix.IPPROTO_TCP}),
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		cmpEq(binaryutil.BigEndian.PutUint16(port))}
}

// addPolicyRules queues the rules of sandbox chain ch for policy p (the
// policy itself is recorded in a file, see recordPolicy): the steps that
// Judge walks too.
func (l *Linux) addPolicyRules(c *nftables.Conn, t nftTables, ch *nftables.Chain, p Policy, allow, deny []netip.Prefix) {
	for _, s := range l.steps(p, allow, deny) {
		for _, e := range stepRules(s) {
			c.AddRule(&nftables.Rule{Table: t.inet, Chain: ch, Exprs: e})
		}
	}
}

// addEndpoint queues everything nftables needs for one endpoint.
func (l *Linux) addEndpoint(c *nftables.Conn, t nftTables, ep Endpoint, p Policy, allow, deny []netip.Prefix) error {
	sc := c.AddChain(&nftables.Chain{Name: sandboxChainName(ep.ID), Table: t.inet})
	l.addPolicyRules(c, t, sc, p, allow, deny)
	if p.NeedsProxy() && l.cfg.EgressPort != 0 {
		if err := c.SetAddElements(t.redir, []nftables.SetElement{{Key: ep.Addr.AsSlice()}}); err != nil {
			return err
		}
		if p.Tunnels() {
			if err := c.SetAddElements(t.tunnel, []nftables.SetElement{{Key: ep.Addr.AsSlice()}}); err != nil {
				return err
			}
		}
		if ports := p.RulePorts(); len(ports) > 0 {
			if err := c.SetAddElements(t.redirPort, portElements(ep.Addr, ports)); err != nil {
				return err
			}
		}
	}
	if err := c.SetAddElements(t.sbx, []nftables.SetElement{{
		Key: ep.Addr.AsSlice(), VerdictData: &expr.Verdict{Kind: expr.VerdictJump, Chain: sc.Name},
	}}); err != nil {
		return err
	}

	pc := c.AddChain(&nftables.Chain{Name: portChainName(ep.ID), Table: t.bridge})
	addr := ep.Addr.AsSlice()
	mac := []byte(macFor(ep.Addr))
	be16 := func(v uint16) []byte { return []byte{byte(v >> 8), byte(v)} }
	rule := func(e ...expr.Any) {
		c.AddRule(&nftables.Rule{Table: t.bridge, Chain: pc, Exprs: e})
	}
	// Only the sandbox's own MAC may appear as an Ethernet source.
	rule(&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseLLHeader, Offset: 6, Len: 6},
		cmpNeq(mac), verdict(expr.VerdictDrop))
	// meta protocol is the ethertype in network byte order.
	rule(meta(expr.MetaKeyPROTOCOL), cmpEq(be16(unix.ETH_P_IP)),
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 12, Len: 4},
		cmpNeq(addr), verdict(expr.VerdictDrop))
	rule(meta(expr.MetaKeyPROTOCOL), cmpEq(be16(unix.ETH_P_IP)), verdict(expr.VerdictAccept))
	// Ethernet/IPv4 ARP: sender hardware address at offset 8, sender
	// protocol address at 14.
	rule(meta(expr.MetaKeyPROTOCOL), cmpEq(be16(unix.ETH_P_ARP)),
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 8, Len: 6},
		cmpNeq(mac), verdict(expr.VerdictDrop))
	rule(meta(expr.MetaKeyPROTOCOL), cmpEq(be16(unix.ETH_P_ARP)),
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 14, Len: 4},
		cmpNeq(addr), verdict(expr.VerdictDrop))
	rule(meta(expr.MetaKeyPROTOCOL), cmpEq(be16(unix.ETH_P_ARP)), verdict(expr.VerdictAccept))
	// Everything else: IPv6 (so NDP and router advertisements), VLAN tags
	// that would carry a frame past the checks above, STP, LLDP...
	rule(verdict(expr.VerdictDrop))
	return c.SetAddElements(t.ports, []nftables.SetElement{{
		Key: ifname(ep.HostVeth), VerdictData: &expr.Verdict{Kind: expr.VerdictJump, Chain: pc.Name},
	}})
}

// delEndpoint queues removal of one endpoint's nftables state.
func (l *Linux) delEndpoint(c *nftables.Conn, t nftTables, ep Endpoint, p Policy) error {
	if err := c.SetDeleteElements(t.sbx, []nftables.SetElement{{Key: ep.Addr.AsSlice()}}); err != nil {
		return err
	}
	if err := c.SetDeleteElements(t.ports, []nftables.SetElement{{Key: ifname(ep.HostVeth)}}); err != nil {
		return err
	}
	if p.NeedsProxy() {
		if err := c.SetDeleteElements(t.redir, []nftables.SetElement{{Key: ep.Addr.AsSlice()}}); err != nil {
			return err
		}
	}
	if p.Tunnels() {
		if err := c.SetDeleteElements(t.tunnel, []nftables.SetElement{{Key: ep.Addr.AsSlice()}}); err != nil {
			return err
		}
	}
	if ports := p.RulePorts(); p.NeedsProxy() && len(ports) > 0 {
		if err := c.SetDeleteElements(t.redirPort, portElements(ep.Addr, ports)); err != nil {
			return err
		}
	}
	c.FlushChain(&nftables.Chain{Name: sandboxChainName(ep.ID), Table: t.inet})
	c.DelChain(&nftables.Chain{Name: sandboxChainName(ep.ID), Table: t.inet})
	c.FlushChain(&nftables.Chain{Name: portChainName(ep.ID), Table: t.bridge})
	c.DelChain(&nftables.Chain{Name: portChainName(ep.ID), Table: t.bridge})
	return nil
}

// storedPolicies reads the policy of every sandbox chain in a table made
// by an older build, which kept it in the first rule's user data, keyed by
// chain name.
func storedPolicies(c *nftables.Conn, inet *nftables.Table) map[string]Policy {
	out := map[string]Policy{}
	chains, err := c.ListChainsOfTableFamily(nftables.TableFamilyINet)
	if err != nil {
		return out
	}
	for _, ch := range chains {
		if ch.Table.Name != inet.Name || len(ch.Name) < 3 || ch.Name[:2] != "s_" {
			continue
		}
		rules, err := c.GetRules(inet, ch)
		if err != nil || len(rules) == 0 {
			continue
		}
		var p Policy
		if json.Unmarshal(rules[0].UserData, &p) == nil {
			out[ch.Name] = p
		}
	}
	return out
}

func tableExists(c *nftables.Conn, name string, fam nftables.TableFamily) bool {
	t, err := c.ListTableOfFamily(name, fam)
	return err == nil && t != nil
}
