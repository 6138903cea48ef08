package api

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/cubicle-dev/cubicle/internal/store"
	"github.com/cubicle-dev/cubicle/internal/store/sqlite"
)

// The three options shown dropped black-box (201/204 and no effect) are
// refused by name, as are unknown keys in every boundary object.
func TestMisspeltBoundaryOptionsAreRefusedByName(t *testing.T) {
	h, key := fieldsServer(t)
	for _, c := range []struct{ method, path, body, want string }{
		{"POST", "/v2/sandboxes", `{"templateID":"base","network":{"deny_out":["0.0.0.0/0"]}}`,
			`network: unknown field "deny_out": the field is "denyOut"`},
		{"POST", "/sandboxes", `{"templateID":"base","timeout":60,"allowInternetAccess":false}`,
			`unknown field "allowInternetAccess": the field is "allow_internet_access"`},
		{"PUT", "/sandboxes/abc/network", `{"allow_internet_Access":false}`,
			`network: unknown field "allow_internet_Access": the field is "`},
		{"PUT", "/sandboxes/abc/network", `{"allowInternetAccess":false,"allow_internet_access":true}`,
			`network: allow_internet_access and allowInternetAccess disagree`},
		{"PUT", "/sandboxes/abc/network", `{"allowOut":["1.1.1.1"],"ports":[80]}`,
			`network: unknown field "ports": not supported by this server (known: allowInternetAccess, allowOut, allowPublicTraffic, allow_internet_access, denyOut`},
		{"POST", "/v2/sandboxes", `{"templateID":"base","network":{"allowOut":["1.1.1.1"],"blockAll":true}}`,
			`network: unknown field "blockAll": not supported`},
		{"POST", "/v2/sandboxes", `{"templateID":"base","volumeMounts":[{"name":"v","path":"/mnt","read_only":true}]}`,
			`volumeMounts entry: unknown field "read_only": the field is "readOnly"`},
		{"POST", "/v2/sandboxes", `{"templateID":"base","volumeMounts":[{"name":"v","path":"/mnt","mode":"ro"}]}`,
			`volumeMounts entry: unknown field "mode"`},
		{"POST", "/v2/sandboxes", `{"templateID":"base","autoResume":{"enabled":true,"policy":"any"}}`,
			`autoResume: unknown field "policy"`},
		{"POST", "/sandboxes", `{"templateID":"base","lifecycle":{"onTimeout":"pause","keepMemory":false}}`,
			`lifecycle: unknown field "keepMemory"`},
		{"POST", "/sandboxes", `{"templateID":"base","lifecycle":{"on_timeout":"pause"}}`,
			`lifecycle: unknown field "on_timeout": the field is "onTimeout"`},
		{"POST", "/sandboxes", `{"templateID":"base","lifecycle":{"onTimeout":"paused"}}`,
			`lifecycle.onTimeout: "paused" is not kill or pause`},
		{"POST", "/sandboxes", `{"templateID":"base","autoPause":false,"lifecycle":{"onTimeout":"pause"}}`,
			`lifecycle.onTimeout and autoPause disagree`},
		{"POST", "/sandboxes", `{"templateID":"base","autoResume":{"enabled":false},"lifecycle":{"autoResume":true}}`,
			`lifecycle.autoResume and autoResume.enabled disagree`},
		{"POST", "/v2/sandboxes", `{"templateID":"base","accelerators":[{"class":"gpu","count":1,"memoryMB":1}]}`,
			`accelerators entry: unknown field "memoryMB": not supported by this server (known: backend, class, count, labels, minMemoryMB, vendor)`},
		// encoding/json would apply these case-insensitively; a second
		// spelling of one key is ambiguous, so it is refused too.
		{"POST", "/v2/sandboxes", `{"templateID":"base","Timeout":5}`, `unknown field "Timeout": the field is "timeout"`},
		{"POST", "/v2/sandboxes", `{"templateID":"base","auto_pause":true}`, `unknown field "auto_pause": the field is "autoPause"`},
		{"POST", "/v2/sandboxes", `{"templateID":"base","network":{"AllowOut":["1.1.1.1"]}}`, `network: unknown field "AllowOut": the field is "allowOut"`},
	} {
		code, raw, _ := call(t, h, key, c.method, c.path, c.body)
		var body errorBody
		json.Unmarshal([]byte(raw), &body)
		if code != http.StatusBadRequest || body.Code != http.StatusBadRequest || !strings.HasPrefix(body.Message, c.want) {
			t.Errorf("%s %s %s: %d %s, want 400 with %q", c.method, c.path, c.body, code, raw, c.want)
		}
	}
}

// What the pinned SDKs send decodes without a refusal, and every key of
// it is known (none is counted as unknown).
func TestSDKBodiesDecode(t *testing.T) {
	for _, b := range []string{
		// e2b JS 2.51 (docs: shared/reference/e2b-protocol.md 5.2).
		`{"templateID":"base"}`,
		`{"templateID":"base","metadata":{"k":"v"},"envVars":{"A":"1"},"timeout":120}`,
		`{"templateID":"my-tpl","metadata":{"a":"b"},"envVars":{"E":"1"},"timeout":600,"allow_internet_access":false,` +
			`"network":{"allowOut":["example.com"],"denyOut":["0.0.0.0/0"],"rules":{"api.example.com":[{"transform":{"headers":{"X-K":"v"}}}]},` +
			`"allowPublicTraffic":false,"maskRequestHost":"x.local","httpsPorts":[8443],"egressProxy":{"address":"p:1080","username":"u","password":"p"},"dnsServers":[]},` +
			`"autoPause":true,"autoPauseMemory":false,"autoResume":{"enabled":false}}`,
		`{"templateID":"base","volumeMounts":[{"name":"probe-vol","path":"/mnt/vol"}]}`,
		`{"templateID":"mcp-gateway","mcp":{"x":{}},"iam":null}`,
		// e2b Python / JS <= 2.50 (v1): secure and allow_internet_access always.
		`{"templateID":"base","timeout":300,"secure":true,"allow_internet_access":true,"metadata":{},"envVars":{}}`,
		// CubeSandbox 0.7.3: lifecycle, readOnly mounts, allow_internet_access
		// only when false, distributionScope (counted as unknown below).
		`{"templateID":"base","timeout":300,"envVars":{"A":"1"},"metadata":{"a":"b"},"allow_internet_access":false,` +
			`"network":{"allowOut":["1.1.1.1"],"denyOut":["0.0.0.0/0"],"allowPublicTraffic":false,"maskRequestHost":"h"},` +
			`"lifecycle":{"onTimeout":"pause","autoResume":true},"volumeMounts":[{"name":"v","path":"/mnt","readOnly":true}],"mcp":null}`,
		// Cubicle: accelerators.
		`{"templateID":"base","timeout":300,"volumeMounts":[{"name":"v","path":"/mnt","readOnly":true}],"accelerators":[{"class":"gpu","count":1,"labels":{"a":"b"},"minMemoryMB":1024,"vendor":"nvidia"}]}`,
	} {
		var req newSandbox
		unknown, msg := decodeBody([]byte(b), &req, false)
		if msg != "" || len(unknown) > 0 {
			t.Errorf("%s: %q, unknown %v", b, msg, unknown)
			continue
		}
		if _, msg := req.options(true); msg != "" {
			t.Errorf("%s: options: %s", b, msg)
		}
	}
	for b, allow := range map[string]bool{
		// e2b JS and Python.
		`{"allowOut":["1.1.1.1"],"allow_internet_access":true,"denyOut":[],"egressProxy":null,"rules":null,"dnsServers":null}`: true,
		// CubeSandbox's update_network(allow_internet_access=False).
		`{"allowOut":["1.1.1.1"],"allowInternetAccess":false}`: false,
	} {
		var up networkUpdate
		if msg := decodeJSON([]byte(b), &up, false); msg != "" {
			t.Errorf("%s: %s", b, msg)
			continue
		}
		if n, msg := up.network(); msg != "" || n.AllowInternet != allow {
			t.Errorf("%s: %q allowInternet %v, want %v", b, msg, n.AllowInternet, allow)
		}
	}
	// The lifecycle object sets what autoPause/autoResume do.
	var req newSandbox
	if msg := decodeJSON([]byte(`{"templateID":"base","lifecycle":{"onTimeout":"pause","autoResume":true}}`), &req, false); msg != "" {
		t.Fatal(msg)
	}
	if o, msg := req.options(false); msg != "" || !o.AutoPause || !o.AutoResume {
		t.Errorf("lifecycle: %q autoPause %v autoResume %v", msg, o.AutoPause, o.AutoResume)
	}
}

// An unknown top-level key a newer SDK might send is accepted, counted per
// name and logged once per name; names past the budget share one label.
func TestUnknownTopLevelFieldsAreCountedAndLoggedOnce(t *testing.T) {
	var logs bytes.Buffer
	u := &unknownFields{seen: map[string]bool{}, counter: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "x"}, []string{"route", "field"})}
	logf := func(name string) { logs.WriteString(name + "\n") }
	var req newSandbox
	unknown, msg := decodeBody([]byte(`{"templateID":"base","futureOption":{"a":1},"distributionScope":["n1"]}`), &req, false)
	if msg != "" || strings.Join(unknown, ",") != "distributionScope,futureOption" || *req.TemplateID != "base" {
		t.Fatalf("got %q %v", msg, unknown)
	}
	for range 3 {
		u.note("POST /v2/sandboxes", unknown, logf)
	}
	if got := testutil.ToFloat64(u.counter.WithLabelValues("POST /v2/sandboxes", "futureOption")); got != 3 {
		t.Errorf("futureOption counted %v times, want 3", got)
	}
	if logs.String() != "distributionScope\nfutureOption\n" {
		t.Errorf("logged %q, want each name once", logs.String())
	}
	for i := range 200 {
		u.note("r", []string{fmt.Sprintf("f%03d", i) + strings.Repeat("x", i)}, logf)
	}
	if n := testutil.CollectAndCount(u.counter); n > maxUnknownNames+2 {
		t.Errorf("%d label sets after 200 distinct names, want at most %d", n, maxUnknownNames+2)
	}
	if got := testutil.ToFloat64(u.counter.WithLabelValues("r", "_other")); got == 0 {
		t.Errorf("names past the budget were not counted as _other")
	}
}

// fieldsServer is the real router over a real SQLite store with one team's
// key; the refusals under test happen before the sandbox manager is used.
func fieldsServer(t *testing.T) (http.Handler, string) {
	t.Helper()
	st, err := sqlite.Open(filepath.Join(t.TempDir(), "c.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	ctx := context.Background()
	if err := st.CreateTeam(ctx, &store.Team{ID: "t_a", Name: "a"}); err != nil {
		t.Fatal(err)
	}
	key := "e2b_cccccccccccccccc"
	if err := st.CreateAPIKey(ctx, &store.APIKey{ID: "ka", TeamID: "t_a", Name: "a", Hash: HashKey(key)}); err != nil {
		t.Fatal(err)
	}
	srv := New(Config{Logger: slog.New(slog.NewTextHandler(&bytes.Buffer{}, nil))}, nil, st)
	return srv.router, key
}
