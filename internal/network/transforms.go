package network

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/textproto"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"

	"golang.org/x/net/http/httpguts"

	"github.com/cubicle-dev/cubicle/internal/errdefs"
)

// Request transforms (e2b's network.rules) and the SOCKS5 upstream (e2b's
// network.egressProxy) are part of a sandbox's egress policy: the node's
// egress proxy applies both, and the manager redirects the sandbox's TCP to
// it when either is set.

// Limits on what one policy may make the egress proxy do per request.
const (
	MaxRuleHosts     = 100
	MaxRulesPerHost  = 16
	MaxRuleHeaders   = 32
	maxHeaderValue   = 8 << 10
	maxUpstreamCreds = 255 // RFC 1929
	maxUpstreamCA    = 64 << 10
)

// Rule is one transform applied to the HTTPS requests of a matching host:
// each header is set, replacing any the sandbox sent. Values may hold
// ${e2b.secrets.<name>} placeholders, which the proxy fills per request
// from the sandbox team's secrets; nothing else in a request is expanded.
type Rule struct {
	Headers map[string]string `json:"headers,omitempty"`
	// Plain: the rule applies to the host's plain HTTP requests (port 80)
	// and not to its HTTPS ones. The caller asked for it by name
	// (CubeSandbox's scheme "http"), knowing the values cross the network
	// in the clear; rules are HTTPS-only otherwise.
	Plain bool `json:"plain,omitempty"`
	// Port is the TCP port the rule applies on; 0 is its scheme's own
	// (443, or 80 when Plain). Connections to another port of the host are
	// not the rule's. A port other than 80 and 443 makes the node redirect
	// the sandbox's connections to it to the egress proxy as well
	// (CubeSandbox's custom L7 ports).
	Port uint16 `json:"port,omitempty"`
}

// MaxRulePorts bounds the ports beyond 80 and 443 one policy's rules may
// name: each is a redirect the node keeps for the sandbox.
const MaxRulePorts = 16

// OnPort is the port r applies on.
func (r Rule) OnPort() uint16 {
	switch {
	case r.Port != 0:
		return r.Port
	case r.Plain:
		return 80
	}
	return 443
}

// ForPort is the rules of list for plain HTTP (plain) or HTTPS on port,
// in order.
func ForPort(list []Rule, plain bool, port uint16) []Rule {
	var out []Rule
	for _, r := range list {
		if r.Plain == plain && r.OnPort() == port {
			out = append(out, r)
		}
	}
	return out
}

// RulePorts is the ports other than 80 and 443 that p's rules apply on,
// sorted: the node redirects them to the egress proxy too.
func (p Policy) RulePorts() []uint16 {
	var out []uint16
	for _, list := range p.Rules {
		for _, r := range list {
			if port := r.OnPort(); port != 80 && port != 443 && !slices.Contains(out, port) {
				out = append(out, port)
			}
		}
	}
	slices.Sort(out)
	return out
}

// Intercepts reports whether the egress proxy reads the sandbox's
// connections to port: 80 and 443 always (when it needs the proxy at all),
// others when a rule names them.
func (p Policy) Intercepts(port uint16) bool {
	return port == 80 || port == 443 || slices.Contains(p.RulePorts(), port)
}

// InterceptsTLS reports whether p has a rule for HTTPS, the only kind the
// egress proxy decrypts for (and so the only kind that needs the sandbox to
// trust the interception CA).
func (p Policy) InterceptsTLS() bool {
	for _, list := range p.Rules {
		if len(ForScheme(list, false)) > 0 {
			return true
		}
	}
	return false
}

// ForScheme is the rules of list that apply to plain HTTP (plain) or to
// HTTPS, in order.
func ForScheme(list []Rule, plain bool) []Rule {
	var out []Rule
	for _, r := range list {
		if r.Plain == plain {
			out = append(out, r)
		}
	}
	return out
}

// Upstream is a SOCKS5 proxy that all of a sandbox's TCP egress is
// tunnelled through, after the allow/deny rules. When it cannot be reached
// connections fail: nothing falls back to a direct connection.
type Upstream struct {
	Address  string       `json:"address"` // host:port
	Username string       `json:"username,omitempty"`
	Password string       `json:"password,omitempty"`
	TLS      *UpstreamTLS `json:"tls,omitempty"` // nil: plain TCP to the proxy
}

// UpstreamTLS wraps the hop to the proxy in TLS.
type UpstreamTLS struct {
	ServerName string `json:"serverName,omitempty"` // default: the address's host
	CACert     string `json:"caCert,omitempty"`     // PEM; default: the host's trust store
}

var (
	// ErrRules: network.rules is malformed.
	ErrRules = errdefs.NewReason(errdefs.ErrInvalidArgument, "network_invalid_rules", "invalid network rules")
	// ErrUpstream: network.egressProxy is malformed or not reachable as
	// an allowed address.
	ErrUpstream = errdefs.NewReason(errdefs.ErrInvalidArgument, "network_invalid_egress_proxy", "invalid egress proxy")
)

// FieldError names the option that was refused (e.g. "rules[\"a.com\"][0]
// .transform.headers.X-Key"); it wraps ErrRules or ErrUpstream and the
// reason.
type FieldError struct {
	Field string
	Kind  error
	Err   error
}

func (e *FieldError) Error() string { return fmt.Sprintf("%s: %v", e.Field, e.Err) }
func (e *FieldError) Unwrap() []error {
	return []error{ErrInvalidPolicy, e.Kind, e.Err}
}

// placeholder matches ${...} in a rule value.
var placeholder = regexp.MustCompile(`\$\{([^{}]*)\}`)

// SecretPlaceholderPrefix starts the placeholder Secret.fill() makes.
const SecretPlaceholderPrefix = "e2b.secrets."

// reservedHeaders would change how the request is framed or routed, not
// what it says: a transform may not set them.
var reservedHeaders = map[string]bool{
	"Host": true, "Content-Length": true, "Transfer-Encoding": true, "Connection": true,
	"Upgrade": true, "Te": true, "Trailer": true, "Keep-Alive": true, "Proxy-Connection": true, "Expect": true,
	// Hop-by-hop: dropped on the way out, so a rule setting them would do nothing.
	"Proxy-Authorization": true, "Proxy-Authenticate": true,
}

// RuleKey normalises a rules key: a domain or *.domain, lower-cased, or
// an IP address.
func RuleKey(h string) (key string, isIP bool, err error) {
	if ip, perr := netip.ParseAddr(strings.TrimSpace(h)); perr == nil {
		return ip.String(), true, nil
	}
	d, err := ParseDomain(h)
	return d, false, err
}

// NormalizeRules validates rules and returns them with lower-cased host
// keys (as e2b normalises them on write).
func NormalizeRules(rules map[string][]Rule) (map[string][]Rule, error) {
	if len(rules) == 0 {
		return nil, nil
	}
	if len(rules) > MaxRuleHosts {
		return nil, &FieldError{Field: "rules", Kind: ErrRules, Err: fmt.Errorf("at most %d hosts, got %d", MaxRuleHosts, len(rules))}
	}
	hosts := make([]string, 0, len(rules))
	for h := range rules {
		hosts = append(hosts, h)
	}
	sort.Strings(hosts) // report the same first error every time
	out := make(map[string][]Rule, len(rules))
	for _, h := range hosts {
		list := rules[h]
		field := fmt.Sprintf("rules[%q]", h)
		d, isIP, err := RuleKey(h)
		if isIP {
			// An address matches the Host header of plain HTTP; HTTPS
			// rules match the TLS server name, which an address is not.
			for i, r := range list {
				if !r.Plain {
					return nil, &FieldError{Field: fmt.Sprintf("%s[%d]", field, i), Kind: ErrRules, Err: errors.New("an IP address key applies to plain HTTP only (HTTPS rules match the TLS server name, a domain)")}
				}
			}
		}
		if err != nil {
			return nil, &FieldError{Field: field, Kind: ErrRules, Err: fmt.Errorf("the key must be a domain name, *.domain or (for plain HTTP) an IP address: %w", err)}
		}
		if _, dup := out[d]; dup {
			return nil, &FieldError{Field: field, Kind: ErrRules, Err: errors.New("the same host is listed twice (keys are case-insensitive)")}
		}
		if len(list) > MaxRulesPerHost {
			return nil, &FieldError{Field: field, Kind: ErrRules, Err: fmt.Errorf("at most %d rules per host, got %d", MaxRulesPerHost, len(list))}
		}
		for i, r := range list {
			if len(r.Headers) > MaxRuleHeaders {
				return nil, &FieldError{Field: fmt.Sprintf("%s[%d].transform.headers", field, i), Kind: ErrRules, Err: fmt.Errorf("at most %d headers, got %d", MaxRuleHeaders, len(r.Headers))}
			}
			seen := map[string]bool{}
			for k, v := range r.Headers {
				hf := fmt.Sprintf("%s[%d].transform.headers[%q]", field, i, k)
				if err := checkHeader(k, v); err != nil {
					return nil, &FieldError{Field: hf, Kind: ErrRules, Err: err}
				}
				ck := textproto.CanonicalMIMEHeaderKey(k)
				if seen[ck] {
					return nil, &FieldError{Field: hf, Kind: ErrRules, Err: errors.New("the same header is set twice (names are case-insensitive)")}
				}
				seen[ck] = true
			}
		}
		out[d] = list
	}
	if n := len(Policy{Rules: out}.RulePorts()); n > MaxRulePorts {
		return nil, &FieldError{Field: "rules", Kind: ErrRules, Err: fmt.Errorf("at most %d ports other than 80 and 443, got %d", MaxRulePorts, n)}
	}
	return out, nil
}

func checkHeader(k, v string) error {
	switch {
	case !httpguts.ValidHeaderFieldName(k):
		return errors.New("not a valid header name")
	case reservedHeaders[textproto.CanonicalMIMEHeaderKey(k)]:
		return errors.New("this header frames or routes the request and cannot be set by a transform")
	case len(v) > maxHeaderValue:
		return fmt.Errorf("value longer than %d bytes", maxHeaderValue)
	case !httpguts.ValidHeaderFieldValue(v):
		return errors.New("the value holds characters a header cannot carry (CR, LF, NUL)")
	}
	for _, m := range placeholder.FindAllStringSubmatch(v, -1) {
		name, ok := strings.CutPrefix(m[1], SecretPlaceholderPrefix)
		switch {
		case strings.HasPrefix(m[1], "e2b.identity."):
			return fmt.Errorf("%s: workload identity tokens are not supported by this server", m[0])
		case !ok:
			if strings.HasPrefix(m[1], "e2b.") {
				return fmt.Errorf("%s is not a placeholder this server knows (use ${e2b.secrets.<name>})", m[0])
			}
		case name == "":
			return fmt.Errorf("%s names no secret", m[0])
		}
	}
	return nil
}

// SecretNames lists the secrets a rule value refers to, in order.
func SecretNames(v string) []string {
	var out []string
	for _, m := range placeholder.FindAllStringSubmatch(v, -1) {
		if name, ok := strings.CutPrefix(m[1], SecretPlaceholderPrefix); ok && name != "" {
			out = append(out, name)
		}
	}
	return out
}

// ExpandSecrets replaces each ${e2b.secrets.<name>} in v by lookup(name).
// Other ${...} text is left as it is.
func ExpandSecrets(v string, lookup func(name string) (string, error)) (string, error) {
	var err error
	out := placeholder.ReplaceAllStringFunc(v, func(m string) string {
		name, ok := strings.CutPrefix(m[2:len(m)-1], SecretPlaceholderPrefix)
		if !ok || name == "" || err != nil {
			return m
		}
		val, lerr := lookup(name)
		if lerr != nil {
			err = lerr
			return ""
		}
		return val
	})
	if err != nil {
		return "", err
	}
	return out, nil
}

// RulesFor returns the rules of the most specific matching key: the exact
// host first, then the longest matching wildcard. Rule sets are not merged.
func RulesFor(rules map[string][]Rule, host string) ([]Rule, bool) {
	host = strings.TrimSuffix(strings.ToLower(host), ".")
	if r, ok := rules[host]; ok {
		return r, true
	}
	best := ""
	for k := range rules {
		if strings.HasPrefix(k, "*.") && MatchDomain(k, host) && len(k) > len(best) {
			best = k
		}
	}
	if best == "" {
		return nil, false
	}
	return rules[best], true
}

// ValidateUpstream checks an egress proxy's shape (not where it points;
// see UpstreamResolver).
func ValidateUpstream(u *Upstream) error {
	if u == nil {
		return nil
	}
	bad := func(field string, err error) error {
		return &FieldError{Field: "egressProxy." + field, Kind: ErrUpstream, Err: err}
	}
	host, port, err := net.SplitHostPort(u.Address)
	if err != nil {
		return bad("address", fmt.Errorf("%q is not host:port", u.Address))
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return bad("address", fmt.Errorf("%q has an invalid port", u.Address))
	}
	if _, err := netip.ParseAddr(host); err != nil {
		if d, err := ParseDomain(host); err != nil || strings.HasPrefix(d, "*.") {
			return bad("address", fmt.Errorf("%q: the host is neither an IP address nor a DNS name", u.Address))
		}
	}
	switch {
	case len(u.Username) > maxUpstreamCreds:
		return bad("username", fmt.Errorf("longer than %d bytes", maxUpstreamCreds))
	case len(u.Password) > maxUpstreamCreds:
		return bad("password", fmt.Errorf("longer than %d bytes", maxUpstreamCreds))
	case u.Password != "" && u.Username == "":
		return bad("password", errors.New("only valid together with username"))
	}
	if u.TLS != nil {
		if u.TLS.ServerName != "" {
			if _, err := ParseDomain(u.TLS.ServerName); err != nil || strings.HasPrefix(u.TLS.ServerName, "*") {
				return bad("tls.serverName", fmt.Errorf("%q is not a DNS name", u.TLS.ServerName))
			}
		}
		if u.TLS.CACert != "" {
			if len(u.TLS.CACert) > maxUpstreamCA {
				return bad("tls.caCert", fmt.Errorf("longer than %d bytes", maxUpstreamCA))
			}
			if !x509.NewCertPool().AppendCertsFromPEM([]byte(u.TLS.CACert)) {
				return bad("tls.caCert", errors.New("no PEM certificate in it"))
			}
		}
	}
	return nil
}

// UpstreamResolver is the optional ability of a Manager (or a node over
// one) to judge where an egress proxy address points (see
// Linux.ResolveUpstream); errors are a *FieldError wrapping ErrUpstream.
type UpstreamResolver interface {
	ResolveUpstream(ctx context.Context, address string) ([]netip.AddrPort, error)
}

// NeedsProxy reports whether the egress proxy must see the sandbox's HTTP
// and TLS connections (ports 80 and 443).
func (p Policy) NeedsProxy() bool { return p.HasDomains() || len(p.Rules) > 0 || p.Upstream != nil }

// Tunnels reports whether all of the sandbox's TCP goes to the egress proxy.
func (p Policy) Tunnels() bool { return p.Upstream != nil }
