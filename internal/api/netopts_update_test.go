package api

import (
	"strings"
	"testing"
)

// PUT /network keeps the create-time mask, httpsPorts and public-traffic
// switch; a body that sets them is refused by name rather than answered 204
// with the values dropped.
func TestNetworkUpdateRefusesCreateOnlyOptions(t *testing.T) {
	for _, c := range []struct{ body, wantErr string }{
		{`{"allowOut":["1.1.1.1"]}`, ""},
		{`{"allowOut":[],"maskRequestHost":null,"httpsPorts":null}`, ""},
		{`{"maskRequestHost":"app.local:${PORT}"}`, "network.maskRequestHost: set at create only"},
		{`{"maskRequestHost":""}`, "network.maskRequestHost: set at create only"},
		{`{"httpsPorts":[8443]}`, "network.httpsPorts: set at create only"},
		{`{"httpsPorts":[]}`, "network.httpsPorts: set at create only"},
		{`{"allowPublicTraffic":false}`, "network.allowPublicTraffic: set at create only"},
		{`{"egressProxy":{"address":"p:1","x":1}}`, "network.egressProxy: unknown field"},
		{`{"egressProxy":{"address":"p:1"},"rules":{"a.com":[{"transform":{"headers":{"A":"b"}}}]}}`, ""},
	} {
		var req networkUpdate
		if msg := decodeJSON([]byte(c.body), &req, false); msg != "" {
			t.Fatalf("%s: decode: %s", c.body, msg)
		}
		_, got := req.network()
		if c.wantErr == "" && got != "" || c.wantErr != "" && !strings.HasPrefix(got, c.wantErr) {
			t.Errorf("%s: %q, want %q", c.body, got, c.wantErr)
		}
	}
}
