package api

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cubicle-dev/cubicle/internal/secret"
	"github.com/cubicle-dev/cubicle/internal/store"
	"github.com/cubicle-dev/cubicle/internal/store/sqlite"
)

// secretsServer is the real router over a real SQLite store with two teams'
// keys; the routes under test need no sandbox manager.
func secretsServer(t *testing.T) (h http.Handler, keyA, keyB string, logs *bytes.Buffer, dbPath string) {
	t.Helper()
	dir := t.TempDir()
	dbPath = filepath.Join(dir, "c.db")
	st, err := sqlite.Open(dbPath)
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
	keyA, keyB = "e2b_aaaaaaaaaaaaaaaa", "e2b_bbbbbbbbbbbbbbbb"
	for _, k := range []*store.APIKey{
		{ID: "ka", TeamID: "t_a", Name: "a", Hash: HashKey(keyA)},
		{ID: "kb", TeamID: "t_b", Name: "b", Hash: HashKey(keyB)},
	} {
		if err := st.CreateAPIKey(ctx, k); err != nil {
			t.Fatal(err)
		}
	}
	key, err := secret.LoadOrCreateKey(filepath.Join(dir, "secrets.key"))
	if err != nil {
		t.Fatal(err)
	}
	sx, err := secret.New(st, key)
	if err != nil {
		t.Fatal(err)
	}
	logs = &bytes.Buffer{}
	srv := New(Config{Secrets: sx, Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))}, nil, st)
	return srv.router, keyA, keyB, logs, dbPath
}

func call(t *testing.T, h http.Handler, key, method, path, body string) (int, string, http.Header) {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req := httptest.NewRequest(method, path, rd)
	req.Header.Set("X-API-KEY", key)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec.Code, rec.Body.String(), rec.Header()
}

func TestSecretRoutes(t *testing.T) {
	h, a, b, logs, dbPath := secretsServer(t)
	const canary = "CANARY-value-0e5f1d"
	code, body, _ := call(t, h, a, "POST", "/secrets", `{"name":"tok","value":"`+canary+`"}`)
	if code != 201 {
		t.Fatalf("create: %d %s", code, body)
	}
	var sec secretJSON
	json.Unmarshal([]byte(body), &sec)
	if sec.CurrentVersion != 1 || sec.Metadata == nil || !strings.HasPrefix(sec.SecretID, "sec_") || strings.Contains(body, canary) {
		t.Fatalf("create body: %s", body)
	}
	for _, c := range []struct {
		key, method, path, body string
		want                    int
	}{
		{a, "GET", "/secrets/" + sec.SecretID, "", 200},
		{a, "GET", "/secrets/tok", "", 200},
		{a, "POST", "/secrets/tok", `{"value":"` + canary + `2","metadata":{"k":"v"}}`, 200},
		{a, "GET", "/secrets", "", 200},
		{a, "POST", "/secrets", `{"name":"tok","value":"x"}`, 409},
		{a, "POST", "/secrets", `{"name":"a}b","value":"x"}`, 400},
		{a, "POST", "/secrets", `{"name":"n","value":"x","extra":1}`, 400},
		{a, "POST", "/secrets", `{"name":"n","value":"` + canary, 400},
		{a, "POST", "/secrets", ``, 400},
		{a, "POST", "/secrets/tok", `{"metadata":{}}`, 400},
		{a, "GET", "/secrets?limit=500", "", 400},
		{a, "GET", "/secrets?nextToken=bm9wZQ", "", 400},
		{a, "GET", "/secrets/nope", "", 404},
		{a, "DELETE", "/secrets/nope", "", 404},
		{b, "GET", "/secrets/" + sec.SecretID, "", 404},
		{b, "GET", "/secrets/tok", "", 404},
		{b, "POST", "/secrets/tok", `{"value":"x"}`, 404},
		{b, "DELETE", "/secrets/tok", "", 404},
		{"e2b_wrong", "GET", "/secrets", "", 401},
	} {
		code, body, _ := call(t, h, c.key, c.method, c.path, c.body)
		if code != c.want {
			t.Fatalf("%s %s %s: %d, want %d: %s", c.key[:5], c.method, c.path, code, c.want, body)
		}
		if strings.Contains(body, canary) {
			t.Fatalf("%s %s leaked the value: %s", c.method, c.path, body)
		}
		if code >= 400 {
			var e errorBody
			if json.Unmarshal([]byte(body), &e) != nil || e.Code != code || e.Message == "" {
				t.Fatalf("%s %s: not an e2b error body: %s", c.method, c.path, body)
			}
		}
	}
	_, got, _ := call(t, h, a, "GET", "/secrets/tok", "")
	if !strings.Contains(got, `"currentVersion":2`) || !strings.Contains(got, `"k":"v"`) {
		t.Fatalf("after update: %s", got)
	}
	// Another team's secret and a missing one answer the same bytes.
	_, other, _ := call(t, h, b, "GET", "/secrets/"+sec.SecretID, "")
	_, missing, _ := call(t, h, b, "GET", "/secrets/sec_000000000000000000000000", "")
	if !strings.Contains(other, `"error_code":"secret_not_found"`) {
		t.Fatalf("404 without error_code secret_not_found: %s", other)
	}
	if strings.ReplaceAll(other, sec.SecretID, "X") != strings.ReplaceAll(missing, "sec_000000000000000000000000", "X") {
		t.Fatalf("cross-team 404 differs from a missing one: %s vs %s", other, missing)
	}
	if code, _, _ := call(t, h, a, "DELETE", "/secrets/"+sec.SecretID, ""); code != 204 {
		t.Fatalf("delete: %d", code)
	}
	if strings.Contains(logs.String(), canary) {
		t.Fatal("the value reached a log line")
	}
	files, _ := filepath.Glob(dbPath + "*") // the database and its WAL
	for _, f := range files {
		raw, _ := os.ReadFile(f)
		if bytes.Contains(raw, []byte(canary)) {
			t.Fatalf("%s holds the value", f)
		}
	}
}

func TestSecretListPages(t *testing.T) {
	h, a, _, _, _ := secretsServer(t)
	for _, n := range []string{"s1", "s2", "s3"} {
		if code, body, _ := call(t, h, a, "POST", "/secrets", `{"name":"`+n+`","value":"v"}`); code != 201 {
			t.Fatal(body)
		}
	}
	var names []string
	path := "/secrets?limit=2"
	for i := 0; i < 5; i++ {
		code, body, hdr := call(t, h, a, "GET", path, "")
		if code != 200 {
			t.Fatal(body)
		}
		var page []secretJSON
		json.Unmarshal([]byte(body), &page)
		for _, s := range page {
			names = append(names, s.Name)
		}
		tok := hdr.Get("X-Next-Token")
		if tok == "" {
			break
		}
		path = "/secrets?limit=2&nextToken=" + tok
	}
	if strings.Join(names, ",") != "s1,s2,s3" {
		t.Fatalf("pages: %v", names)
	}
}

// encodeURIComponent is the JS SDK's path encoding (openapi-fetch): every
// byte but A-Z a-z 0-9 - _ . ! ~ * ' ( ) is percent-encoded.
func encodeURIComponent(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("-_.!~*'()", c) >= 0 {
			b.WriteByte(c)
			continue
		}
		fmt.Fprintf(&b, "%%%02X", c)
	}
	return b.String()
}

// Every name the SDKs may send is reachable by name on all three {secret}
// routes, however the client escaped it: '/' and the reserved characters
// arrive percent-encoded (RawPath set, chi's param still escaped), others
// as Go's default escaping (RawPath empty, param decoded).
func TestSecretNamesInPath(t *testing.T) {
	h, a, _, _, _ := secretsServer(t)
	names := []string{"team/db/password", "a b+c", "k:v@h;x,y=z&w$", "ünï-cödé", "100%", "q?f#frag", "x/..", "../x", "p%2fq", `back\slash`, "tab-free 'quoted' \"name\""}
	for _, name := range names {
		body, _ := json.Marshal(map[string]string{"name": name, "value": "v"})
		code, resp, _ := call(t, h, a, "POST", "/secrets", string(body))
		if code != 201 {
			t.Fatalf("create %q: %d %s", name, code, resp)
		}
		var created secretJSON
		json.Unmarshal([]byte(resp), &created)
		if created.Name != name {
			t.Fatalf("create %q: stored as %q", name, created.Name)
		}
		for _, enc := range []func(string) string{encodeURIComponent, url.PathEscape} {
			p := "/secrets/" + enc(name)
			code, resp, _ := call(t, h, a, "GET", p, "")
			var got secretJSON
			json.Unmarshal([]byte(resp), &got)
			if code != 200 || got.SecretID != created.SecretID {
				t.Fatalf("GET %s (%q): %d %s", p, name, code, resp)
			}
			if code, resp, _ := call(t, h, a, "POST", p, `{"value":"v2"}`); code != 200 {
				t.Fatalf("POST %s (%q): %d %s", p, name, code, resp)
			}
		}
		p := "/secrets/" + encodeURIComponent(name)
		if code, resp, _ := call(t, h, a, "DELETE", p, ""); code != 204 {
			t.Fatalf("DELETE %s (%q): %d %s", p, name, code, resp)
		}
		if code, _, _ := call(t, h, a, "GET", p, ""); code != 404 {
			t.Fatalf("GET %s after delete: %d", p, code)
		}
	}
}

// e2b's schema: names are lower-cased before storage and returned in that
// form; the sec_ prefix is reserved for IDs. "." and ".." cannot travel in
// a URL path. All refusals are 400s naming the field.
func TestSecretNameRules(t *testing.T) {
	h, a, _, _, _ := secretsServer(t)
	code, resp, _ := call(t, h, a, "POST", "/secrets", `{"name":"My/API-Key","value":"v"}`)
	var sec secretJSON
	json.Unmarshal([]byte(resp), &sec)
	if code != 201 || sec.Name != "my/api-key" {
		t.Fatalf("create: %d %s", code, resp)
	}
	for _, ref := range []string{"My%2FAPI-Key", "my%2Fapi-key", "MY%2FAPI-KEY"} {
		code, resp, _ := call(t, h, a, "GET", "/secrets/"+ref, "")
		if code != 200 || !strings.Contains(resp, sec.SecretID) || !strings.Contains(resp, `"name":"my/api-key"`) {
			t.Fatalf("GET %s: %d %s", ref, code, resp)
		}
	}
	if code, resp, _ := call(t, h, a, "POST", "/secrets", `{"name":"MY/api-KEY","value":"v"}`); code != 409 {
		t.Fatalf("name differing only in case: %d %s", code, resp)
	}
	for _, name := range []string{"sec_0123456789abcdef01234567", "sec_x", "SEC_x", "Sec_", ".", ".."} {
		body, _ := json.Marshal(map[string]string{"name": name, "value": "v"})
		code, resp, _ := call(t, h, a, "POST", "/secrets", string(body))
		var e errorBody
		json.Unmarshal([]byte(resp), &e)
		if code != 400 || e.Code != 400 || !strings.HasPrefix(e.Message, "invalid secret: name ") {
			t.Fatalf("create %q: %d %s", name, code, resp)
		}
	}
	// A name that is a valid ID of another secret can never shadow it.
	if code, _, _ := call(t, h, a, "GET", "/secrets/"+sec.SecretID, ""); code != 200 {
		t.Fatalf("by ID: %d", code)
	}
}
