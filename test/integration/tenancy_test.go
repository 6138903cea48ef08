package integration

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/cubicle-dev/cubicle/sdk/go/envd/process"
	"github.com/cubicle-dev/cubicle/sdk/go/envd/process/processconnect"
)

// cli runs the cubicle CLI against the server's data dir, as an operator
// does while it serves.
func (s *server) cli(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command(filepath.Join(binDir, "cubicle"), append(args, "--data-dir", s.DataDir)...).CombinedOutput()
	if err != nil {
		t.Fatalf("cubicle %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return strings.TrimSpace(string(out))
}

// as is the same server seen with another API key.
func (s *server) as(t *testing.T, key string) *server {
	c := *s
	c.t, c.Key = t, key
	return &c
}

type apiErr struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

// notFoundLikeMissing asserts that path (naming another team's object) is a
// 404 whose body is the one the same route gives for an ID that never
// existed, so the answer confirms nothing.
func notFoundLikeMissing(t *testing.T, s *server, method, path, realID, fakeID string, body any) {
	t.Helper()
	st, _, got := s.raw(method, path, body)
	wst, _, want := s.raw(method, strings.ReplaceAll(path, realID, fakeID), body)
	if st != http.StatusNotFound || wst != http.StatusNotFound {
		t.Fatalf("%s %s: want 404 like a missing object, got %d (missing: %d) %s", method, path, st, wst, got)
	}
	if strings.ReplaceAll(string(got), realID, fakeID) != string(want) {
		t.Fatalf("%s %s: body differs from a missing object's:\n%s\n%s", method, path, got, want)
	}
	var e apiErr
	if json.Unmarshal(got, &e) != nil || e.Code != 404 || e.Message == "" {
		t.Fatalf("%s %s: not an e2b error body: %s", method, path, got)
	}
}

func wantStatus(t *testing.T, s *server, method, path string, body any, want int) apiErr {
	t.Helper()
	st, _, b := s.raw(method, path, body)
	var e apiErr
	json.Unmarshal(b, &e)
	if st != want || (want >= 400 && (e.Code != want || e.Message == "")) {
		t.Fatalf("%s %s: want %d, got %d %s", method, path, want, st, b)
	}
	return e
}

func listedSandboxIDs(t *testing.T, s *server, path string) []string {
	t.Helper()
	var list []map[string]any
	if st := s.do("GET", path, nil, &list); st != 200 {
		t.Fatalf("GET %s: %d", path, st)
	}
	var ids []string
	for _, sb := range list {
		ids = append(ids, sb["sandboxID"].(string))
	}
	return ids
}

func killOnCleanup(t *testing.T, s *server, id string) {
	t.Cleanup(func() { s.do("DELETE", "/sandboxes/"+id, nil, nil) })
}

// Team B's key gets 404 for everything of team A's, through every route,
// and sees only its own objects in lists.
func TestTenancyIsolation(t *testing.T) {
	s := startServer(t, "--max-sandbox-cpu", "4", "--max-sandbox-memory-mb", "2048")
	a := s // the default team's admin key (cubicle apikey create)
	s.cli(t, "team", "create", "bravo")
	b := s.as(t, s.cli(t, "apikey", "create", "--team", "bravo"))

	// Team A's objects: a sandbox, a volume, a ready template.
	sa := a.create(map[string]any{"templateID": "base", "timeout": 300})
	var va map[string]any
	if st := a.do("POST", "/volumes", map[string]any{"name": "data"}, &va); st != 201 || va["volumeID"] != "data" {
		t.Fatalf("A's volume: %d %v", st, va)
	}
	tpl, bst, logs := a.buildTemplate(t, "app", map[string]any{"fromTemplate": "base"})
	if bst.Status != "ready" {
		t.Fatalf("A's template: %+v %v", bst, logs)
	}

	const fakeSandbox = "zzzzzzzzzzzzzzzzzzzz"
	t.Run("sandboxes", func(t *testing.T) {
		b := b.as(t, b.Key)
		if ids := listedSandboxIDs(t, b, "/v2/sandboxes"); len(ids) != 0 {
			t.Fatalf("B lists A's sandboxes: %v", ids)
		}
		if ids := listedSandboxIDs(t, b, "/sandboxes"); len(ids) != 0 {
			t.Fatalf("B lists A's sandboxes (v1): %v", ids)
		}
		b.do("GET", "/v2/sandboxes", nil, nil)
		if b.lastHeader.Get("X-Total-Running") != "0" {
			t.Fatalf("X-Total-Running counts other teams: %s", b.lastHeader.Get("X-Total-Running"))
		}
		id := sa.SandboxID
		for _, r := range []struct {
			method, path string
			body         any
		}{
			{"GET", "/sandboxes/" + id, nil},
			{"POST", "/sandboxes/" + id + "/timeout", map[string]any{"timeout": 1}},
			{"POST", "/sandboxes/" + id + "/refreshes", map[string]any{"duration": 10}},
			{"POST", "/sandboxes/" + id + "/pause", nil},
			{"POST", "/sandboxes/" + id + "/resume", map[string]any{"timeout": 10}},
			{"POST", "/sandboxes/" + id + "/connect", map[string]any{"timeout": 10}},
			{"POST", "/v2/sandboxes/" + id + "/connect", map[string]any{"timeout": 10}},
			{"PUT", "/sandboxes/" + id + "/network", map[string]any{"denyOut": []string{"0.0.0.0/0"}}},
			{"GET", "/sandboxes/" + id + "/logs", nil},
			{"GET", "/v2/sandboxes/" + id + "/logs", nil},
			{"GET", "/sandboxes/" + id + "/metrics", nil},
			{"DELETE", "/sandboxes/" + id, nil},
		} {
			notFoundLikeMissing(t, b, r.method, r.path, id, fakeSandbox, r.body)
		}
		var m struct {
			Sandboxes map[string]any `json:"sandboxes"`
		}
		if st := b.do("GET", "/sandboxes/metrics?sandbox_ids="+id, nil, &m); st != 200 || len(m.Sandboxes) != 0 {
			t.Fatalf("B reads A's metrics: %d %v", st, m)
		}
		// envd through the proxy with A's sandbox ID and B's key: the
		// proxy routes by ID, but the agent wants A's access token, which
		// B cannot get (GET /sandboxes/{id} was a 404 above).
		pc := processconnect.NewProcessClient(&http.Client{Transport: keyTransport{headerTransport{id: id}, b.Key}}, b.URL, connect.WithProtoJSON())
		stdin := false
		stream, err := pc.Start(t.Context(), connect.NewRequest(&process.StartRequest{Process: &process.ProcessConfig{Cmd: "/bin/true"}, Stdin: &stdin}))
		if err == nil {
			for stream.Receive() {
				if stream.Msg().GetEvent().GetStart() != nil {
					t.Fatal("B started a process in A's sandbox")
				}
			}
			err = stream.Err()
			stream.Close()
		}
		if err == nil || connect.CodeOf(err) != connect.CodeUnauthenticated {
			t.Fatalf("envd with A's sandbox ID and B's key: want unauthenticated, got %v", err)
		}
		// None of it touched A's sandbox.
		var got map[string]any
		if st := a.do("GET", "/sandboxes/"+id, nil, &got); st != 200 || got["state"] != "running" {
			t.Fatalf("A's sandbox after B's attempts: %d %v", st, got)
		}
		if out := a.mustRun(sa, "echo ok"); strings.TrimSpace(out) != "ok" {
			t.Fatalf("A's sandbox: %q", out)
		}
	})

	t.Run("volumes", func(t *testing.T) {
		b := b.as(t, b.Key)
		var list []map[string]any
		if st := b.do("GET", "/volumes", nil, &list); st != 200 || len(list) != 0 {
			t.Fatalf("B lists A's volumes: %d %v", st, list)
		}
		notFoundLikeMissing(t, b, "GET", "/volumes/data", "data", "nosuchvolume", nil)
		notFoundLikeMissing(t, b, "DELETE", "/volumes/data", "data", "nosuchvolume", nil)
		// Mounting A's volume by name is mounting a volume B does not have.
		e := wantStatus(t, b, "POST", "/v2/sandboxes", map[string]any{"templateID": "base", "volumeMounts": []any{map[string]any{"name": "data", "path": "/data"}}}, 400)
		if !strings.Contains(e.Message, "'data' not found") {
			t.Fatalf("mount of A's volume: %+v", e)
		}
		// Names are per team: B gets its own "data", under another ID.
		var vb map[string]any
		if st := b.do("POST", "/volumes", map[string]any{"name": "data"}, &vb); st != 201 || vb["volumeID"] == "data" || vb["name"] != "data" {
			t.Fatalf("B's volume data: %d %v", st, vb)
		}
		t.Cleanup(func() { b.do("DELETE", "/volumes/"+vb["volumeID"].(string), nil, nil) })
		// A sandbox of B's reports its mount by the volume's name, as e2b
		// does, not by the ID (which differs from the name in every team
		// but the default one).
		var sbB map[string]any
		if st := b.do("POST", "/v2/sandboxes", map[string]any{"templateID": "base", "volumeMounts": []any{map[string]any{"name": "data", "path": "/data"}}}, &sbB); st != 201 {
			t.Fatalf("B's sandbox with its volume: %d %v", st, sbB)
		}
		sbBID := sbB["sandboxID"].(string)
		var info map[string]any
		if st := b.do("GET", "/sandboxes/"+sbBID, nil, &info); st != 200 {
			t.Fatalf("get B's sandbox: %d", st)
		}
		var listedB []map[string]any
		if st := b.do("GET", "/v2/sandboxes", nil, &listedB); st != 200 {
			t.Fatalf("list B's sandboxes: %d", st)
		}
		for _, got := range append([]map[string]any{info}, listedB...) {
			if got["sandboxID"] != sbBID {
				continue
			}
			if vm := fmt.Sprint(got["volumeMounts"]); vm != "[map[name:data path:/data]]" {
				t.Fatalf("B's sandbox reports its mounts as %s, want the volume's name", vm)
			}
		}
		if st := b.do("DELETE", "/sandboxes/"+sbBID, nil, nil); st != 204 {
			t.Fatalf("kill B's sandbox: %d", st)
		}
		// Volume content authenticates with the volume's own token: B's
		// token does not open A's volume.
		req, _ := http.NewRequest("GET", s.URL+"/volumecontent/data/dir?path=/", nil)
		req.Header.Set("Authorization", "Bearer "+vb["token"].(string))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 401 && resp.StatusCode != 404 {
			t.Fatalf("B's volume token on A's volume: %d", resp.StatusCode)
		}
		if st := a.do("GET", "/volumes/data", nil, &va); st != 200 {
			t.Fatalf("A's volume: %d", st)
		}
	})

	t.Run("templates", func(t *testing.T) {
		b := b.as(t, b.Key)
		var list []map[string]any
		if st := b.do("GET", "/templates", nil, &list); st != 200 {
			t.Fatalf("list: %d", st)
		}
		for _, x := range list {
			if x["templateID"] != "base" && x["templateID"] != "code-interpreter-v1" {
				t.Fatalf("B lists a template that is neither its own nor public: %v", x)
			}
		}
		id, bid := tpl.TemplateID, tpl.BuildID
		const fakeTpl, fakeBuild = "tpl_ffffffff", "bld_ffffffff"
		hash := strings.Repeat("ab", 32)
		for _, r := range []struct {
			method, path string
			body         any
		}{
			{"GET", "/templates/" + id, nil},
			{"GET", "/templates/aliases/app", nil},
			{"GET", "/templates/" + id + "/builds/" + bid + "/status", nil},
			{"GET", "/templates/" + id + "/builds/" + bid + "/logs", nil},
			{"POST", "/v2/templates/" + id + "/builds/" + bid, map[string]any{"fromTemplate": "base"}},
			{"GET", "/templates/" + id + "/tags", nil},
			{"GET", "/templates/" + id + "/pool", nil},
			{"PUT", "/templates/" + id + "/pool", map[string]any{"size": 1}},
			{"GET", "/templates/" + id + "/files/" + hash, nil},
			{"PATCH", "/templates/" + id, map[string]any{"public": true}},
			{"PATCH", "/v2/templates/" + id, map[string]any{"public": true}},
			{"DELETE", "/templates/" + id + "?force=true", nil},
		} {
			p := strings.ReplaceAll(r.path, "aliases/app", "aliases/"+id)
			notFoundLikeMissing(t, b, r.method, p, id, fakeTpl, r.body)
		}
		notFoundLikeMissing(t, b, "GET", "/templates/"+id+"/builds/"+bid+"/status", bid, fakeBuild, nil)
		wantStatus(t, b, "GET", "/templates/aliases/app", nil, 404)
		wantStatus(t, b, "POST", "/templates/tags", map[string]any{"target": "app", "tags": []string{"x"}}, 404)
		wantStatus(t, b, "DELETE", "/templates/tags", map[string]any{"name": "app", "tags": []string{"x"}}, 404)
		// Sandbox create by A's name or ID: not found for B.
		wantStatus(t, b, "POST", "/v2/sandboxes", map[string]any{"templateID": "app"}, 404)
		wantStatus(t, b, "POST", "/v2/sandboxes", map[string]any{"templateID": id}, 404)
		// B's own "app" is another template; A's is untouched.
		var mine tplCreated
		if st := b.do("POST", "/v3/templates", map[string]any{"name": "app"}, &mine); st != 202 || mine.TemplateID == id {
			t.Fatalf("B's app: %d %+v", st, mine)
		}
		var again map[string]any
		if st := a.do("GET", "/templates/aliases/app", nil, &again); st != 200 || again["templateID"] != id {
			t.Fatalf("A's app after B's: %d %v", st, again)
		}
		// An Idempotency-Key is per team too.
		for _, k := range []*server{a, b} {
			req, _ := http.NewRequest("POST", s.URL+"/v3/templates", strings.NewReader(`{"name":"idem"}`))
			req.Header.Set("X-API-Key", k.Key)
			req.Header.Set("Idempotency-Key", "same-key")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != 202 {
				t.Fatalf("idempotent create: %d", resp.StatusCode)
			}
		}
		var bl []map[string]any
		b.do("GET", "/templates", nil, &bl)
		for _, x := range bl {
			if x["templateID"] != "base" && x["templateID"] != "code-interpreter-v1" &&
				!strings.Contains(fmt.Sprint(x["names"]), "app") && !strings.Contains(fmt.Sprint(x["names"]), "idem") {
				t.Fatalf("B's list: %v", x)
			}
		}

		// base and the built-ins: visible, read-only to a non-admin.
		wantStatus(t, b, "GET", "/templates/base", nil, 200)
		wantStatus(t, b, "DELETE", "/templates/base", nil, 403)
		wantStatus(t, b, "DELETE", "/templates/base?force=true", nil, 403)
		wantStatus(t, b, "PUT", "/templates/base/pool", map[string]any{"size": 1}, 403)
		wantStatus(t, b, "PATCH", "/templates/base", map[string]any{"public": false}, 403)
		wantStatus(t, b, "POST", "/templates/tags", map[string]any{"target": "base", "tags": []string{"mine"}}, 403)
		wantStatus(t, b, "POST", "/v2/templates/base/builds/bld_base", map[string]any{"fromTemplate": "base"}, 403)
		wantStatus(t, b, "POST", "/v3/templates", map[string]any{"name": "base"}, 409)
		wantStatus(t, b, "POST", "/v3/templates", map[string]any{"name": "code-interpreter"}, 409)
		// A non-admin does not publish.
		wantStatus(t, b, "PATCH", "/templates/"+mine.TemplateID, map[string]any{"public": true}, 403)
		// The base template is still there for everyone.
		sbB := b.create(map[string]any{"templateID": "base"})
		killOnCleanup(t, b, sbB.SandboxID)
		if ids := listedSandboxIDs(t, b, "/v2/sandboxes"); len(ids) != 1 || ids[0] != sbB.SandboxID {
			t.Fatalf("B's list: %v", ids)
		}
		if ids := listedSandboxIDs(t, a, "/v2/sandboxes"); strings.Contains(strings.Join(ids, ","), sbB.SandboxID) {
			t.Fatalf("A lists B's sandbox: %v", ids)
		}
		notFoundLikeMissing(t, a, "GET", "/sandboxes/"+sbB.SandboxID, sbB.SandboxID, fakeSandbox, nil)
		b.do("DELETE", "/sandboxes/"+sbB.SandboxID, nil, nil)
	})

	t.Run("build contexts are per team", func(t *testing.T) {
		b := b.as(t, b.Key)
		var mine tplCreated
		if st := b.do("POST", "/v3/templates", map[string]any{"name": "ctx"}, &mine); st != 202 {
			t.Fatalf("B's template: %d", st)
		}
		hash := strings.Repeat("cd", 32)
		upload := func(k *server, tplID string, body []byte) map[string]any {
			var f map[string]any
			if st := k.do("GET", "/templates/"+tplID+"/files/"+hash, nil, &f); st != 201 {
				t.Fatalf("files: %d", st)
			}
			if f["present"] == true {
				return f
			}
			req, _ := http.NewRequest("PUT", f["url"].(string), bytes.NewReader(body))
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != 201 {
				t.Fatalf("upload: %d", resp.StatusCode)
			}
			return f
		}
		if f := upload(a, tpl.TemplateID, tarGz(t, map[string]string{"x": "team A"})); f["present"] == true {
			t.Fatal("A's hash was present before any upload")
		}
		var f map[string]any
		a.do("GET", "/templates/"+tpl.TemplateID+"/files/"+hash, nil, &f)
		if f["present"] != true {
			t.Fatalf("A's own upload is not present for A: %v", f)
		}
		// The same hash is absent for B, and B's different bytes are not a conflict.
		if f := upload(b, mine.TemplateID, tarGz(t, map[string]string{"x": "team B"})); f["present"] == true {
			t.Fatal("A's upload counts as present for B")
		}
		// Contexts are for templates the key may change: not for base.
		wantStatus(t, b, "GET", "/templates/base/files/"+hash, nil, 403)
	})

	t.Run("shared resources are admin-only", func(t *testing.T) {
		b := b.as(t, b.Key)
		for _, r := range [][2]string{{"GET", "/images"}, {"POST", "/images?ref=x:1"}, {"DELETE", "/images?ref=x:1"},
			{"GET", "/nodes"}, {"GET", "/nodes/local/accelerators"}, {"POST", "/nodes/local/accelerators/gpu0/disable"}} {
			wantStatus(t, b, r[0], r[1], nil, 403)
		}
		wantStatus(t, a, "GET", "/images", nil, 200)
		wantStatus(t, a, "GET", "/nodes", nil, 200)
	})

	t.Run("GET /teams answers for the key's team", func(t *testing.T) {
		var teams []map[string]any
		if st := b.do("GET", "/teams", nil, &teams); st != 200 || len(teams) != 1 {
			t.Fatalf("teams: %d %v", st, teams)
		}
		tm := teams[0]
		if tm["name"] != "bravo" || !strings.HasPrefix(tm["teamID"].(string), "team_") || tm["apiKey"] != b.Key || tm["isDefault"] != true {
			t.Fatalf("team: %v", tm)
		}
		// The e2b CLI sends its token as a bearer.
		req, _ := http.NewRequest("GET", s.URL+"/teams", nil)
		req.Header.Set("Authorization", "Bearer "+a.Key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var at []map[string]any
		json.NewDecoder(resp.Body).Decode(&at)
		if resp.StatusCode != 200 || len(at) != 1 || at[0]["teamID"] != "default" {
			t.Fatalf("default team: %d %v", resp.StatusCode, at)
		}
	})

	t.Run("revocation takes effect at once", func(t *testing.T) {
		c := s.as(t, s.cli(t, "apikey", "create", "--team", "bravo", "--name", "short-lived"))
		wantStatus(t, c, "GET", "/v2/sandboxes", nil, 200)
		var id string
		for _, line := range strings.Split(s.cli(t, "apikey", "list", "--team", "bravo"), "\n") {
			if strings.Contains(line, "short-lived") {
				id = strings.Fields(line)[0]
			}
		}
		s.cli(t, "apikey", "revoke", id)
		wantStatus(t, c, "GET", "/v2/sandboxes", nil, 401)
		wantStatus(t, b, "GET", "/v2/sandboxes", nil, 200) // the team's other key still works
	})
}

// keyTransport adds an API key to the envd headers (a confused client).
type keyTransport struct {
	headerTransport
	key string
}

func (k keyTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("X-API-Key", k.key)
	return k.headerTransport.RoundTrip(r)
}

// Quotas: 429 with Retry-After and an e2b body naming the quota; the server
// maxima: 400 naming the field; the image cap: 413.
func TestTenancyQuotasAndCaps(t *testing.T) {
	s := startServer(t, "--max-sandbox-cpu", "4", "--max-sandbox-memory-mb", "2048", "--max-sandbox-disk-mb", "4096", "--max-image-bytes", "4096")
	s.cli(t, "team", "create", "quota", "--max-sandboxes", "1", "--max-volumes", "1")
	q := s.as(t, s.cli(t, "apikey", "create", "--team", "quota"))

	quota := func(method, path string, body any, want string) {
		t.Helper()
		st, h, raw := q.raw(method, path, body)
		var e apiErr
		json.Unmarshal(raw, &e)
		if st != 429 || e.Code != 429 || e.Message != want || h.Get("Retry-After") == "" {
			t.Fatalf("%s %s: want 429 %q with Retry-After, got %d %s (Retry-After %q)", method, path, want, st, raw, h.Get("Retry-After"))
		}
	}
	first := q.create(map[string]any{"templateID": "base"})
	killOnCleanup(t, q, first.SandboxID)
	quota("POST", "/v2/sandboxes", map[string]any{"templateID": "base"}, "team quota exceeded: concurrent sandboxes (1)")
	// Other teams are not held to it.
	other := s.create(map[string]any{"templateID": "base"})
	killOnCleanup(t, s, other.SandboxID)
	// A killed sandbox gives its share back at once.
	if st := q.do("DELETE", "/sandboxes/"+first.SandboxID, nil, nil); st != 204 {
		t.Fatalf("kill: %d", st)
	}
	second := q.create(map[string]any{"templateID": "base"})
	killOnCleanup(t, q, second.SandboxID)
	q.do("DELETE", "/sandboxes/"+second.SandboxID, nil, nil)

	// Size quotas (base is 2 vCPUs, 256 MiB here); updates apply to the next create.
	s.cli(t, "team", "update", "quota", "--max-sandboxes", "0", "--max-vcpus", "1")
	quota("POST", "/v2/sandboxes", map[string]any{"templateID": "base"}, "team quota exceeded: vCPUs (1)")
	s.cli(t, "team", "update", "quota", "--max-vcpus", "0", "--max-memory-mb", "128")
	quota("POST", "/v2/sandboxes", map[string]any{"templateID": "base"}, "team quota exceeded: memory MiB (128)")
	s.cli(t, "team", "update", "quota", "--max-memory-mb", "0", "--max-disk-mb", "10")
	quota("POST", "/v2/sandboxes", map[string]any{"templateID": "base"}, "team quota exceeded: disk MiB (10)")

	if st := q.do("POST", "/volumes", map[string]any{"name": "one"}, nil); st != 201 {
		t.Fatalf("first volume: %d", st)
	}
	t.Cleanup(func() { q.do("DELETE", "/volumes/one", nil, nil) })
	quota("POST", "/volumes", map[string]any{"name": "two"}, "team quota exceeded: volumes (1)")

	// Server maxima: a template may not ask for more than one sandbox may have.
	for _, c := range []struct {
		body map[string]any
		want string
	}{
		{map[string]any{"name": "huge", "cpuCount": 64}, "cpuCount 64 exceeds the server maximum of 4"},
		{map[string]any{"name": "huge", "memoryMB": 1048576}, "memoryMB 1048576 exceeds the server maximum of 2048"},
		{map[string]any{"name": "huge", "minFreeDiskMb": 100000}, "minFreeDiskMb 100000 exceeds the server maximum of 4096"},
	} {
		e := wantStatus(t, q, "POST", "/v3/templates", c.body, 400)
		if !strings.Contains(e.Message, c.want) {
			t.Fatalf("%v: %q, want it to name %q", c.body, e.Message, c.want)
		}
	}
	wantStatus(t, q, "POST", "/v3/templates", map[string]any{"name": "fits", "cpuCount": 4, "memoryMB": 2048}, 202)

	// Image imports: admin-only and capped (413 with an e2b body).
	req, _ := http.NewRequest("POST", s.URL+"/images?ref=big:1", bytes.NewReader(make([]byte, 8192)))
	req.Header.Set("X-API-Key", s.Key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var e apiErr
	json.NewDecoder(resp.Body).Decode(&e)
	resp.Body.Close()
	if resp.StatusCode != 413 || e.Code != 413 || !strings.Contains(e.Message, "4096") {
		t.Fatalf("oversized image: %d %+v", resp.StatusCode, e)
	}
	// Without a Content-Length the cap still holds.
	pr, pw := io.Pipe()
	go func() { pw.Write(make([]byte, 8192)); pw.Close() }()
	req, _ = http.NewRequest("POST", s.URL+"/images?ref=big:1", pr)
	req.Header.Set("X-API-Key", s.Key)
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 413 {
		t.Fatalf("oversized chunked image: %d", resp.StatusCode)
	}
}

// An install from before teams keeps working: the data dir's key is the
// default team's admin, and the server restarts onto the migrated store.
func TestTenancyRestartKeepsOwnership(t *testing.T) {
	s := startServer(t)
	s.cli(t, "team", "create", "keep")
	k := s.as(t, s.cli(t, "apikey", "create", "--team", "keep"))
	sb := k.create(map[string]any{"templateID": "base", "timeout": 120})
	killOnCleanup(t, k, sb.SandboxID)
	s.stop(syscall.SIGTERM)
	s.start()
	time.Sleep(200 * time.Millisecond)
	if ids := listedSandboxIDs(t, k, "/v2/sandboxes"); len(ids) != 1 || ids[0] != sb.SandboxID {
		t.Fatalf("after restart B lists %v", ids)
	}
	notFoundLikeMissing(t, s, "GET", "/sandboxes/"+sb.SandboxID, sb.SandboxID, "zzzzzzzzzzzzzzzzzzzz", nil)
}

// A warm pool of a public template serves every team: a claim moves the
// standby into the claiming team (under its quota), and teams that only see
// the template never learn standby IDs.
func TestTenancyPublicPool(t *testing.T) {
	s := startServer(t)
	s.cli(t, "team", "create", "pooler", "--max-sandboxes", "1")
	b := s.as(t, s.cli(t, "apikey", "create", "--team", "pooler"))
	s.setPool(t, "base", 1)
	t.Cleanup(func() {
		// Retired standbys must be gone before the harness checks for leftovers.
		s.setPool(t, "base", 0)
		s.waitPool(t, "base", "the pool drained", func(p poolState) bool { return p.Ready == 0 })
		time.Sleep(500 * time.Millisecond)
	})
	standby := s.waitPool(t, "base", "one standby", func(p poolState) bool { return p.Ready == 1 }).Standbys[0]
	if p := b.pool(t, "base"); p.Ready != 1 || len(p.Standbys) != 0 {
		t.Fatalf("B sees the pool of base as %+v", p)
	}
	c := b.create(map[string]any{"templateID": "base"})
	killOnCleanup(t, b, c.SandboxID)
	if c.SandboxID != standby {
		t.Fatalf("B's create booted %s instead of claiming standby %s", c.SandboxID, standby)
	}
	if ids := listedSandboxIDs(t, b, "/v2/sandboxes"); len(ids) != 1 || ids[0] != c.SandboxID {
		t.Fatalf("B lists %v", ids)
	}
	notFoundLikeMissing(t, s, "GET", "/sandboxes/"+c.SandboxID, c.SandboxID, "zzzzzzzzzzzzzzzzzzzz", nil)
	if out := b.mustRun(c, "echo claimed"); strings.TrimSpace(out) != "claimed" {
		t.Fatalf("claimed sandbox: %q", out)
	}
	// At its quota, B neither claims the refilled standby nor boots.
	s.waitPool(t, "base", "a refill", func(p poolState) bool { return p.Ready == 1 })
	st, h, raw := b.raw("POST", "/v2/sandboxes", map[string]any{"templateID": "base"})
	if st != 429 || h.Get("Retry-After") == "" || !strings.Contains(string(raw), "team quota exceeded: concurrent sandboxes (1)") {
		t.Fatalf("create over quota with a standby idle: %d %s", st, raw)
	}
	if p := s.pool(t, "base"); p.Ready != 1 {
		t.Fatalf("the refused create took the standby: %+v", p)
	}
}
