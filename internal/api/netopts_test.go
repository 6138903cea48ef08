package api

import (
	"slices"
	"strings"
	"testing"

	"github.com/cubicle-dev/cubicle/internal/store"
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
		`{"templateID":"base","network":{"rules":[]}}`, // CubeSandbox's list form, empty
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

// CubeSandbox's rule list: allow rules allow their host and inject their
// headers (format with ${SECRET} filled), deny rules deny it, and what the
// engine cannot do is refused by name.
func TestCubeSandboxRuleList(t *testing.T) {
	options := func(network string) (store.Network, string) {
		var req newSandbox
		if msg := decodeJSON([]byte(`{"templateID":"base","network":`+network+`}`), &req, false); msg != "" {
			t.Fatalf("%s: decode: %s", network, msg)
		}
		opts, msg := req.options(true)
		return opts.Network, msg
	}
	n, msg := options(`{"allowOut":["a.example"],"denyOut":["0.0.0.0/0"],"rules":[
		{"name":"key","match":{"host":"API.example.com"},"action":{"allow":true,"inject":[{"header":"Authorization","secret":"s3","format":"Bearer ${SECRET}"},{"header":"X-Raw","secret":"${e2b.secrets.k}"}]}},
		{"name":"more","match":{"host":"api.example.com","scheme":"https","port":443},"action":{"allow":true,"inject":[{"header":"X-Two","secret":"2"}]}},
		{"name":"plain","match":{"host":"api.example.com","scheme":"http","port":80},"action":{"allow":true,"inject":[{"header":"X-Three","secret":"3"}]}},
		{"name":"open","match":{"host":"*.open.example"},"action":{"allow":true}},
		{"name":"block","match":{"host":"bad.example"},"action":{"allow":false}}]}`)
	if msg != "" {
		t.Fatal(msg)
	}
	// No scheme: CubeSandbox's default set, HTTPS and plain HTTP; a scheme
	// picks one.
	r := n.Rules["api.example.com"]
	if len(r) != 4 || len(n.Rules) != 1 ||
		r[0].Plain || r[0].Headers["Authorization"] != "Bearer s3" || r[0].Headers["X-Raw"] != "${e2b.secrets.k}" ||
		!r[1].Plain || r[1].Headers["Authorization"] != "Bearer s3" ||
		r[2].Plain || r[2].Headers["X-Two"] != "2" ||
		!r[3].Plain || r[3].Headers["X-Three"] != "3" {
		t.Fatalf("rules %+v", n.Rules)
	}
	if _, shown := egressOut(n); !strings.Contains(string(shown), `{"transform":{"headers":{"X-Three":"3"}},"plain":true}`) {
		t.Fatalf("shown rules %s", shown)
	}
	if !slices.Equal(n.AllowOut, []string{"a.example", "api.example.com", "*.open.example"}) || !slices.Equal(n.DenyOut, []string{"0.0.0.0/0", "bad.example"}) {
		t.Fatalf("allowOut %v denyOut %v", n.AllowOut, n.DenyOut)
	}

	for rules, want := range map[string]string{
		`[{"match":{"host":"10.0.0.0/24","scheme":"http"},"action":{"allow":true}}]`:                                                  "subnet CIDR not supported for L7 rules",
		`[{"match":{"host":"a.example","port":1234},"action":{"allow":true}}]`:                                                        "match.port requires match.scheme",
		`[{"match":{"host":"198.51.100.7"},"action":{"allow":true}}]`:                                                                 "an IP address needs scheme http",
		`[{"match":{"host":"198.51.100.7","scheme":"https","port":8443},"action":{"allow":true}}]`:                                    "an IP address needs scheme http",
		`[{"match":{"host":"a.example","scheme":"http","port":0},"action":{"allow":true}}]`:                                           "match.port 0: must be in [1, 65535]",
		`[{"match":{"host":"a.example","scheme":"ftp"},"action":{"allow":true}}]`:                                                     "must be http or https",
		`[{"match":{"host":"a.example","path":"/v1"},"action":{"allow":true}}]`:                                                       "match.path: not supported",
		`[{"match":{"host":"a.example","sni":"a.example"},"action":{"allow":true}}]`:                                                  "match.sni: not supported",
		`[{"match":{"host":"a.example","method":["GET"]},"action":{"allow":true}}]`:                                                   "match.method: not supported",
		`[{"match":{"host":"a.example"},"action":{"allow":true,"audit":"full"}}]`:                                                     "action.audit: not supported",
		`[{"match":{"host":"a.example"},"action":{}}]`:                                                                                "action.allow: required",
		`[{"match":{},"action":{"allow":true}}]`:                                                                                      "match.host: required",
		`[{"action":{"allow":true}}]`:                                                                                                 "match.host: required",
		`[{"match":{"host":"a.example"},"action":{"allow":false,"inject":[{"header":"X","secret":"s"}]}}]`:                            "inject: only valid with allow: true",
		`[{"match":{"host":"a.example"},"action":{"allow":true,"inject":[{"header":"X"}]}}]`:                                          "header and secret are required",
		`[{"match":{"host":"a.example"},"action":{"allow":true,"inject":[{"header":"X","secret":"1"},{"header":"x","secret":"2"}]}}]`: "is set twice",
		`[{"match":{"host":"a.example"},"action":{"allow":true}},{"match":{"host":"A.example"},"action":{"allow":false}}]`:            "is allowed by an earlier rule",
		`[{"match":{"host":"a.example"},"action":{"allow":true},"extra":1}]`:                                                          "unknown field",
		`[{"name":"bad","match":{"host":"a.example/x"},"action":{"allow":true}}]`:                                                     `network.rules[0] ("bad").match.host`,
	} {
		if _, msg := options(`{"rules":` + rules + `}`); !strings.Contains(msg, want) {
			t.Errorf("%s: got %q, want a 400 containing %q", rules, msg, want)
		}
	}

	// Custom ports (CubeSandbox's custom L7 ports): the rule applies on
	// that port only, for its scheme; an IP host for plain HTTP. A
	// scheme's own port is port 0.
	n, msg = options(`{"rules":[
		{"match":{"host":"198.51.100.7","scheme":"http","port":18080},"action":{"allow":true,"inject":[{"header":"X-M","secret":"m"}]}},
		{"match":{"host":"api.example.com","scheme":"https","port":8443},"action":{"allow":true,"inject":[{"header":"X-T","secret":"t"}]}},
		{"match":{"host":"api.example.com","scheme":"http","port":80},"action":{"allow":true,"inject":[{"header":"X-P","secret":"p"}]}}]}`)
	if msg != "" {
		t.Fatal(msg)
	}
	if r := n.Rules["198.51.100.7"]; len(r) != 1 || !r[0].Plain || r[0].Port != 18080 || r[0].Headers["X-M"] != "m" {
		t.Fatalf("IP rule %+v", n.Rules)
	}
	if r := n.Rules["api.example.com"]; len(r) != 2 || r[0].Plain || r[0].Port != 8443 || !r[1].Plain || r[1].Port != 0 {
		t.Fatalf("port rules %+v", n.Rules)
	}
	if _, shown := egressOut(n); !strings.Contains(string(shown), `{"transform":{"headers":{"X-M":"m"}},"plain":true,"port":18080}`) {
		t.Fatalf("shown rules %s", shown)
	}

	// The same on PUT /network (CubeSandbox's update_network sends the list).
	var up networkUpdate
	if msg := decodeJSON([]byte(`{"rules":[{"match":{"host":"b.example"},"action":{"allow":true,"inject":[{"header":"X","secret":"v"}]}}],"denyOut":["0.0.0.0/0"]}`), &up, false); msg != "" {
		t.Fatal(msg)
	}
	un, msg := up.network()
	if msg != "" || un.Rules["b.example"][0].Headers["X"] != "v" || !slices.Equal(un.AllowOut, []string{"b.example"}) {
		t.Fatalf("update: %+v %s", un, msg)
	}
}
