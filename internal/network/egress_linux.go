//go:build linux

package network

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
)

// What the node's egress proxy asks of the manager: whose connection it
// holds (by source address) and what that sandbox's policy says about an
// address. Both read the live state, so a policy update applies to the
// next connection.

// GatewayOf is the bridge's address for pool: where the egress proxy
// listens before the manager exists (the manager uses the same address).
func GatewayOf(pool netip.Prefix) netip.Addr { return pool.Masked().Addr().Next() }

// SandboxPolicy returns the policy of the live sandbox at addr.
func (l *Linux) SandboxPolicy(addr netip.Addr) (string, Policy, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	id, ok := l.used[addr.Unmap()]
	if !ok {
		return "", Policy{}, false
	}
	if ep := l.endpoints[id]; ep.Stale {
		return "", Policy{}, false
	}
	p, ok := l.policies[id]
	return id, p, ok
}

// Resolvers are the sandboxes' DNS servers; the egress proxy resolves
// allowed names through them, so a name means the same to both.
func (l *Linux) Resolvers() []netip.Addr { return append([]netip.Addr(nil), l.cfg.Resolvers...) }

// hostLocal reports whether ip is assigned to an interface of the host (read
// per call: addresses come and go). Unknown means local: fail closed.
func hostLocal(ip netip.Addr) bool {
	if ip.IsLoopback() || ip.IsUnspecified() {
		return true
	}
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return true
	}
	for _, a := range addrs {
		if p, err := netip.ParsePrefix(a.String()); err == nil && p.Addr().Unmap() == ip {
			return true
		}
	}
	return false
}

// EnforcesDomains implements DomainEnforcer: domain entries are judged when
// the node runs an egress proxy.
func (l *Linux) EnforcesDomains() bool { return l.cfg.EgressPort != 0 }

// ResolveUpstream resolves an egress proxy's address (through the host's
// resolver: the host dials it) and returns the addresses it may be dialled
// at. The host's own addresses, loopback, link-local, multicast and the
// sandbox pool are never allowed: a sandbox's "proxy" there would be a
// host service. The internal ranges are refused unless Config.UpstreamAllow
// covers them (an operator's proxy on the LAN). Called at create and
// update, and again by the egress proxy at each dial, so a DNS change is
// judged too and the address is pinned for the connection.
func (l *Linux) ResolveUpstream(ctx context.Context, address string) ([]netip.AddrPort, error) {
	bad := func(err error) error {
		return &FieldError{Field: "egressProxy.address", Kind: ErrUpstream, Err: err}
	}
	host, ps, err := net.SplitHostPort(address)
	if err != nil {
		return nil, bad(fmt.Errorf("%q is not host:port", address))
	}
	port, err := strconv.ParseUint(ps, 10, 16)
	if err != nil || port == 0 {
		return nil, bad(fmt.Errorf("%q has an invalid port", address))
	}
	var ips []netip.Addr
	if ip, err := netip.ParseAddr(host); err == nil {
		ips = []netip.Addr{ip}
	} else if ips, err = net.DefaultResolver.LookupNetIP(ctx, "ip", host); err != nil {
		return nil, bad(fmt.Errorf("%q does not resolve: %w", host, errors.Unwrap(err)))
	}
	var out []netip.AddrPort
	var refused netip.Addr
	for _, ip := range ips {
		if l.upstreamAllowed(ip.Unmap()) {
			out = append(out, netip.AddrPortFrom(ip.Unmap(), uint16(port)))
		} else {
			refused = ip
		}
	}
	if len(out) == 0 {
		return nil, bad(fmt.Errorf("%s resolves to %s, a host-local, private or otherwise internal address (an operator can allow private ranges with serve --egress-proxy-allow)", host, refused))
	}
	return out, nil
}

func (l *Linux) upstreamAllowed(ip netip.Addr) bool {
	if !ip.IsValid() || ip.IsLoopback() || ip.IsUnspecified() || ip.IsMulticast() || ip.IsLinkLocalUnicast() ||
		ip.IsLinkLocalMulticast() || ip.IsInterfaceLocalMulticast() || (ip.Is4() && l.forbidden(ip)) {
		return false
	}
	for _, a := range l.cfg.UpstreamAllow {
		if a.Contains(ip) {
			return true
		}
	}
	if ip.Is6() {
		// Sandboxes have no IPv6, and the internal ranges are IPv4: an
		// IPv6 proxy (a LAN neighbour, NAT64 into 10/8) needs the
		// operator's explicit allowance.
		return false
	}
	for _, in := range l.internal {
		if in.Contains(ip) {
			return false
		}
	}
	return true
}
