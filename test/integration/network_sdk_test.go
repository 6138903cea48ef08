package integration

import (
	"context"
	"errors"
	"reflect"
	"testing"
	"time"

	cubicle "github.com/cubicle-dev/cubicle/sdk/go"
)

// The Go SDK's network options over a real server: create with rules,
// dnsServers: [] and an egress proxy, read them back (never the proxy's
// password), then UpdateNetwork, which replaces the whole egress config.
func TestSDKNetworkOptions(t *testing.T) {
	// 192.0.2.0/24 (TEST-NET-1) is refused as an upstream unless allowed;
	// nothing listens there, and nothing here dials out.
	s := startServer(t, "--egress-proxy-allow", "192.0.2.0/24")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c, err := cubicle.NewClient(cubicle.Config{APIURL: s.URL, APIKey: s.Key})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.CreateSecret(ctx, "net-key", "value-never-shown", nil); err != nil {
		t.Fatal(err)
	}
	ph, err := cubicle.SecretPlaceholder("net-key")
	if err != nil {
		t.Fatal(err)
	}
	rules := map[string][]cubicle.NetworkRule{
		"api.example.com": {{Transform: &cubicle.NetworkTransform{Headers: map[string]string{"X-Api-Key": ph, "X-Team": "cubicle"}}}},
	}
	sb, err := c.Create(ctx, cubicle.CreateOptions{Network: &cubicle.NetworkConfig{
		AllowOut:    []string{"api.example.com"},
		DenyOut:     []string{"0.0.0.0/0"},
		Rules:       rules,
		DNSServers:  &[]string{},
		EgressProxy: &cubicle.EgressProxy{Address: "192.0.2.10:1080", Username: "alice", Password: "pw", TLS: &cubicle.EgressProxyTLS{Enabled: true, ServerName: "proxy.test"}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Kill(context.Background())

	info, err := sb.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	n := info.Network
	if n == nil || !reflect.DeepEqual(n.AllowOut, []string{"api.example.com"}) || !reflect.DeepEqual(n.DenyOut, []string{"0.0.0.0/0"}) {
		t.Fatalf("network %+v", n)
	}
	if !reflect.DeepEqual(n.Rules, rules) {
		t.Fatalf("rules %+v", n.Rules)
	}
	if n.DNSServers == nil || len(*n.DNSServers) != 0 {
		t.Fatalf("dnsServers %v, want [] (none), not absent", n.DNSServers)
	}
	wantProxy := &cubicle.EgressProxy{Address: "192.0.2.10:1080", Username: "alice", TLS: &cubicle.EgressProxyTLS{Enabled: true, ServerName: "proxy.test"}}
	if !reflect.DeepEqual(n.EgressProxy, wantProxy) {
		t.Fatalf("egressProxy %+v (password must not come back)", n.EgressProxy)
	}

	// An update replaces everything: rules, the proxy and dnsServers left
	// out are cleared.
	if err := sb.UpdateNetwork(ctx, cubicle.NetworkUpdate{AllowOut: []string{"pypi.org"}, DenyOut: []string{"0.0.0.0/0"}}); err != nil {
		t.Fatal(err)
	}
	if info, err = c.Get(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	n = info.Network
	if !reflect.DeepEqual(n.AllowOut, []string{"pypi.org"}) || n.Rules != nil || n.EgressProxy != nil || n.DNSServers != nil {
		t.Fatalf("after update: %+v", n)
	}

	// A refused option is an ErrInvalidArgument and changes nothing.
	bad := cubicle.NetworkUpdate{Rules: map[string][]cubicle.NetworkRule{"a.example.com": {{Transform: &cubicle.NetworkTransform{Headers: map[string]string{"Host": "x"}}}}}}
	if err := c.UpdateNetwork(ctx, sb.ID, bad); !errors.Is(err, cubicle.ErrInvalidArgument) {
		t.Fatalf("Host header: %v", err)
	}
	if info, err = c.Get(ctx, sb.ID); err != nil || !reflect.DeepEqual(info.Network.AllowOut, []string{"pypi.org"}) {
		t.Fatalf("after refused update: %+v %v", info.Network, err)
	}
	if err := c.UpdateNetwork(ctx, "no-such-sandbox", cubicle.NetworkUpdate{}); !errors.Is(err, cubicle.ErrSandboxNotFound) {
		t.Fatalf("missing sandbox: %v", err)
	}
}
