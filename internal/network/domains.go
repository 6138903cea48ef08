package network

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"

	"github.com/cubicle-dev/cubicle/internal/errdefs"
)

// MaxPolicyEntries bounds allowOut and denyOut: each entry is a rule the
// kernel or the egress proxy evaluates per connection.
const MaxPolicyEntries = 1000

// ErrDomainName: an entry is neither an IP, a CIDR nor a domain name.
var ErrDomainName = errdefs.NewReason(errdefs.ErrInvalidArgument, "network_invalid_domain", "not an IP, CIDR or domain name")

// PolicyError names the policy entry that was refused. It wraps
// ErrInvalidPolicy and the reason.
type PolicyError struct {
	Field string // "allowOut" or "denyOut"
	Index int    // -1 for the list as a whole
	Entry string
	Err   error
}

func (e *PolicyError) Error() string {
	if e.Index < 0 {
		return fmt.Sprintf("%s: %v", e.Field, e.Err)
	}
	return fmt.Sprintf("%s[%d]: %q is %v", e.Field, e.Index, e.Entry, e.Err)
}

func (e *PolicyError) Unwrap() []error { return []error{ErrInvalidPolicy, e.Err} }

// ParseDomain normalises a domain entry: a DNS name ("pypi.org") or a
// wildcard for its subdomains at any depth ("*.npmjs.org", which does not
// match the apex, as in e2b). Lower-cased, without a trailing dot. A bare
// "*", a wildcard elsewhere than the first label, IP literals and names
// that are not RFC 1123 host names are refused.
func ParseDomain(s string) (string, error) {
	d := strings.TrimSuffix(strings.ToLower(strings.TrimSpace(s)), ".")
	name := d
	if rest, ok := strings.CutPrefix(d, "*."); ok {
		name = rest
	}
	if name == "" || name == "*" {
		return "", fmt.Errorf("%w: a wildcard needs a domain after \"*.\"", ErrDomainName)
	}
	if len(name) > 253 {
		return "", fmt.Errorf("%w: longer than 253 characters", ErrDomainName)
	}
	if _, err := netip.ParseAddr(name); err == nil {
		return "", fmt.Errorf("%w: an IP address cannot be a wildcard", ErrDomainName)
	}
	for _, label := range strings.Split(name, ".") {
		if len(label) == 0 || len(label) > 63 {
			return "", fmt.Errorf("%w: empty or over-long label", ErrDomainName)
		}
		if label[0] == '-' || label[len(label)-1] == '-' {
			return "", fmt.Errorf("%w: a label starts or ends with '-'", ErrDomainName)
		}
		for _, c := range label {
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return "", fmt.Errorf("%w: character %q", ErrDomainName, c)
			}
		}
	}
	return d, nil
}

// MatchDomain reports whether host matches the normalised pattern.
func MatchDomain(pattern, host string) bool {
	host = strings.TrimSuffix(strings.ToLower(host), ".")
	if suffix, ok := strings.CutPrefix(pattern, "*."); ok {
		return strings.HasSuffix(host, "."+suffix)
	}
	return host == pattern
}

// splitEntries separates a policy list into CIDRs and domain patterns.
func splitEntries(field string, list []string) (prefixes []netip.Prefix, domains []string, err error) {
	if len(list) > MaxPolicyEntries {
		return nil, nil, &PolicyError{Field: field, Index: -1, Err: fmt.Errorf("at most %d entries, got %d", MaxPolicyEntries, len(list))}
	}
	for i, s := range list {
		if p, perr := ParsePrefix(s); perr == nil {
			prefixes = append(prefixes, p)
			continue
		}
		d, derr := ParseDomain(s)
		if derr != nil {
			return nil, nil, &PolicyError{Field: field, Index: i, Entry: s, Err: derr}
		}
		domains = append(domains, d)
	}
	return prefixes, domains, nil
}

// Domains returns the policy's domain entries, normalised; entries that
// do not parse are left out (ValidatePolicy refuses them).
func (p Policy) Domains() (allow, deny []string) {
	_, allow, _ = splitEntries("allowOut", p.AllowOut)
	_, deny, _ = splitEntries("denyOut", p.DenyOut)
	return allow, deny
}

// HasDomains reports whether the egress proxy has to judge the sandbox's
// HTTP and TLS connections by name.
func (p Policy) HasDomains() bool {
	a, d := p.Domains()
	return len(a)+len(d) > 0
}

// ErrDomainNotEnforced: a domain entry on a node that does not judge
// connections by name. Accepting it would let traffic the caller meant to
// block through (deny) or block what it meant to allow, so it is refused.
var ErrDomainNotEnforced = errdefs.NewReason(errdefs.ErrInvalidArgument, "network_domain_not_enforced", "a domain entry, and domain entries are not enforced yet (use IPs or CIDRs)")

// DomainEnforcer is the optional ability of a Manager (or a node over one)
// to enforce domain entries: it runs an egress proxy that judges them.
type DomainEnforcer interface {
	EnforcesDomains() bool
}

// CheckEnforced refuses the first domain entry of a valid policy, naming
// it, until the node's egress proxy enforces them: nothing fails open.
func CheckEnforced(p Policy) error {
	for _, l := range []struct {
		field string
		list  []string
	}{{"allowOut", p.AllowOut}, {"denyOut", p.DenyOut}} {
		for i, s := range l.list {
			if _, err := ParsePrefix(s); err != nil {
				return &PolicyError{Field: l.field, Index: i, Entry: s, Err: ErrDomainNotEnforced}
			}
		}
	}
	if len(p.Rules) > 0 {
		return &FieldError{Field: "rules", Kind: ErrRules, Err: errors.New("this node runs no egress proxy to apply them")}
	}
	if p.Upstream != nil {
		return &FieldError{Field: "egressProxy", Kind: ErrUpstream, Err: errors.New("this node runs no egress proxy to tunnel through")}
	}
	return nil
}
