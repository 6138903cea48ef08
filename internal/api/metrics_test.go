package api

import (
	"net/http"
	"strings"
	"testing"
)

// /metrics names every team's pooled templates: the API router does not
// serve it (serve puts it on --metrics-listen).
func TestAPIRouterHasNoMetrics(t *testing.T) {
	h, key := fieldsServer(t)
	for _, k := range []string{"", key} {
		code, body, _ := call(t, h, k, "GET", "/metrics", "")
		if code != http.StatusNotFound || strings.Contains(body, "cubicle_") {
			t.Fatalf("GET /metrics (key %q): %d %.200s", k, code, body)
		}
	}
}
