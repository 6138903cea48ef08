package cubicle

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"reflect"
	"testing"
)

// jsonMap is a JSON object literal as the recorder decodes request bodies.
func jsonMap(t *testing.T, s string) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal([]byte(s), &m); err != nil {
		t.Fatalf("%s: %v", s, err)
	}
	return m
}

func TestCreateSendsNetworkOptions(t *testing.T) {
	var rec recorder
	c := testClient(t, rec.handler(t, func(w http.ResponseWriter, r *http.Request, body map[string]any) {
		fmt.Fprint(w, `{"sandboxID":"sb1","templateID":"base"}`)
	}), nil)
	ctx := context.Background()
	key, err := SecretPlaceholder("api-key")
	if err != nil {
		t.Fatal(err)
	}
	f := false
	_, err = c.Create(ctx, CreateOptions{Template: "base", Network: &NetworkConfig{
		AllowPublicTraffic: &f,
		AllowOut:           []string{"api.example.com"},
		DenyOut:            []string{"0.0.0.0/0"},
		MaskRequestHost:    "localhost:${PORT}",
		HTTPSPorts:         []int{8443},
		Rules: map[string][]NetworkRule{
			"api.example.com": {{Transform: &NetworkTransform{Headers: map[string]string{"Authorization": "Bearer " + key}}}},
		},
		EgressProxy: &EgressProxy{Address: "proxy.example.com:1080", Username: "u", Password: "p",
			TLS: &EgressProxyTLS{Enabled: true, ServerName: "proxy", CACert: "PEM"}},
		DNSServers: &[]string{"1.1.1.1"},
	}})
	if err != nil {
		t.Fatal(err)
	}
	want := jsonMap(t, `{"templateID":"base","network":{
		"allowPublicTraffic":false,"allowOut":["api.example.com"],"denyOut":["0.0.0.0/0"],
		"maskRequestHost":"localhost:${PORT}","httpsPorts":[8443],
		"rules":{"api.example.com":[{"transform":{"headers":{"Authorization":"Bearer ${e2b.secrets.api-key}"}}}]},
		"egressProxy":{"address":"proxy.example.com:1080","username":"u","password":"p",
			"tls":{"enabled":true,"serverName":"proxy","caCert":"PEM"}},
		"dnsServers":["1.1.1.1"]}}`)
	if l := rec.last(); l.method != "POST" || l.uri != "/v2/sandboxes" || !reflect.DeepEqual(l.body, want) {
		t.Fatalf("request %s %s %v", l.method, l.uri, l.body)
	}

	// dnsServers: nil is left out (the default); an empty list, even a
	// pointer to a nil slice, is sent as [] (none). Zero options send {}.
	var nilList []string
	for _, tc := range []struct {
		dns  *[]string
		want string
	}{
		{nil, `{}`},
		{&[]string{}, `{"dnsServers":[]}`},
		{&nilList, `{"dnsServers":[]}`},
	} {
		n := &NetworkConfig{DNSServers: tc.dns}
		if _, err := c.Create(ctx, CreateOptions{Template: "base", Network: n}); err != nil {
			t.Fatal(err)
		}
		if got := rec.last().body["network"]; !reflect.DeepEqual(got, jsonMap(t, tc.want)) {
			t.Fatalf("dnsServers %v: sent %v, want %s", tc.dns, got, tc.want)
		}
		if n.DNSServers != tc.dns {
			t.Fatal("Create changed the caller's NetworkConfig")
		}
	}
}

func TestGetDecodesNetwork(t *testing.T) {
	// The GET detail as the server writes it (internal/api: networkConfig,
	// egressOut): no password, no caCert.
	const detail = `{"sandboxID":"sb1","templateID":"base","state":"running","allowInternetAccess":true,
		"network":{"allowPublicTraffic":true,"allowOut":["api.example.com"],"denyOut":["0.0.0.0/0"],
			"httpsPorts":[8443],"dnsServers":[],
			"egressProxy":{"address":"proxy.example.com:1080","username":"u","tls":{"enabled":true,"serverName":"proxy"}},
			"rules":{"api.example.com":[{"transform":{"headers":{"X-Key":"${e2b.secrets.k}"}}}]}},
		"lifecycle":{"autoResume":false,"onTimeout":"kill"}}`
	c := testClient(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/sandboxes/sb2" {
			fmt.Fprint(w, `{"sandboxID":"sb2","network":{"allowPublicTraffic":true}}`)
			return
		}
		fmt.Fprint(w, detail)
	}, nil)
	info, err := c.Get(context.Background(), "sb1")
	if err != nil {
		t.Fatal(err)
	}
	tr := true
	want := &NetworkConfig{
		AllowPublicTraffic: &tr,
		AllowOut:           []string{"api.example.com"},
		DenyOut:            []string{"0.0.0.0/0"},
		HTTPSPorts:         []int{8443},
		DNSServers:         &[]string{},
		EgressProxy:        &EgressProxy{Address: "proxy.example.com:1080", Username: "u", TLS: &EgressProxyTLS{Enabled: true, ServerName: "proxy"}},
		Rules: map[string][]NetworkRule{
			"api.example.com": {{Transform: &NetworkTransform{Headers: map[string]string{"X-Key": "${e2b.secrets.k}"}}}},
		},
	}
	if !reflect.DeepEqual(info.Network, want) {
		t.Fatalf("network %+v", info.Network)
	}
	if info.AllowInternetAccess == nil || !*info.AllowInternetAccess {
		t.Fatalf("allowInternetAccess %v", info.AllowInternetAccess)
	}

	// No dnsServers: nil (the default), told apart from [] (none).
	if info, err = c.Get(context.Background(), "sb2"); err != nil || info.Network.DNSServers != nil || info.Network.Rules != nil || info.Network.EgressProxy != nil {
		t.Fatalf("%+v %v", info.Network, err)
	}
}

func TestUpdateNetwork(t *testing.T) {
	var rec recorder
	c := testClient(t, rec.handler(t, func(w http.ResponseWriter, r *http.Request, body map[string]any) {
		switch r.URL.Path {
		case "/sandboxes/gone/network":
			apiError(w, 404, "sandbox_not_found", "sandbox 'gone' not found")
		case "/sandboxes/bad/network":
			apiError(w, 400, "", `network.rules["a.com"][0].transform.headers["Host"]: this header frames or routes the request`)
		default:
			w.WriteHeader(http.StatusNoContent)
		}
	}), nil)
	ctx := context.Background()
	f := false
	sb := c.sandboxFrom(sandboxJSON{SandboxID: "sb1"})
	err := sb.UpdateNetwork(ctx, NetworkUpdate{
		AllowInternetAccess: &f,
		AllowOut:            []string{"pypi.org"},
		DenyOut:             []string{"10.0.0.0/8"},
		Rules:               map[string][]NetworkRule{"pypi.org": {{Transform: &NetworkTransform{Headers: map[string]string{"X-A": "b"}}}}},
		EgressProxy:         &EgressProxy{Address: "10.1.2.3:1080"},
		DNSServers:          &[]string{"8.8.8.8"},
	})
	if err != nil {
		t.Fatal(err)
	}
	want := jsonMap(t, `{"allow_internet_access":false,"allowOut":["pypi.org"],"denyOut":["10.0.0.0/8"],
		"rules":{"pypi.org":[{"transform":{"headers":{"X-A":"b"}}}]},
		"egressProxy":{"address":"10.1.2.3:1080"},"dnsServers":["8.8.8.8"]}`)
	if l := rec.last(); l.method != "PUT" || l.uri != "/sandboxes/sb1/network" || !reflect.DeepEqual(l.body, want) {
		t.Fatalf("request %s %s %v", l.method, l.uri, l.body)
	}

	// The zero update clears everything: an empty object, never nulls.
	if err := c.UpdateNetwork(ctx, "sb1", NetworkUpdate{}); err != nil {
		t.Fatal(err)
	}
	if l := rec.last(); l.body == nil || len(l.body) != 0 {
		t.Fatalf("zero update sent %v, want {}", l.body)
	}
	var nilList []string
	if err := c.UpdateNetwork(ctx, "sb1", NetworkUpdate{DNSServers: &nilList}); err != nil {
		t.Fatal(err)
	}
	if l := rec.last(); !reflect.DeepEqual(l.body, jsonMap(t, `{"dnsServers":[]}`)) {
		t.Fatalf("no DNS servers sent %v", l.body)
	}

	if err := c.UpdateNetwork(ctx, "gone", NetworkUpdate{}); !errors.Is(err, ErrSandboxNotFound) {
		t.Fatalf("gone: %v", err)
	}
	if err := c.UpdateNetwork(ctx, "bad", NetworkUpdate{}); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("bad: %v", err)
	}
}

func TestSecretPlaceholder(t *testing.T) {
	for name, want := range map[string]string{
		"openai-api-key": "${e2b.secrets.openai-api-key}",
		"a/b c.é":        "${e2b.secrets.a/b c.é}",
	} {
		if got, err := SecretPlaceholder(name); err != nil || got != want {
			t.Errorf("%q: %q %v", name, got, err)
		}
	}
	for _, name := range []string{"", "a{b", "a}b", "a\nb", "a\x00", "a\x1fb", "a\x7fb", "a\u0085b", "a\u009fb", "\xff"} {
		if got, err := SecretPlaceholder(name); !errors.Is(err, ErrInvalidArgument) || got != "" {
			t.Errorf("%q: %q %v, want ErrInvalidArgument", name, got, err)
		}
	}
}
