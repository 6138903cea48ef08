package agentapi

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"testing"
)

// envd's v1 signature: sha256 of path:op:user:token[:exp], unpadded base64.
func TestSignatureVectors(t *testing.T) {
	for _, c := range []struct {
		path, op, user, token string
		exp                   int64
		joined                string
	}{
		{"/a", "read", "user", "tok", 5, "/a:read:user:tok:5"},
		{"/a", "write", "", "tok", 0, "/a:write::tok"},
	} {
		sum := sha256.Sum256([]byte(c.joined))
		want := "v1_" + base64.RawStdEncoding.EncodeToString(sum[:])
		if got := Signature(c.path, c.op, c.user, c.token, c.exp); got != want {
			t.Errorf("%s: %s, want %s", c.joined, got, want)
		}
	}
}

// A field left out of /init decodes as nil (the agent keeps what it has);
// one sent empty decodes as a pointer to "" (the node sends startUser ""
// to mean "the default user").
func TestInitAbsentAndEmptyFields(t *testing.T) {
	var absent, empty Init
	if err := json.Unmarshal([]byte(`{"startCmd":"x"}`), &absent); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal([]byte(`{"startCmd":"x","startUser":"","defaultUser":"","accessToken":""}`), &empty); err != nil {
		t.Fatal(err)
	}
	if absent.StartUser != nil || absent.DefaultUser != nil || absent.AccessToken != nil || absent.Timestamp != nil {
		t.Fatalf("absent fields decoded as set: %+v", absent)
	}
	if empty.StartUser == nil || *empty.StartUser != "" || empty.DefaultUser == nil || empty.AccessToken == nil {
		t.Fatalf("empty fields decoded as absent: %+v", empty)
	}
}

// The probe command is one shell word per argument whatever the path holds.
func TestHTTPProbeCommand(t *testing.T) {
	for path, want := range map[string]string{
		"/health": PathInSandbox + " -probe-http 'http://127.0.0.1:8080/health'",
		"ready":   PathInSandbox + " -probe-http 'http://127.0.0.1:8080/ready'",
		"/a'b":    PathInSandbox + ` -probe-http 'http://127.0.0.1:8080/a'\''b'`,
	} {
		if got := HTTPProbeCommand(8080, path); got != want {
			t.Errorf("%q: %s, want %s", path, got, want)
		}
	}
}
