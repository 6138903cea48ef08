package api

import (
	"encoding/json"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"

	"github.com/cubicle-dev/cubicle/internal/store"
)

// CubeSandbox's network.rules is a list of L7 rules, where e2b's is a map of
// host to transforms; its SDK sends every rule set in the list form (it
// converts e2b's map itself). Both are taken. A list rule is
//
//	{name?, match: {host, scheme?, port?, sni?, method?, path?},
//	 action: {allow, inject?: [{header, secret, format?}], audit?}}
//
// and maps onto the same engine (docs/network.md, "CubeSandbox's rule
// list"): allow: true puts the host in allowOut (in CubeSandbox an L7 rule
// allows its host) and its injects become the host's transform headers,
// each format with ${SECRET} replaced by the secret, on HTTPS (443), plain
// HTTP (80, network.Rule.Plain) or both when no scheme is given, as
// CubeSandbox's default set; with a port, on that port only, for the
// scheme the rule names (network.Rule.Port: the node redirects it to the
// egress proxy too). The host is a domain, *.domain or, for plain HTTP, an
// IP address (an HTTPS rule matches the TLS name). allow: false puts the
// host in denyOut. What the engine cannot do is refused by name rather
// than dropped: matching by sni, method or path, audit levels, subnets.

type ruleListJSON struct {
	Name   string          `json:"name"`
	Match  *ruleMatchJSON  `json:"match"`
	Action *ruleActionJSON `json:"action"`
}

type ruleMatchJSON struct {
	Host   string          `json:"host"`
	Scheme *string         `json:"scheme"`
	Port   *int            `json:"port"`
	SNI    json.RawMessage `json:"sni"`
	Method json.RawMessage `json:"method"`
	Path   json.RawMessage `json:"path"`
}

type ruleActionJSON struct {
	Allow  *bool            `json:"allow"`
	Inject []ruleInjectJSON `json:"inject"`
	Audit  json.RawMessage  `json:"audit"`
}

type ruleInjectJSON struct {
	Header string  `json:"header"`
	Secret *string `json:"secret"`
	Format *string `json:"format"`
}

// isRuleList reports whether raw is a JSON array (CubeSandbox's form).
func isRuleList(raw json.RawMessage) bool {
	s := strings.TrimLeft(string(raw), " \t\r\n")
	return strings.HasPrefix(s, "[")
}

// parseRuleList turns CubeSandbox's rule list into transforms per host and
// the hosts its rules allow and deny, or the message of the 400 that refuses
// it.
func parseRuleList(raw json.RawMessage) (map[string][]store.NetworkRule, []string, []string, string) {
	var in []ruleListJSON
	if msg := strictJSON("network.rules", raw, &in); msg != "" {
		return nil, nil, nil, msg
	}
	var (
		rules       map[string][]store.NetworkRule
		allow, deny []string
	)
	for i, r := range in {
		at := fmt.Sprintf("network.rules[%d]", i)
		if r.Name != "" {
			at += fmt.Sprintf(" (%q)", r.Name)
		}
		m, a := r.Match, r.Action
		if m == nil || strings.TrimSpace(m.Host) == "" {
			return nil, nil, nil, at + ".match.host: required (a domain name, or *.domain for its subdomains)"
		}
		for _, f := range []struct {
			name string
			v    json.RawMessage
		}{{"sni", m.SNI}, {"method", m.Method}, {"path", m.Path}} {
			if !absent(f.v) {
				return nil, nil, nil, at + ".match." + f.name + ": not supported by this server (rules match by host)"
			}
		}
		host := strings.ToLower(strings.TrimSuffix(strings.TrimSpace(m.Host), "."))
		if strings.Contains(host, "/") {
			return nil, nil, nil, fmt.Sprintf("%s.match.host %q: subnet CIDR not supported for L7 rules, use a single host or a domain name", at, m.Host)
		}
		_, ipErr := netip.ParseAddr(host)
		isIP := ipErr == nil
		if m.Port != nil && m.Scheme == nil {
			return nil, nil, nil, at + ".match.port requires match.scheme (http or https)"
		}
		// Which of CubeSandbox's default set the rule's injects apply to:
		// HTTPS on 443 and plain HTTP on 80, both when no scheme is given.
		https, plain := true, true
		if m.Scheme != nil {
			switch s := strings.ToLower(strings.TrimSpace(*m.Scheme)); s {
			case "http":
				https = false
			case "https":
				plain = false
			default:
				return nil, nil, nil, fmt.Sprintf("%s.match.scheme %q: must be http or https", at, *m.Scheme)
			}
		}
		if isIP && https {
			return nil, nil, nil, fmt.Sprintf("%s.match.host %q: an IP address needs scheme http (HTTPS rules match the TLS server name, a domain)", at, m.Host)
		}
		port := 0
		if m.Port != nil {
			if *m.Port < 1 || *m.Port > 65535 {
				return nil, nil, nil, fmt.Sprintf("%s.match.port %d: must be in [1, 65535]", at, *m.Port)
			}
			if (https && *m.Port != 443) || (plain && *m.Port != 80) {
				port = *m.Port // the scheme's own port is port 0
			}
		}
		if a == nil || a.Allow == nil {
			return nil, nil, nil, at + ".action.allow: required (true or false)"
		}
		if !absent(a.Audit) {
			return nil, nil, nil, at + ".action.audit: not supported by this server"
		}
		if !*a.Allow {
			if len(a.Inject) > 0 {
				return nil, nil, nil, at + ".action.inject: only valid with allow: true"
			}
			if slices.Contains(allow, host) {
				return nil, nil, nil, fmt.Sprintf("%s: host %q is allowed by an earlier rule", at, m.Host)
			}
			if !slices.Contains(deny, host) {
				deny = append(deny, host)
			}
			continue
		}
		if slices.Contains(deny, host) {
			return nil, nil, nil, fmt.Sprintf("%s: host %q is denied by an earlier rule", at, m.Host)
		}
		if !slices.Contains(allow, host) {
			allow = append(allow, host)
		}
		if len(a.Inject) == 0 {
			continue
		}
		headers := map[string]string{}
		for j, inj := range a.Inject {
			if inj.Header == "" || inj.Secret == nil {
				return nil, nil, nil, fmt.Sprintf("%s.action.inject[%d]: header and secret are required", at, j)
			}
			v := *inj.Secret
			if inj.Format != nil {
				v = strings.ReplaceAll(*inj.Format, "${SECRET}", *inj.Secret)
			}
			for k := range headers {
				if strings.EqualFold(k, inj.Header) {
					return nil, nil, nil, fmt.Sprintf("%s.action.inject[%d]: header %q is set twice (names are case-insensitive)", at, j, inj.Header)
				}
			}
			headers[inj.Header] = v
		}
		if rules == nil {
			rules = map[string][]store.NetworkRule{}
		}
		if https {
			rules[host] = append(rules[host], store.NetworkRule{Headers: headers, Port: port})
		}
		if plain {
			rules[host] = append(rules[host], store.NetworkRule{Headers: maps.Clone(headers), Plain: true, Port: port})
		}
	}
	return rules, allow, deny, ""
}
