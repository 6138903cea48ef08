package integration

import (
	"encoding/json"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// Placement policies through a real serve (started with --schedule
// binpack): a bad expression is a 400 with the compiler's message, a
// template policy the node fails makes the create a 429 naming the policy
// and CEL's reason, a policy set with the CLI lets the create through to a
// working sandbox, and DELETE removes it.
func TestPlacementPolicyRefusesAndAdmitsCreates(t *testing.T) {
	s := startServer(t, "--schedule", "binpack")
	type errBody struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	}
	expect := func(st int, body []byte, want int, text string) {
		t.Helper()
		var e errBody
		if err := json.Unmarshal(body, &e); err != nil || st != want || e.Code != want || !strings.Contains(e.Message, text) {
			t.Fatalf("got %d %s, want %d naming %q", st, body, want, text)
		}
	}
	st, _, body := s.raw("PUT", "/scheduler/policies/template/base", map[string]any{"filter": "node.lables.size() > 0"})
	expect(st, body, http.StatusBadRequest, "undeclared reference to 'node'")

	st, _, body = s.raw("PUT", "/scheduler/policies/template/base", map[string]any{"filter": `node.labels["zone"] == "eu-1"`})
	if st != http.StatusOK {
		t.Fatalf("PUT policy: %d %s", st, body)
	}
	st, _, body = s.raw("POST", "/v2/sandboxes", map[string]any{"templateID": "base"})
	expect(st, body, http.StatusTooManyRequests, "refused by placement policy")
	if !strings.Contains(string(body), "no such key: zone") {
		t.Fatalf("the refusal does not say why: %s", body)
	}

	out, err := exec.Command(filepath.Join(binDir, "cubicle"), "scheduler", "policy", "set", "template", "base",
		"--filter", `node.id == "local"`, "--score", "node.free_cpu", "--data-dir", s.DataDir).CombinedOutput()
	if err != nil {
		t.Fatalf("cubicle scheduler policy set: %v\n%s", err, out)
	}
	c := s.create(map[string]any{"templateID": "base"})
	if got := s.mustRun(c, "echo ok"); got != "ok\n" {
		t.Fatalf("sandbox placed under the policy: %q", got)
	}
	if st, _, body := s.raw("DELETE", "/scheduler/policies/template/base", nil); st != http.StatusNoContent {
		t.Fatalf("DELETE: %d %s", st, body)
	}
	st, _, body = s.raw("GET", "/scheduler/policies/template/base", nil)
	expect(st, body, http.StatusNotFound, "no placement policy")
}
