package api

import (
	"strings"
	"testing"
)

func TestNetworkPortAndMaskOptions(t *testing.T) {
	body := func(network string) string {
		return `{"templateID":"base","network":` + network + `}`
	}
	cases := []struct {
		network, wantErr string
		ports            []int
		mask             string
	}{
		{network: `{"httpsPorts":[3000,8443],"maskRequestHost":"localhost:${PORT}"}`, ports: []int{3000, 8443}, mask: "localhost:${PORT}"},
		{network: `{"maskRequestHost":"app.internal"}`, mask: "app.internal"},
		{network: `{"httpsPorts":[49983]}`, wantErr: "network.httpsPorts[0]: 49983 is envd's port"},
		{network: `{"httpsPorts":[0]}`, wantErr: "network.httpsPorts[0]: 0 is not a port"},
		{network: `{"httpsPorts":[443,443]}`, wantErr: "network.httpsPorts[1]: 443 is listed twice"},
		{network: `{"httpsPorts":[` + strings.Repeat("1,", 64) + `2]}`, wantErr: "network.httpsPorts: at most 64"},
		{network: `{"maskRequestHost":"a b"}`, wantErr: "network.maskRequestHost"},
		{network: `{"maskRequestHost":"host:99999"}`, wantErr: "network.maskRequestHost"},
		{network: `{"maskRequestHost":":${PORT}"}`, wantErr: "network.maskRequestHost"},
		{network: `{"maskRequestHost":"` + strings.Repeat("a", 300) + `"}`, wantErr: "network.maskRequestHost: longer"},
	}
	for _, c := range cases {
		var req newSandbox
		if msg := decodeJSON([]byte(body(c.network)), &req, false); msg != "" {
			t.Fatalf("%s: decode: %s", c.network, msg)
		}
		opts, msg := req.options(true)
		if c.wantErr != "" {
			if !strings.Contains(msg, c.wantErr) {
				t.Errorf("%s: got %q, want an error containing %q", c.network, msg, c.wantErr)
			}
			continue
		}
		if msg != "" {
			t.Errorf("%s: refused: %s", c.network, msg)
			continue
		}
		if got := opts.Network.HTTPSPorts; len(got) != len(c.ports) || (len(got) > 0 && got[0] != c.ports[0]) {
			t.Errorf("%s: httpsPorts %v, want %v", c.network, got, c.ports)
		}
		if opts.Network.MaskRequestHost != c.mask {
			t.Errorf("%s: mask %q, want %q", c.network, opts.Network.MaskRequestHost, c.mask)
		}
	}
}

func TestEgressOptionsParsedOrRefusedByName(t *testing.T) {
	for body, want := range map[string]string{
		`{"templateID":"base","network":{"egressProxy":{"address":"socks5://proxy.example:1080"}}}`:                  "network.egressProxy.address",
		`{"templateID":"base","network":{"egressProxy":{"address":""}}}`:                                             "network.egressProxy.address",
		`{"templateID":"base","network":{"egressProxy":{"address":"p:1","auth":"x"}}}`:                               "network.egressProxy: unknown field",
		`{"templateID":"base","network":{"egressProxy":{"address":"p:1","tls":{"enabled":false,"serverName":"p"}}}}`: "network.egressProxy.tls",
		`{"templateID":"base","network":{"rules":[]}}`:                                                               "network.rules",
		`{"templateID":"base","network":{"rules":{"a.com":[{"transform":{"body":"x"}}]}}}`:                           "network.rules: unknown field",
		`{"templateID":"base","iam":{"tokens":{"aws":{"audience":"sts","tokenType":"JWT-SVID"}}}}`:                   "iam.tokens",
	} {
		var req newSandbox
		if msg := decodeJSON([]byte(body), &req, false); msg != "" {
			t.Fatalf("%s: decode: %s", body, msg)
		}
		if _, msg := req.options(true); !strings.HasPrefix(msg, want) {
			t.Errorf("%s: got %q, want a 400 naming %s", body, msg, want)
		}
	}
	// Absent, null or empty ones are fine, and mcp is the SDK's business.
	for _, body := range []string{
		`{"templateID":"base","network":{"egressProxy":null,"rules":{}},"iam":{"tokens":{}},"mcp":{"x":{}}}`,
		`{"templateID":"base","iam":null,"mcp":null}`,
	} {
		var req newSandbox
		if msg := decodeJSON([]byte(body), &req, false); msg != "" {
			t.Fatalf("%s: decode: %s", body, msg)
		}
		if _, msg := req.options(true); msg != "" {
			t.Errorf("%s: refused: %s", body, msg)
		}
	}
	// Parsed into the stored form; GET never shows the password or CA.
	var req newSandbox
	body := `{"templateID":"base","network":{"egressProxy":{"address":"p.example:1080","username":"u","password":"pw","tls":{"enabled":true,"serverName":"s.example","caCert":"PEM"}},` +
		`"rules":{"API.example.com":[{"transform":{"headers":{"X-Key":"${e2b.secrets.k}"}}}]}}}`
	if msg := decodeJSON([]byte(body), &req, false); msg != "" {
		t.Fatal(msg)
	}
	opts, msg := req.options(true)
	if msg != "" {
		t.Fatal(msg)
	}
	ep := opts.Network.EgressProxy
	if ep == nil || ep.Address != "p.example:1080" || ep.Password != "pw" || !ep.TLS || ep.TLSServerName != "s.example" || ep.TLSCACert != "PEM" {
		t.Fatalf("egressProxy %+v", ep)
	}
	if r := opts.Network.Rules["API.example.com"]; len(r) != 1 || r[0].Headers["X-Key"] != "${e2b.secrets.k}" {
		t.Fatalf("rules %+v", opts.Network.Rules)
	}
	epOut, rulesOut := egressOut(opts.Network)
	if strings.Contains(string(epOut), "pw") || strings.Contains(string(epOut), "PEM") || !strings.Contains(string(epOut), `"serverName":"s.example"`) {
		t.Errorf("shown egressProxy %s", epOut)
	}
	if !strings.Contains(string(rulesOut), `"transform":{"headers":{"X-Key":"${e2b.secrets.k}"}}`) {
		t.Errorf("shown rules %s", rulesOut)
	}
}
