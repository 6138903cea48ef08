//go:build linux

package network

import (
	"net/netip"

	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// step is one rule of a sandbox's egress chain: packets to dst (every
// address when !dst.IsValid(); except the addresses in but) that match the
// protocol filter get accept or drop. The nft chain is built from the steps
// (addPolicyRules) and Judge walks the same steps, so the two cannot drift.
type step struct {
	dst     netip.Prefix
	but     []netip.Addr
	proto   stepProto
	local   bool // the host's own addresses (fib daddr type local)
	accept  bool
	forbids bool // a boundary step, not the policy's
}

type stepProto uint8

const (
	anyProto stepProto = iota
	dnsOnly            // UDP or TCP to port 53
	notDNS             // anything but UDP or TCP to port 53
	notTCP             // anything but TCP
)

// matches reports whether a TCP (or, for ToDNS, port 53) connection to ip
// meets s. An invalid ip (Route Remote) matches only steps for every
// address.
func (s step) matches(ip netip.Addr, r Route) bool {
	if !ip.IsValid() {
		if s.local || (s.dst.IsValid() && s.dst.Bits() != 0) {
			return false
		}
	} else if s.dst.IsValid() && !s.dst.Contains(ip) {
		return false
	}
	for _, b := range s.but {
		if b == ip {
			return false
		}
	}
	dns := r == ToDNS
	switch s.proto {
	case dnsOnly:
		if !dns {
			return false
		}
	case notDNS:
		if dns {
			return false
		}
	case notTCP:
		return false // the proxy judges TCP
	}
	return !s.local || hostLocal(ip)
}

// steps is the chain of a sandbox with policy p (allow and deny are its
// parsed prefixes), in order:
//   - the boundary: the pool, ForbiddenRanges (but the operator's resolvers
//     on port 53) and the host's own addresses;
//   - with an upstream proxy, everything but TCP (which is redirected to
//     the egress proxy): UDP, so QUIC falls back to TCP, and DNS, which the
//     egress proxy answers itself;
//   - with the egress proxy in use, the resolvers (or dnsServers with
//     domains) early, so names resolve under deny-all as in e2b;
//   - allowOut (wins), denyOut;
//   - no internet: the rest; else the resolvers, the internal ranges, and
//     the rest accepted.
func (l *Linux) steps(p Policy, allow, deny []netip.Prefix) []step {
	out := []step{{dst: l.cfg.Pool, forbids: true}}
	for _, f := range ForbiddenRanges {
		var but []netip.Addr
		for _, r := range l.cfg.Resolvers {
			if f.Contains(r) {
				but = append(but, r)
			}
		}
		out = append(out, step{dst: f, but: but, forbids: true})
		for _, r := range but {
			out = append(out, step{dst: netip.PrefixFrom(r, 32), proto: notDNS, forbids: true})
		}
	}
	out = append(out, step{local: true, forbids: true})
	if p.Tunnels() {
		out = append(out, step{proto: notTCP})
	}
	switch {
	case p.HasDomains() && p.DNSServers != nil:
		// The caller's own list: all traffic to each, as e2b opens them.
		for _, a := range p.dnsServers() {
			out = append(out, step{dst: netip.PrefixFrom(a, 32), accept: true})
		}
	case p.NeedsProxy():
		out = append(out, l.resolverSteps()...)
	}
	for _, a := range allow {
		out = append(out, step{dst: a, accept: true})
	}
	for _, d := range deny {
		out = append(out, step{dst: d})
	}
	if !p.AllowInternet {
		return append(out, step{})
	}
	out = append(out, l.resolverSteps()...)
	for _, in := range l.internal {
		out = append(out, step{dst: in})
	}
	return append(out, step{accept: true})
}

func (l *Linux) resolverSteps() []step {
	var out []step
	for _, r := range l.cfg.Resolvers {
		if r.Is4() {
			out = append(out, step{dst: netip.PrefixFrom(r, 32), proto: dnsOnly, accept: true})
		}
	}
	return out
}

// Judge is the one egress judgement of a destination address for a
// sandbox's policy. The nft chain is built from the same steps
// (addPolicyRules), and the egress proxy calls it for every connection it
// dials: by address, by a name's resolved address, through an upstream
// proxy, and for hosts with transform rules. What is Forbidden is refused
// on every path whatever allowOut says.
func (l *Linux) Judge(p Policy, ip netip.Addr, r Route) Verdict {
	if r == Remote {
		ip = netip.Addr{}
	} else if ip = ip.Unmap(); !ip.Is4() {
		return Forbidden // sandboxes have no IPv6
	}
	allow, deny, err := parsePolicy(p)
	if err != nil {
		return Refused
	}
	steps := l.steps(p, allow, deny)
	if r == ByName {
		for _, s := range steps {
			if s.forbids && s.matches(ip, ByAddress) && !s.accept {
				return Forbidden
			}
		}
		for _, a := range allow {
			if a.Contains(ip) {
				return Allowed
			}
		}
		for _, in := range l.internal {
			if in.Contains(ip) {
				return Refused
			}
		}
		return Allowed
	}
	for _, s := range steps {
		if !s.matches(ip, r) {
			continue
		}
		switch {
		case s.accept:
			return Allowed
		case s.forbids:
			return Forbidden
		}
		return Refused
	}
	return Refused
}

// forbidden reports whether ip is refused by the boundary whatever a
// policy says (the steps every chain starts with).
func (l *Linux) forbidden(ip netip.Addr) bool {
	return l.Judge(Policy{AllowInternet: true, AllowOut: []string{"0.0.0.0/0"}}, ip, ByAddress) == Forbidden
}

// stepRules are the nft rules (one or two) of s in a sandbox chain.
func stepRules(s step) [][]expr.Any {
	var m []expr.Any
	if s.dst.IsValid() && s.dst.Bits() > 0 {
		m = ipMatch(16, s.dst)
	}
	for _, b := range s.but {
		m = append(m, &expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4}, cmpNeq(b.AsSlice()))
	}
	if s.local {
		m = append(m, &expr.Fib{Register: 1, FlagDADDR: true, ResultADDRTYPE: true},
			cmpEq(binaryutil.NativeEndian.PutUint32(unix.RTN_LOCAL)))
	}
	v := verdict(expr.VerdictDrop)
	if s.accept {
		v = verdict(expr.VerdictAccept)
	}
	l4 := func() expr.Any { return meta(expr.MetaKeyL4PROTO) }
	dport := func() expr.Any {
		return &expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2}
	}
	switch s.proto {
	case dnsOnly:
		return [][]expr.Any{
			concat(m, []expr.Any{l4(), cmpEq([]byte{unix.IPPROTO_UDP}), dport(), cmpEq([]byte{0, 53}), v}),
			concat(m, []expr.Any{l4(), cmpEq([]byte{unix.IPPROTO_TCP}), dport(), cmpEq([]byte{0, 53}), v}),
		}
	case notDNS:
		return [][]expr.Any{
			concat(m, []expr.Any{l4(), cmpNeq([]byte{unix.IPPROTO_UDP}), cmpNeq([]byte{unix.IPPROTO_TCP}), v}),
			concat(m, []expr.Any{dport(), cmpNeq([]byte{0, 53}), v}),
		}
	case notTCP:
		return [][]expr.Any{concat(m, []expr.Any{l4(), cmpNeq([]byte{unix.IPPROTO_TCP}), v})}
	}
	return [][]expr.Any{concat(m, []expr.Any{v})}
}
