package integration

import (
	"io"
	"net/http"
	"strings"
	"testing"
)

// Options that used to be answered 201/204 and dropped are refused by
// name; an unknown top-level field is accepted and counted; /metrics is
// served on its own listener only.
func TestMisspeltOptionsRefusedAndMetricsOnOwnListener(t *testing.T) {
	s := startServer(t)
	refused := func(method, path string, body any, want string) {
		t.Helper()
		var e struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
		}
		if st := s.do(method, path, body, &e); st != http.StatusBadRequest || e.Code != http.StatusBadRequest || !strings.Contains(e.Message, want) {
			t.Fatalf("%s %s %v: %d %+v, want 400 naming %s", method, path, body, st, e, want)
		}
	}
	refused("POST", "/v2/sandboxes", map[string]any{"templateID": "base", "network": map[string]any{"deny_out": []string{"0.0.0.0/0"}}}, `"deny_out": the field is "denyOut"`)
	refused("POST", "/sandboxes", map[string]any{"templateID": "base", "timeout": 60, "allowInternetAccess": false}, `"allowInternetAccess": the field is "allow_internet_access"`)

	c := s.create(map[string]any{"templateID": "base", "futureOption": map[string]any{"x": 1}})
	refused("PUT", "/sandboxes/"+c.SandboxID+"/network", map[string]any{"allow_internet_Access": false}, `network: unknown field "allow_internet_Access"`)
	refused("PUT", "/sandboxes/"+c.SandboxID+"/network", map[string]any{"allowOut": []string{"1.1.1.1"}, "deny_out": []string{"0.0.0.0/0"}}, `network: unknown field "deny_out"`)
	var detail map[string]any
	if s.do("GET", "/sandboxes/"+c.SandboxID, nil, &detail); detail["allowInternetAccess"] != true {
		t.Fatalf("a refused update changed the policy: allowInternetAccess %v", detail["allowInternetAccess"])
	}
	// e2b's spelling and CubeSandbox's (its update_network sends the
	// camelCase one) both apply.
	for _, field := range []string{"allowInternetAccess", "allow_internet_access"} {
		for _, want := range []bool{false, true} {
			if st := s.do("PUT", "/sandboxes/"+c.SandboxID+"/network", map[string]any{field: want}, nil); st != http.StatusNoContent {
				t.Fatalf("%s: %v: %d", field, want, st)
			}
			if s.do("GET", "/sandboxes/"+c.SandboxID, nil, &detail); detail["allowInternetAccess"] != want {
				t.Fatalf("%s: %v not applied: %v", field, want, detail["allowInternetAccess"])
			}
		}
	}

	// CubeSandbox's lifecycle object is applied, not dropped.
	lc := s.create(map[string]any{"templateID": "base", "lifecycle": map[string]any{"onTimeout": "pause", "autoResume": true}})
	var got struct {
		Lifecycle struct {
			AutoResume bool   `json:"autoResume"`
			OnTimeout  string `json:"onTimeout"`
		} `json:"lifecycle"`
	}
	if s.do("GET", "/sandboxes/"+lc.SandboxID, nil, &got); got.Lifecycle.OnTimeout != "pause" || !got.Lifecycle.AutoResume {
		t.Fatalf("lifecycle not applied: %+v", got.Lifecycle)
	}

	// The public listener: no /metrics, with or without a key.
	for _, key := range []string{"", s.Key} {
		req, _ := http.NewRequest("GET", s.URL+"/metrics", nil)
		if key != "" {
			req.Header.Set("X-API-Key", key)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusNotFound || strings.Contains(string(b), "cubicle_") {
			t.Fatalf("public /metrics (key %q): %d %.200s", key, resp.StatusCode, b)
		}
	}
	s.requireMetrics(t, "cubicle_sandboxes_live 2",
		`cubicle_api_unknown_fields_total{field="futureOption",route="POST /v2/sandboxes"} 1`)
	if !strings.Contains(s.logs.String(), "field=futureOption") {
		t.Fatalf("the unknown field was not logged:\n%s", s.logs)
	}
}
