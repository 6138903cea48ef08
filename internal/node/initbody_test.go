package node

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"maps"
	"math/big"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/cacerts"
	"github.com/cubicle-dev/cubicle/internal/network"
)

// legacyInitBody is the /init body as the node built it before
// agentapi.Init: a map, marshalled with sorted keys. It is the wire format
// every deployed agent decodes.
func legacyInitBody(req CreateRequest, egressCA *cacerts.Set, now time.Time) map[string]any {
	env := req.EnvVars
	if len(req.Policy.Rules) > 0 && egressCA != nil {
		env = cacerts.Env()
		maps.Copy(env, req.EnvVars)
	}
	b := map[string]any{
		"accessToken": req.EnvdToken,
		"envVars":     env,
		"defaultUser": req.DefaultUser,
		"timestamp":   now.UTC().Format(time.RFC3339Nano),
	}
	if req.StartCmd != "" {
		b["startCmd"], b["startUser"], b["startWorkdir"] = req.StartCmd, req.StartUser, req.StartWorkdir
	}
	if req.DefaultWorkdir != "" {
		b["defaultWorkdir"] = req.DefaultWorkdir
	}
	if len(req.Policy.Rules) > 0 && egressCA != nil {
		b["egressCA"] = string(egressCA.PEM())
	}
	return b
}

func testCA(t *testing.T) *cacerts.Set {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "nodetest CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tpl, tpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	set, err := cacerts.Parse(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
	if err != nil {
		t.Fatal(err)
	}
	return set
}

// The typed /init body is byte for byte what the map-built one was, so
// agents of either build read the same thing.
func TestInitBodyBytesUnchanged(t *testing.T) {
	ca := testCA(t)
	rules := network.Policy{Rules: map[string][]network.Rule{"api.example.com": {{Headers: map[string]string{"X-Key": "v"}}}}}
	now := time.Date(2026, 12, 5, 0, 1, 2, 300400500, time.FixedZone("x", 3600))
	for name, c := range map[string]struct {
		req CreateRequest
		ca  *cacerts.Set
	}{
		"minimal":          {req: CreateRequest{EnvdToken: "tok"}},
		"env and user":     {req: CreateRequest{EnvdToken: "tok", DefaultUser: "user", EnvVars: map[string]string{"B": "2", "A": "<&>"}}},
		"empty env":        {req: CreateRequest{EnvdToken: "tok", EnvVars: map[string]string{}}},
		"start command":    {req: CreateRequest{EnvdToken: "t", StartCmd: "run --x", StartUser: "", StartWorkdir: "/srv"}},
		"workdir":          {req: CreateRequest{EnvdToken: "t", DefaultWorkdir: "/home/user/app"}},
		"rules without CA": {req: CreateRequest{EnvdToken: "t", Policy: rules, EnvVars: map[string]string{"K": "v"}}},
		"rules with CA":    {req: CreateRequest{EnvdToken: "t", Policy: rules, EnvVars: map[string]string{"SSL_CERT_FILE": "mine"}}, ca: ca},
		"CA without rules": {req: CreateRequest{EnvdToken: "t"}, ca: ca},
		"everything": {req: CreateRequest{EnvdToken: "t", DefaultUser: "root", DefaultWorkdir: "/w", StartCmd: "s", StartUser: "1000:1000",
			StartWorkdir: "/s", EnvVars: map[string]string{"Z": "z"}, Policy: rules}, ca: ca},
	} {
		want, err := json.Marshal(legacyInitBody(c.req, c.ca, now))
		if err != nil {
			t.Fatal(err)
		}
		got, err := json.Marshal(initBody(c.req, c.ca, now))
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != string(want) {
			t.Errorf("%s:\n got %s\nwant %s", name, got, want)
		}
	}
}

// Only HTTPS rules make a sandbox trust the interception CA: the proxy
// decrypts for no other kind, so plain-HTTP rules alone do not need it.
func TestInitBodyCAOnlyForHTTPSRules(t *testing.T) {
	ca := testCA(t)
	plainOnly := network.Policy{Rules: map[string][]network.Rule{"api.example.com": {{Headers: map[string]string{"X-Key": "v"}, Plain: true}}}}
	if b := initBody(CreateRequest{EnvdToken: "t", Policy: plainOnly}, ca, time.Now()); b.EgressCA != "" {
		t.Fatal("a sandbox with plain-HTTP rules only got the interception CA")
	}
	both := network.Policy{Rules: map[string][]network.Rule{"api.example.com": {{Headers: map[string]string{"X-Key": "v"}, Plain: true}, {Headers: map[string]string{"X-Key": "v"}}}}}
	if b := initBody(CreateRequest{EnvdToken: "t", Policy: both}, ca, time.Now()); b.EgressCA == "" {
		t.Fatal("a sandbox with HTTPS rules did not get the interception CA")
	}
}
