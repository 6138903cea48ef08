package network

import "net/netip"

// ForbiddenRanges are refused to every sandbox on every path (the nft
// chain, and each of the egress proxy's), whatever allowOut says,
// 0.0.0.0/0 included: "this network" and the unspecified address,
// loopback, link-local (cloud instance metadata at 169.254.169.254, which
// hands out the instance's credentials), multicast and the limited
// broadcast. The sandbox pool and the host's own addresses are refused
// with them. The operator's resolvers (Config.Resolvers) stay reachable on
// port 53 even inside these ranges (a cloud's link-local resolver).
var ForbiddenRanges = []netip.Prefix{
	netip.MustParsePrefix("0.0.0.0/8"),
	netip.MustParsePrefix("127.0.0.0/8"),
	netip.MustParsePrefix("169.254.0.0/16"),
	netip.MustParsePrefix("224.0.0.0/4"),
	netip.MustParsePrefix("255.255.255.255/32"),
}

// Verdict is the egress judgement of one destination.
type Verdict uint8

const (
	// Refused: the sandbox's policy drops it.
	Refused Verdict = iota
	// Allowed: the policy lets it through.
	Allowed
	// Forbidden: the boundary refuses it whatever the policy says (the
	// pool, the host's addresses, ForbiddenRanges).
	Forbidden
)

func (v Verdict) String() string {
	switch v {
	case Allowed:
		return "allowed"
	case Forbidden:
		return "forbidden"
	}
	return "refused"
}

// Route says how the destination was reached, which changes the
// judgement.
type Route uint8

const (
	// ByAddress: a connection to an address (TCP or UDP to a port other
	// than 53), as the nft chain judges it.
	ByAddress Route = iota
	// ToDNS: to port 53 (the resolvers' openings apply).
	ToDNS
	// ByName: an address that a name allowed by a domain entry resolved
	// to. The internal ranges are refused unless an allowOut CIDR covers
	// the address (DNS rebinding into the LAN); the forbidden ones always.
	ByName
	// Remote: a name that the sandbox's upstream SOCKS5 proxy resolves in
	// its own network (the address is unknown here, so no range of this
	// host applies): only what the policy says of every address decides.
	Remote
)
