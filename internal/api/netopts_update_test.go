package api

import (
	"strings"
	"testing"
)

// PUT /network keeps the create-time mask and httpsPorts; a body that sets
// them is refused by name rather than answered 204 with the values dropped.
func TestNetworkUpdateRefusesCreateOnlyOptions(t *testing.T) {
	for _, c := range []struct{ body, wantErr string }{
		{`{"allowOut":["1.1.1.1"]}`, ""},
		{`{"allowOut":[],"maskRequestHost":null,"httpsPorts":null}`, ""},
		{`{"maskRequestHost":"app.local:${PORT}"}`, "network.maskRequestHost: set at create only"},
		{`{"maskRequestHost":""}`, "network.maskRequestHost: set at create only"},
		{`{"httpsPorts":[8443]}`, "network.httpsPorts: set at create only"},
		{`{"httpsPorts":[]}`, "network.httpsPorts: set at create only"},
	} {
		var req networkUpdate
		if msg := decodeJSON([]byte(c.body), &req, false); msg != "" {
			t.Fatalf("%s: decode: %s", c.body, msg)
		}
		got := createOnlyNetwork(req.MaskRequestHost, req.HTTPSPorts)
		if c.wantErr == "" && got != "" || c.wantErr != "" && !strings.HasPrefix(got, c.wantErr) {
			t.Errorf("%s: %q, want %q", c.body, got, c.wantErr)
		}
	}
}
