package api

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"github.com/cubicle-dev/cubicle/internal/node"
	"github.com/cubicle-dev/cubicle/internal/store"
)

// Limits on the data-plane network options. They bound what one create
// body can make the proxy carry per request.
const (
	maxHTTPSPorts      = 64
	maxMaskRequestHost = 253 + 6 // a DNS name and ":65535"
)

// checkHTTPSPorts validates network.httpsPorts: real ports, no duplicates,
// and never envd's, which the SDKs always reach over plain HTTP.
func checkHTTPSPorts(ports []int) string {
	if len(ports) > maxHTTPSPorts {
		return fmt.Sprintf("network.httpsPorts: at most %d ports, got %d", maxHTTPSPorts, len(ports))
	}
	seen := map[int]bool{}
	for i, p := range ports {
		switch {
		case p < 1 || p > 65535:
			return fmt.Sprintf("network.httpsPorts[%d]: %d is not a port (1-65535)", i, p)
		case p == node.AgentPort:
			return fmt.Sprintf("network.httpsPorts[%d]: %d is envd's port and cannot be listed", i, p)
		case seen[p]:
			return fmt.Sprintf("network.httpsPorts[%d]: %d is listed twice", i, p)
		}
		seen[p] = true
	}
	return ""
}

// checkMaskRequestHost validates network.maskRequestHost: once "${PORT}" is
// replaced it must be a host or host:port a Host header can carry.
func checkMaskRequestHost(mask string) string {
	if mask == "" {
		return ""
	}
	if len(mask) > maxMaskRequestHost {
		return fmt.Sprintf("network.maskRequestHost: longer than %d characters", maxMaskRequestHost)
	}
	h := strings.ReplaceAll(mask, "${PORT}", "65535")
	host := h
	if hh, port, err := net.SplitHostPort(h); err == nil {
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
			return fmt.Sprintf("network.maskRequestHost: %q has an invalid port (use a number or ${PORT})", mask)
		}
		host = hh
	}
	if host == "" {
		return fmt.Sprintf("network.maskRequestHost: %q has no host", mask)
	}
	for _, c := range host {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '.' || c == '_' || c == ':' || c == '[' || c == ']') {
			return fmt.Sprintf("network.maskRequestHost: %q is not a host[:port] (character %q)", mask, c)
		}
	}
	return ""
}

// createOnlyNetwork refuses maskRequestHost and httpsPorts in PUT
// /sandboxes/{id}/network: they are fixed at create (e2b's update body has
// neither), and the update keeps the stored ones, so a value sent here
// would otherwise be dropped while the call answered 204.
func createOnlyNetwork(maskRequestHost, httpsPorts, allowPublicTraffic json.RawMessage) string {
	if !absent(allowPublicTraffic) {
		return "network.allowPublicTraffic: set at create only; PUT /network does not change it"
	}
	if !absent(maskRequestHost) {
		return "network.maskRequestHost: set at create only; PUT /network does not change it"
	}
	if !absent(httpsPorts) {
		return "network.httpsPorts: set at create only; PUT /network does not change it"
	}
	return ""
}

// absent reports whether an optional JSON value was left out or null.
func absent(raw json.RawMessage) bool {
	t := bytes.TrimSpace(raw)
	return len(t) == 0 || bytes.Equal(t, []byte("null"))
}

// ruleJSON is one entry of e2b's network.rules lists.
type ruleJSON struct {
	Transform *struct {
		Headers map[string]string `json:"headers"`
	} `json:"transform"`
}

// egressProxyJSON is e2b's SandboxEgressProxyConfig. Password and caCert
// are write-only.
type egressProxyJSON struct {
	Address  string          `json:"address"`
	Username string          `json:"username,omitempty"`
	Password string          `json:"password,omitempty"`
	TLS      *egressProxyTLS `json:"tls,omitempty"`
}

type egressProxyTLS struct {
	Enabled    bool   `json:"enabled"`
	ServerName string `json:"serverName,omitempty"`
	CACert     string `json:"caCert,omitempty"`
}

// strictJSON decodes raw into v, refusing unknown fields by name: a
// transform or proxy option this server does not know would otherwise be
// dropped while the sandbox runs without it.
func strictJSON(field string, raw json.RawMessage, v any) string {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		if f, ok := unknownField(err); ok {
			return fmt.Sprintf("%s: unknown field %s (not supported by this server)", field, f)
		}
		return fmt.Sprintf("%s: malformed: %s", field, strings.TrimPrefix(err.Error(), "json: "))
	}
	return ""
}

// parseEgress turns network.egressProxy and network.rules into their
// stored form; the manager validates them further (network.ValidatePolicy).
//
// rules may be e2b's map or CubeSandbox's list (rulelist.go); the hosts a
// list's rules allow and deny come back in access, for allowOut and denyOut.
func parseEgress(egressProxy, rules json.RawMessage) (*store.EgressProxy, map[string][]store.NetworkRule, ruleAccess, string) {
	var ep *store.EgressProxy
	if !absent(egressProxy) {
		var in egressProxyJSON
		if msg := strictJSON("network.egressProxy", egressProxy, &in); msg != "" {
			return nil, nil, ruleAccess{}, msg
		}
		if in.Address == "" {
			return nil, nil, ruleAccess{}, "network.egressProxy.address: required (host:port of a SOCKS5 proxy)"
		}
		if u, err := url.Parse(in.Address); err == nil && u.Scheme != "" && u.Host != "" {
			return nil, nil, ruleAccess{}, fmt.Sprintf("network.egressProxy.address: %q: give host:port; the scheme is always SOCKS5 (%s:// is not supported)", in.Address, u.Scheme)
		}
		ep = &store.EgressProxy{Address: in.Address, Username: in.Username, Password: in.Password}
		if t := in.TLS; t != nil {
			if !t.Enabled && (t.ServerName != "" || t.CACert != "") {
				return nil, nil, ruleAccess{}, "network.egressProxy.tls: serverName and caCert are only valid with enabled: true"
			}
			ep.TLS, ep.TLSServerName, ep.TLSCACert = t.Enabled, t.ServerName, t.CACert
		}
	}
	var out map[string][]store.NetworkRule
	if !absent(rules) && isRuleList(rules) {
		var acc ruleAccess
		var msg string
		out, acc.Allow, acc.Deny, msg = parseRuleList(rules)
		if msg != "" {
			return nil, nil, ruleAccess{}, msg
		}
		return ep, out, acc, ""
	}
	if !absent(rules) {
		var in map[string][]ruleJSON
		if msg := strictJSON("network.rules", rules, &in); msg != "" {
			return nil, nil, ruleAccess{}, msg
		}
		for host, list := range in {
			rs := make([]store.NetworkRule, len(list))
			for i, r := range list {
				if r.Transform != nil {
					rs[i].Headers = r.Transform.Headers
				}
			}
			if out == nil {
				out = map[string][]store.NetworkRule{}
			}
			out[host] = rs
		}
	}
	return ep, out, ruleAccess{}, ""
}

// ruleAccess is what a CubeSandbox rule list allows and denies by host.
type ruleAccess struct{ Allow, Deny []string }

// apply adds the hosts to the policy's lists, after the caller's own entries.
func (a ruleAccess) apply(n *store.Network) {
	for _, h := range a.Allow {
		if !slices.Contains(n.AllowOut, h) {
			n.AllowOut = append(n.AllowOut, h)
		}
	}
	for _, h := range a.Deny {
		if !slices.Contains(n.DenyOut, h) {
			n.DenyOut = append(n.DenyOut, h)
		}
	}
}

// egressOut is what GET /sandboxes/{id} shows of the stored options:
// never the proxy's password or CA.
func egressOut(n store.Network) (json.RawMessage, json.RawMessage) {
	var ep, rules json.RawMessage
	if e := n.EgressProxy; e != nil {
		out := egressProxyJSON{Address: e.Address, Username: e.Username}
		if e.TLS {
			out.TLS = &egressProxyTLS{Enabled: true, ServerName: e.TLSServerName}
		}
		ep, _ = json.Marshal(out)
	}
	if len(n.Rules) > 0 {
		// e2b's shape; a rule for plain HTTP (CubeSandbox's scheme "http")
		// says so.
		type ruleOut struct {
			ruleJSON
			Plain bool `json:"plain,omitempty"`
			Port  int  `json:"port,omitempty"`
		}
		m := map[string][]ruleOut{}
		for host, list := range n.Rules {
			rs := make([]ruleOut, len(list))
			for i, r := range list {
				rs[i].Transform = &struct {
					Headers map[string]string `json:"headers"`
				}{Headers: r.Headers}
				rs[i].Plain, rs[i].Port = r.Plain, r.Port
			}
			m[host] = rs
		}
		rules, _ = json.Marshal(m)
	}
	return ep, rules
}

// unsupportedIAM refuses workload identity tokens: there is no identity
// provider to mint them, and a transform that references one would send
// its placeholder instead of a token.
func unsupportedIAM(raw json.RawMessage) string {
	if absent(raw) {
		return ""
	}
	var iam struct {
		Tokens map[string]json.RawMessage `json:"tokens"`
	}
	if err := json.Unmarshal(raw, &iam); err != nil {
		return "iam: want an object"
	}
	if len(iam.Tokens) > 0 {
		return "iam.tokens: workload identity tokens are not supported by this server; omit iam"
	}
	return ""
}
