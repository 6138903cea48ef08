// Package network gives each sandbox its own network namespace wired to the
// cubicle0 bridge, with an address from a pool, NAT egress and an nftables
// egress policy.
package network

import (
	"context"
	"errors"
	"fmt"
	"net/netip"

	"github.com/cubicle-dev/cubicle/internal/errdefs"
)

var (
	ErrNotFound      = errdefs.NewReason(errdefs.ErrNotFound, "network_endpoint_not_found", "network: endpoint not found")
	ErrPoolExhausted = errdefs.NewReason(errdefs.ErrResourceExhausted, "network_pool_exhausted", "network: address pool exhausted")
	ErrInvalidPolicy = errdefs.NewReason(errdefs.ErrInvalidArgument, "network_invalid_policy", "network: invalid egress policy")
	ErrInvalidID     = errdefs.NewReason(errdefs.ErrInvalidArgument, "network_invalid_id", "network: invalid sandbox id")
	ErrExists        = errdefs.NewReason(errdefs.ErrAlreadyExists, "network_endpoint_exists", "network: endpoint already exists")
	ErrInvalidConfig = errdefs.NewReason(errdefs.ErrInvalidArgument, "network_invalid_config", "network: invalid config")
)

// InternalRanges are denied to every sandbox by default, as CubeSandbox
// does: the networks where a host's private services live (RFC 1918,
// carrier-grade NAT, which overlay VPNs use), link-local (cloud instance
// metadata at 169.254.169.254, which hands out the instance's credentials),
// loopback, "this network", multicast and the reserved block. The host's
// uplink networks are added at start. AllowOut re-opens any of them; the
// configured DNS resolvers stay reachable on port 53.
var InternalRanges = []netip.Prefix{
	netip.MustParsePrefix("0.0.0.0/8"),
	netip.MustParsePrefix("10.0.0.0/8"),
	netip.MustParsePrefix("100.64.0.0/10"),
	netip.MustParsePrefix("127.0.0.0/8"),
	netip.MustParsePrefix("169.254.0.0/16"),
	netip.MustParsePrefix("172.16.0.0/12"),
	netip.MustParsePrefix("192.168.0.0/16"),
	netip.MustParsePrefix("224.0.0.0/4"),
	netip.MustParsePrefix("240.0.0.0/4"),
}

// mergePrefixes drops duplicates and prefixes covered by another entry,
// keeping the input order otherwise.
func mergePrefixes(in []netip.Prefix) []netip.Prefix {
	var out []netip.Prefix
next:
	for i, p := range in {
		p = p.Masked()
		for j, q := range in {
			q = q.Masked()
			if i != j && q.Bits() <= p.Bits() && q.Contains(p.Addr()) && (q.Bits() < p.Bits() || j < i) {
				continue next
			}
		}
		out = append(out, p)
	}
	return out
}

// Policy is the egress policy of a sandbox. Rules are evaluated in order:
// other sandboxes are always dropped; AllowOut is accepted (allow wins over
// deny, as in e2b); DenyOut is dropped; when AllowInternet is false
// everything else is dropped, otherwise the internal ranges
// (InternalRanges, the host's uplink networks) are dropped, except DNS to
// the configured resolvers, and the rest is accepted.
//
// Domain entries ("pypi.org", "*.npmjs.org") are judged by the node's
// egress proxy, by the Host header of HTTP and the SNI of TLS on ports 80
// and 443, with the same precedence; other traffic follows the IP entries.
//
// Rules transform the HTTPS requests to matching hosts and Upstream
// tunnels all TCP through a SOCKS5 proxy (transforms.go); both run in the
// egress proxy, after the rules above.
type Policy struct {
	AllowInternet bool
	AllowOut      []string          // IPs, CIDRs or domains
	DenyOut       []string          // IPs, CIDRs or domains
	Rules         map[string][]Rule `json:",omitempty"`
	Upstream      *Upstream         `json:",omitempty"`
	// DNSServers (e2b's network.dnsServers) replaces, when the policy has
	// domain entries, the default opening of the node's resolvers on port
	// 53 by all traffic to these IPv4 addresses; nil keeps the default, an
	// empty list opens none.
	DNSServers *[]string `json:",omitempty"`
}

// Endpoint is a sandbox's network attachment.
type Endpoint struct {
	ID        string     // sandbox ID
	NetNSPath string     // bind-mounted netns file, pass to runtime.Spec.NetNSPath
	Addr      netip.Addr // sandbox address on the bridge
	Gateway   netip.Addr // bridge address
	HostVeth  string     // host side veth name
	// Stale is set by List for an endpoint found on the host that is not
	// fully wired (e.g. netns file without veth or address); it carries no
	// traffic and should be torn down.
	Stale bool
}

// Manager owns the bridge, the address pool and per-sandbox endpoints.
type Manager interface {
	// Setup creates the netns, veth pair, address and policy. On error nothing is left.
	Setup(ctx context.Context, id string, p Policy) (Endpoint, error)
	// NetNSPath is where Setup makes id's netns: known before Setup ends,
	// so a runtime can prepare the sandbox that joins it meanwhile.
	NetNSPath(id string) string
	// Teardown removes everything Setup made; unknown IDs return nil.
	Teardown(ctx context.Context, id string) error
	// UpdatePolicy replaces the egress policy of a live endpoint.
	UpdatePolicy(ctx context.Context, id string, p Policy) error
	// Get returns ErrNotFound for unknown IDs.
	Get(ctx context.Context, id string) (Endpoint, error)
	// List returns every endpoint that exists on the host (for restart recovery).
	List(ctx context.Context) ([]Endpoint, error)
}

// ValidatePolicy checks that every entry is an IP, a CIDR or a domain
// (ParseDomain) and that neither list is over MaxPolicyEntries. Errors are
// a *PolicyError naming the entry, wrapping ErrInvalidPolicy.
func ValidatePolicy(p Policy) error {
	if _, _, err := splitEntries("allowOut", p.AllowOut); err != nil {
		return err
	}
	if _, _, err := splitEntries("denyOut", p.DenyOut); err != nil {
		return err
	}
	if _, err := NormalizeRules(p.Rules); err != nil {
		return err
	}
	if err := validateDNSServers(p.DNSServers); err != nil {
		return err
	}
	return ValidateUpstream(p.Upstream)
}

// MaxDNSServers bounds network.dnsServers, as e2b does.
const MaxDNSServers = 10

func validateDNSServers(list *[]string) error {
	if list == nil {
		return nil
	}
	if len(*list) > MaxDNSServers {
		return &FieldError{Field: "dnsServers", Kind: ErrInvalidPolicy, Err: fmt.Errorf("at most %d entries, got %d", MaxDNSServers, len(*list))}
	}
	for i, s := range *list {
		if a, err := netip.ParseAddr(s); err != nil || !a.Is4() {
			return &FieldError{Field: fmt.Sprintf("dnsServers[%d]", i), Kind: ErrInvalidPolicy, Err: fmt.Errorf("%q is not an IPv4 address", s)}
		}
	}
	return nil
}

// dnsServers are the parsed DNSServers (valid: checked by ValidatePolicy).
func (p Policy) dnsServers() []netip.Addr {
	if p.DNSServers == nil {
		return nil
	}
	out := make([]netip.Addr, 0, len(*p.DNSServers))
	for _, s := range *p.DNSServers {
		if a, err := netip.ParseAddr(s); err == nil {
			out = append(out, a)
		}
	}
	return out
}

// ParsePrefix accepts "1.2.3.4" or "1.2.3.0/24".
func ParsePrefix(s string) (netip.Prefix, error) {
	if p, err := netip.ParsePrefix(s); err == nil {
		return p.Masked(), nil
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Prefix{}, errors.Join(ErrInvalidPolicy, errors.New("not an IP or CIDR: "+s))
	}
	return netip.PrefixFrom(a, a.BitLen()), nil
}
