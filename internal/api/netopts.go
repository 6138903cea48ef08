package api

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"strconv"
	"strings"

	"github.com/cubicle-dev/cubicle/internal/node"
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
func createOnlyNetwork(maskRequestHost, httpsPorts json.RawMessage) string {
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

// unsupportedEgress refuses the egress options Cubicle does not apply yet,
// by name: accepting them would send the sandbox's traffic out directly
// when the caller asked for a proxy or for rewritten requests (fail-open).
func unsupportedEgress(egressProxy, rules json.RawMessage) string {
	if !absent(egressProxy) {
		return "network.egressProxy: tunnelling egress through a SOCKS5 proxy is not supported by this server; omit it"
	}
	if !absent(rules) {
		var m map[string]json.RawMessage
		if err := json.Unmarshal(rules, &m); err != nil {
			return "network.rules: want an object of domain to rule list"
		}
		if len(m) > 0 {
			return "network.rules: per-domain transform rules are not supported by this server; omit them"
		}
	}
	return ""
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
