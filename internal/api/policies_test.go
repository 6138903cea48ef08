package api

import (
	"context"
	"encoding/json"
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cubicle-dev/cubicle/internal/store"
	"github.com/cubicle-dev/cubicle/internal/store/sqlite"
)

// policyServer is the real router over a real SQLite store with an admin
// key and a plain key of another team.
func policyServer(t *testing.T) (h http.Handler, admin, plain string, st store.Store) {
	t.Helper()
	st, err := sqlite.Open(filepath.Join(t.TempDir(), "c.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	ctx := context.Background()
	for _, id := range []string{"t_a", "t_b"} {
		if err := st.CreateTeam(ctx, &store.Team{ID: id, Name: id}); err != nil {
			t.Fatal(err)
		}
	}
	admin, plain = "e2b_admin0000000000000", "e2b_plain0000000000000"
	for _, k := range []*store.APIKey{
		{ID: "ka", TeamID: "t_a", Name: "a", Hash: HashKey(admin), Admin: true},
		{ID: "kb", TeamID: "t_b", Name: "b", Hash: HashKey(plain)},
	} {
		if err := st.CreateAPIKey(ctx, k); err != nil {
			t.Fatal(err)
		}
	}
	return New(Config{}, nil, st).router, admin, plain, st
}

// e2bError decodes an error body and checks its shape: {"code": status,
// "message": "..."} with the code equal to the HTTP status.
func e2bError(t *testing.T, code int, body string) string {
	t.Helper()
	var e struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	}
	if err := json.Unmarshal([]byte(body), &e); err != nil || e.Code != code || e.Message == "" {
		t.Fatalf("error body %q is not e2b-shaped for %d", body, code)
	}
	return e.Message
}

// A bad expression is refused at write with 400 and CEL's own message,
// and nothing is stored.
func TestPolicyPutRefusesBadExpressionsWithTheCompilersMessage(t *testing.T) {
	h, admin, _, st := policyServer(t)
	for _, c := range []struct{ body, want string }{
		{`{"filter":"nod.cpu > 2"}`, "undeclared reference to 'nod'"},
		{`{"filter":"node.cpu"}`, "evaluates to double, want bool"},
		{`{"score":"node.labels[\"zone\"]"}`, "evaluates to string, want double or int"},
		{`{"filter":"node.labels.all(a, node.labels.all(b, a != b))"}`, "exceeds the limit of 1000"},
		{`{"filter":"node.cpu >"}`, "Syntax error"},
		{`{}`, "needs a filter or a score"},
		{`{"filter":"true","weight":2}`, "weight"},
		{``, "request body is required"},
	} {
		code, body, _ := call(t, h, admin, "PUT", "/scheduler/policies/template/base", c.body)
		if code != 400 {
			t.Fatalf("PUT %s: %d %s, want 400", c.body, code, body)
		}
		if msg := e2bError(t, code, body); !strings.Contains(msg, c.want) {
			t.Fatalf("PUT %s: message %q does not name %q", c.body, msg, c.want)
		}
	}
	for _, c := range []struct{ path, want string }{
		{"/scheduler/policies/cluster/x", "want 'team' or 'template'"},
		{"/scheduler/policies/team/t_nope", `no team "t_nope"`},
	} {
		code, body, _ := call(t, h, admin, "PUT", c.path, `{"filter":"true"}`)
		if msg := e2bError(t, code, body); code != 400 || !strings.Contains(msg, c.want) {
			t.Fatalf("PUT %s: %d %q, want 400 naming %q", c.path, code, msg, c.want)
		}
	}
	if ps, _ := st.ListPlacementPolicies(context.Background()); len(ps) != 0 {
		t.Fatalf("refused policies were stored: %d", len(ps))
	}
}

// Policies are what all teams are placed under: only admin keys read or
// change them (403, e2b-shaped), and no key at all is 401.
func TestPolicyRoutesNeedAnAdminKey(t *testing.T) {
	h, admin, plain, _ := policyServer(t)
	if code, body, _ := call(t, h, admin, "PUT", "/scheduler/policies/team/t_b", `{"filter":"true"}`); code != 200 {
		t.Fatalf("admin PUT: %d %s", code, body)
	}
	for _, c := range []struct{ method, path, body string }{
		{"GET", "/scheduler/policies", ""},
		{"GET", "/scheduler/policies/team/t_b", ""},
		{"PUT", "/scheduler/policies/team/t_b", `{"filter":"false"}`},
		{"DELETE", "/scheduler/policies/team/t_b", ""},
	} {
		code, body, _ := call(t, h, plain, c.method, c.path, c.body)
		if code != 403 {
			t.Fatalf("plain key %s %s: %d %s, want 403", c.method, c.path, code, body)
		}
		e2bError(t, code, body)
		if code, body, _ := call(t, h, "", c.method, c.path, c.body); code != 401 {
			t.Fatalf("no key %s %s: %d %s, want 401", c.method, c.path, code, body)
		}
	}
	// The plain key's PUT and DELETE changed nothing.
	code, body, _ := call(t, h, admin, "GET", "/scheduler/policies/team/t_b", "")
	if code != 200 || !strings.Contains(body, `"filter":"true"`) {
		t.Fatalf("after refused writes: %d %s", code, body)
	}
}

// Set, read, list, replace, delete through the API.
func TestPolicyRoutesRoundTrip(t *testing.T) {
	h, admin, _, _ := policyServer(t)
	code, body, _ := call(t, h, admin, "PUT", "/scheduler/policies/template/base",
		`{"filter":"node.labels[\"zone\"] == \"a\"","score":"node.free_cpu / 4.0"}`)
	var p policyJSON
	if code != 200 || json.Unmarshal([]byte(body), &p) != nil || p.Scope != store.PolicyTemplate || p.Target != "base" ||
		p.Filter != `node.labels["zone"] == "a"` || p.Score != "node.free_cpu / 4.0" || p.CreatedAt.IsZero() {
		t.Fatalf("PUT: %d %s", code, body)
	}
	if code, body, _ := call(t, h, admin, "PUT", "/scheduler/policies/team/t_a", `{"score":"node.warm"}`); code != 200 {
		t.Fatalf("PUT team: %d %s", code, body)
	}
	// Replacing drops the filter: a PUT is the whole policy.
	if code, body, _ := call(t, h, admin, "PUT", "/scheduler/policies/template/base", `{"score":"1"}`); code != 200 {
		t.Fatalf("replace: %d %s", code, body)
	}
	code, body, _ = call(t, h, admin, "GET", "/scheduler/policies", "")
	var all []policyJSON
	if code != 200 || json.Unmarshal([]byte(body), &all) != nil || len(all) != 2 ||
		all[0].Target != "t_a" || all[1].Target != "base" || all[1].Filter != "" || all[1].Score != "1" {
		t.Fatalf("list: %d %s", code, body)
	}
	if code, body, _ := call(t, h, admin, "DELETE", "/scheduler/policies/template/base", ""); code != 204 {
		t.Fatalf("DELETE: %d %s", code, body)
	}
	for _, m := range []string{"GET", "DELETE"} {
		code, body, _ := call(t, h, admin, m, "/scheduler/policies/template/base", "")
		if msg := e2bError(t, code, body); code != 404 || !strings.Contains(msg, "template 'base'") {
			t.Fatalf("%s after delete: %d %s", m, code, body)
		}
	}
	if code, body, _ := call(t, h, admin, "GET", "/scheduler/policies/zone/x", ""); code != 400 {
		t.Fatalf("GET unknown scope: %d %s", code, body)
	}
}
