package integration

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/cubicle-dev/cubicle/internal/testenv"
)

func requireBuildkit(t *testing.T) {
	t.Helper()
	if _, err := os.Stat(filepath.Join(binDir, "buildkitd")); err != nil {
		testenv.Skip(t, "buildkitd not built (make build)")
	}
}

type tplCreated struct {
	TemplateID string   `json:"templateID"`
	BuildID    string   `json:"buildID"`
	Names      []string `json:"names"`
	Tags       []string `json:"tags"`
}

type buildStatus struct {
	Status     string `json:"status"`
	LogEntries []struct {
		Message string `json:"message"`
		Level   string `json:"level"`
		Step    string `json:"step"`
	} `json:"logEntries"`
	Reason *struct {
		Message string `json:"message"`
		Step    string `json:"step"`
	} `json:"reason"`
}

// buildTemplate runs the SDK's sequence and waits for the end state.
func (s *server) buildTemplate(t *testing.T, name string, start map[string]any) (tplCreated, buildStatus, []string) {
	t.Helper()
	var c tplCreated
	if st := s.do("POST", "/v3/templates", map[string]any{"name": name, "cpuCount": 1, "memoryMB": 256}, &c); st != http.StatusAccepted {
		t.Fatalf("create template %s: %d", name, st)
	}
	if st := s.do("POST", "/v2/templates/"+c.TemplateID+"/builds/"+c.BuildID, start, nil); st != http.StatusAccepted {
		t.Fatalf("start build: %d; logs:\n%s", st, s.logs)
	}
	st, logs := s.waitBuild(t, c)
	return c, st, logs
}

func (s *server) waitBuild(t *testing.T, c tplCreated) (buildStatus, []string) {
	t.Helper()
	var logs []string
	offset := 0
	deadline := time.Now().Add(5 * time.Minute)
	for time.Now().Before(deadline) {
		var st buildStatus
		if code := s.do("GET", fmt.Sprintf("/templates/%s/builds/%s/status?logsOffset=%d", c.TemplateID, c.BuildID, offset), nil, &st); code != 200 {
			t.Fatalf("status: %d", code)
		}
		offset += len(st.LogEntries)
		for _, e := range st.LogEntries {
			logs = append(logs, e.Message)
		}
		if st.Status == "ready" || st.Status == "error" {
			return st, logs
		}
		if st.Status != "building" && st.Status != "waiting" {
			t.Fatalf("status %q is not in the SDK's enum", st.Status)
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatal("build did not finish")
	return buildStatus{}, nil
}

func TestTemplateCatalogRoutes(t *testing.T) {
	s := startServer(t)
	var list []map[string]any
	// The built-in templates: base, and the code interpreter's layer above it.
	if st := s.do("GET", "/templates", nil, &list); st != 200 || len(list) != 2 || list[0]["templateID"] != "base" || list[0]["buildStatus"] != "ready" ||
		list[1]["templateID"] != "code-interpreter-v1" || list[1]["buildStatus"] != "ready" {
		t.Fatalf("GET /templates: %d %v", st, list)
	}
	for _, k := range []string{"templateID", "buildID", "cpuCount", "memoryMB", "diskSizeMB", "public", "aliases", "names", "createdAt", "updatedAt", "createdBy", "lastSpawnedAt", "spawnCount", "buildCount", "envdVersion", "buildStatus"} {
		if _, ok := list[0][k]; !ok {
			t.Fatalf("template JSON lacks %s: %v", k, list[0])
		}
	}
	// Create, idempotency replay, naming rules.
	var a, a2 tplCreated
	body := map[string]any{"name": "my-tpl:v1", "tags": []string{"stable"}}
	req := func(out any, key string) int {
		b := `{"name":"my-tpl:v1","tags":["stable"]}`
		r, _ := http.NewRequest("POST", s.URL+"/v3/templates", strings.NewReader(b))
		r.Header.Set("X-API-Key", s.Key)
		r.Header.Set("Idempotency-Key", key)
		resp, err := http.DefaultClient.Do(r)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if out != nil {
			jsonDecode(t, resp, out)
		}
		return resp.StatusCode
	}
	_ = body
	if st := req(&a, "k-1"); st != 202 || !strings.HasPrefix(a.TemplateID, "tpl_") || len(a.TemplateID) != 12 || uuid.Validate(a.BuildID) != nil {
		t.Fatalf("create: %d %+v", st, a)
	}
	if strings.Join(a.Tags, ",") != "v1,stable" || strings.Join(a.Names, ",") != "my-tpl,my-tpl:v1,my-tpl:stable" {
		t.Fatalf("tags/names: %+v", a)
	}
	if st := req(&a2, "k-1"); st != 202 || a2.TemplateID != a.TemplateID || a2.BuildID != a.BuildID {
		t.Fatalf("idempotent replay: %d %+v vs %+v", st, a2, a)
	}
	errShape(t, s, "POST", "/v3/templates", map[string]any{"name": "Bad Name"}, 400)
	errShape(t, s, "POST", "/v3/templates", map[string]any{"name": "x:a:b"}, 400)
	errShape(t, s, "POST", "/v3/templates", map[string]any{}, 400)
	errShape(t, s, "POST", "/v3/templates", map[string]any{"name": "base"}, 409)
	errShape(t, s, "POST", "/v3/templates", map[string]any{"name": "m", "cpuCount": 0}, 400)
	// Routes around one template.
	var got map[string]any
	if st := s.do("GET", "/templates/"+a.TemplateID, nil, &got); st != 200 || len(got["builds"].([]any)) != 1 || got["buildStatus"] != "waiting" {
		t.Fatalf("get: %d %v", st, got)
	}
	if st := s.do("GET", "/templates/aliases/my-tpl", nil, &got); st != 200 || got["templateID"] != a.TemplateID {
		t.Fatalf("alias: %d %v", st, got)
	}
	errShape(t, s, "GET", "/templates/aliases/nope", nil, 404)
	errShape(t, s, "GET", "/templates/nope", nil, 404)
	if st := s.do("PATCH", "/v2/templates/"+a.TemplateID, map[string]any{"public": true}, &got); st != 200 || got["names"] == nil {
		t.Fatalf("patch: %d %v", st, got)
	}
	// A template that never built cannot start sandboxes.
	errShape(t, s, "POST", "/v2/sandboxes", map[string]any{"templateID": "my-tpl"}, 409)
	// Files: hash shape, upload URL, bad bodies.
	errShape(t, s, "GET", "/templates/"+a.TemplateID+"/files/xyz", nil, 400)
	data := tarGz(t, map[string]string{"app/main.py": "print(1)\n"})
	sum := sha256.Sum256([]byte("opaque-cache-key"))
	hash := hex.EncodeToString(sum[:])
	var f struct {
		Present bool   `json:"present"`
		URL     string `json:"url"`
	}
	if st := s.do("GET", "/templates/"+a.TemplateID+"/files/"+hash, nil, &f); st != 201 || f.Present || !strings.HasPrefix(f.URL, "http://") {
		t.Fatalf("files: %d %+v", st, f)
	}
	put := func(url string, body []byte) int {
		r, _ := http.NewRequest("PUT", url, bytes.NewReader(body))
		resp, err := http.DefaultClient.Do(r)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if st := put(strings.Replace(f.URL, "token=", "token=x", 1), data); st != 401 {
		t.Fatalf("upload with a bad token: %d", st)
	}
	if st := put(f.URL, []byte("not a tar at all, definitely not")); st != 400 {
		t.Fatalf("garbage upload: %d", st)
	}
	if s.do("GET", "/templates/"+a.TemplateID+"/files/"+hash, nil, &f); f.Present {
		t.Fatal("a rejected upload became present")
	}
	if st := put(f.URL, data); st != 201 {
		t.Fatalf("upload: %d", st)
	}
	// Upload URLs are one-time: the used one is refused, whatever it carries.
	if st := put(f.URL, tarGz(t, map[string]string{"other": "x"})); st != 401 {
		t.Fatalf("a used upload URL: %d", st)
	}
	if s.do("GET", "/templates/"+a.TemplateID+"/files/"+hash, nil, &f); !f.Present {
		t.Fatal("upload not present")
	}
	// Build start validation is synchronous.
	errShape(t, s, "POST", "/v2/templates/"+a.TemplateID+"/builds/"+a.BuildID, map[string]any{"fromImage": "x", "fromTemplate": "base"}, 400)
	errShape(t, s, "POST", "/v2/templates/"+a.TemplateID+"/builds/bld_nope", map[string]any{"fromTemplate": "base"}, 404)
	errShape(t, s, "POST", "/v2/templates/"+a.TemplateID+"/builds/"+a.BuildID, map[string]any{"fromTemplate": "base",
		"steps": []any{map[string]any{"type": "ARG", "args": []string{"X"}}}}, 400)
	errShape(t, s, "POST", "/v2/templates/"+a.TemplateID+"/builds/"+a.BuildID, map[string]any{"fromTemplate": "base",
		"steps": []any{map[string]any{"type": "WORKDIR", "args": []string{"/workspace/x"}}}}, 400)
	errShape(t, s, "POST", "/v2/templates/"+a.TemplateID+"/builds/"+a.BuildID, map[string]any{"fromTemplate": "base",
		"steps": []any{map[string]any{"type": "COPY", "args": []string{"app", "/app"}, "filesHash": strings.Repeat("a", 64)}}}, 400)
	// A no-step build of fromTemplate is ready without BuildKit work.
	if st := s.do("POST", "/v2/templates/"+a.TemplateID+"/builds/"+a.BuildID, map[string]any{"fromTemplate": "base"}, nil); st != 202 {
		t.Fatalf("start: %d", st)
	}
	if bs, _ := s.waitBuild(t, a); bs.Status != "ready" {
		t.Fatalf("no-step build: %+v", bs)
	}
	errShape(t, s, "POST", "/v2/templates/"+a.TemplateID+"/builds/"+a.BuildID, map[string]any{"fromTemplate": "base"}, 409)
	for _, ref := range []string{"my-tpl", "my-tpl:v1", "my-tpl:stable", a.TemplateID} {
		c := s.create(map[string]any{"templateID": ref})
		if c.TemplateID != a.TemplateID {
			t.Fatalf("create from %s: templateID %s", ref, c.TemplateID)
		}
		// Deleting a template a live sandbox uses is refused; force wins.
		if ref == "my-tpl" {
			errShape(t, s, "DELETE", "/templates/"+a.TemplateID, nil, 409)
		}
		s.kill(t, c.SandboxID)
	}
	s.do("GET", "/templates/"+a.TemplateID, nil, &got)
	if got["spawnCount"].(float64) != 4 || got["lastSpawnedAt"] == nil {
		t.Fatalf("spawn count: %v %v", got["spawnCount"], got["lastSpawnedAt"])
	}
	// Tags.
	var tagged map[string]any
	if st := s.do("POST", "/templates/tags", map[string]any{"target": "my-tpl:v1", "tags": []string{"prod"}}, &tagged); st != 201 || tagged["buildID"] != a.BuildID {
		t.Fatalf("assign tag: %d %v", st, tagged)
	}
	var tags []map[string]any
	if s.do("GET", "/templates/"+a.TemplateID+"/tags", nil, &tags); len(tags) != 3 {
		t.Fatalf("tags: %v", tags)
	}
	if st := s.do("DELETE", "/templates/tags", map[string]any{"name": "my-tpl", "tags": []string{"prod"}}, nil); st != 204 {
		t.Fatalf("remove tag: %d", st)
	}
	errShape(t, s, "POST", "/v2/sandboxes", map[string]any{"templateID": "my-tpl:prod"}, 404)
	// Paging.
	var page []map[string]any
	if st := s.do("GET", "/v2/templates?limit=1", nil, &page); st != 200 || len(page) != 1 || s.lastHeader.Get("X-Next-Token") == "" {
		t.Fatalf("v2 page: %d %v %v", st, page, s.lastHeader)
	}
	// Pages follow the list's order: base, code-interpreter-v1, then a.
	seen := []any{page[0]["templateID"]}
	for i := 0; i < 2; i++ {
		if s.do("GET", "/v2/templates?limit=1&nextToken="+s.lastHeader.Get("X-Next-Token"), nil, &page); len(page) != 1 {
			t.Fatalf("v2 page %d: %v", i+2, page)
		}
		seen = append(seen, page[0]["templateID"])
	}
	if fmt.Sprint(seen) != fmt.Sprint([]any{"base", "code-interpreter-v1", a.TemplateID}) {
		t.Fatalf("v2 pages: %v", seen)
	}
	s.requireMetrics(t, `cubicle_templates{status="ready"} 3`, `cubicle_template_builds_total{result="ready"} 1`, `cubicle_template_build_duration_seconds_count 1`)
	if st := s.do("DELETE", "/templates/"+a.TemplateID, nil, nil); st != 204 {
		t.Fatalf("delete: %d", st)
	}
	errShape(t, s, "DELETE", "/templates/"+a.TemplateID, nil, 404)
	errShape(t, s, "DELETE", "/templates/base", nil, 409)
}

func tarGz(t *testing.T, files map[string]string) []byte {
	var buf bytes.Buffer
	gz := gzip.NewWriter(&buf)
	tw := tar.NewWriter(gz)
	for name, body := range files {
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(body)), Typeflag: tar.TypeReg}); err != nil {
			t.Fatal(err)
		}
		tw.Write([]byte(body))
	}
	tw.Close()
	gz.Close()
	return buf.Bytes()
}

// startCmd and readyCmd: probed during the build, awaited at create, a
// ready timeout is 503 with the sandbox kept.
func TestTemplateStartAndReadyCommands(t *testing.T) {
	requireBuildkit(t)
	s := startServer(t, "--ready-timeout", "4s")
	start := map[string]any{"fromTemplate": "base",
		"steps":    []any{map[string]any{"type": "RUN", "args": []string{"mkdir -p /srv && echo served > /srv/index.html"}}},
		"startCmd": "cd /srv && exec python3 -m http.server 8080",
		"readyCmd": `[ -z "$NOT_READY" ] && python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8080/')"`}
	c, st, logs := s.buildTemplate(t, "web", start)
	if st.Status != "ready" {
		t.Fatalf("build: %+v\n%s\nserver:\n%s", st, strings.Join(logs, "\n"), s.logs)
	}
	sb := s.create(map[string]any{"templateID": "web"})
	if out := s.mustRun(sb, `python3 -c "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:8080/').read().decode().strip())"; cat /var/log/cubicle/start-cmd.status`); !strings.HasPrefix(out, "served\nrunning pid=") {
		t.Fatalf("start command not serving: %q", out)
	}
	// The ready command fails for this sandbox: 503 with the CEP's body.
	var e struct {
		Code      int    `json:"code"`
		Message   string `json:"message"`
		SandboxID string `json:"sandboxID"`
		LogPath   string `json:"logPath"`
	}
	began := time.Now()
	if code := s.do("POST", "/v2/sandboxes", map[string]any{"templateID": "web", "envVars": map[string]string{"NOT_READY": "1"}}, &e); code != 503 || e.Code != 503 ||
		!strings.Contains(e.Message, "ready command timed out") || e.SandboxID == "" || e.LogPath != "/var/log/cubicle/start-cmd.log" {
		t.Fatalf("ready timeout: %d %+v", code, e)
	}
	if time.Since(began) > 30*time.Second {
		t.Fatalf("ready timeout not bounded: %v", time.Since(began))
	}
	kept := created{SandboxID: e.SandboxID}
	var detail map[string]any
	if code := s.do("GET", "/sandboxes/"+e.SandboxID, nil, &detail); code != 200 {
		t.Fatalf("the sandbox must be kept for inspection: %d", code)
	}
	kept.EnvdAccessToken, _ = detail["envdAccessToken"].(string)
	if out := s.mustRun(kept, "test -f /var/log/cubicle/start-cmd.log && echo log-there"); out != "log-there\n" {
		t.Fatalf("start-cmd log: %q", out)
	}
	// A ready command that never passes fails the build at finalize.
	_, st2, _ := s.buildTemplate(t, "never-ready", map[string]any{"fromTemplate": "base", "readyCmd": "false"})
	if st2.Status != "error" || st2.Reason == nil || st2.Reason.Step != "finalize" || !strings.Contains(st2.Reason.Message, "ready command") {
		t.Fatalf("never-ready build: %+v", st2)
	}
	_ = c
}

// A failing RUN names its step; a rebuild failure keeps the ready image; a
// restart mid-build fails it with "builder disappeared".
func TestTemplateBuildFailuresAndRestart(t *testing.T) {
	requireBuildkit(t)
	s := startServer(t)
	ok := map[string]any{"fromTemplate": "base", "steps": []any{map[string]any{"type": "RUN", "args": []string{"echo v1 > /etc/tv"}}}}
	c1, st, _ := s.buildTemplate(t, "fails", ok)
	if st.Status != "ready" {
		t.Fatalf("first build: %+v", st)
	}
	bad := map[string]any{"fromTemplate": "base", "steps": []any{
		map[string]any{"type": "RUN", "args": []string{"echo v2 > /etc/tv"}},
		map[string]any{"type": "ENV", "args": []string{"PASSWORD_LIKE", "x"}},
		map[string]any{"type": "RUN", "args": []string{"echo about to fail; exit 7"}}}}
	_, st, logs := s.buildTemplate(t, "fails", bad)
	if st.Status != "error" || st.Reason == nil || st.Reason.Step != "2" || !strings.Contains(st.Reason.Message, "exit code: 7") {
		t.Fatalf("failing RUN: %+v\n%s", st, strings.Join(logs, "\n"))
	}
	if !strings.Contains(strings.Join(logs, "\n"), "about to fail") {
		t.Fatalf("RUN output missing from the logs:\n%s", strings.Join(logs, "\n"))
	}
	sb := s.create(map[string]any{"templateID": "fails"})
	if out := s.mustRun(sb, "cat /etc/tv"); out != "v1\n" {
		t.Fatalf("failed rebuild replaced the image: %q", out)
	}
	s.kill(t, sb.SandboxID)
	// Restart during a build.
	var c tplCreated
	s.do("POST", "/v3/templates", map[string]any{"name": "fails"}, &c)
	if c.TemplateID != c1.TemplateID {
		t.Fatalf("same-name rebuild must reuse the templateID: %s vs %s", c.TemplateID, c1.TemplateID)
	}
	slow := map[string]any{"fromTemplate": "base", "steps": []any{map[string]any{"type": "RUN", "args": []string{"sleep 60"}}},
		"fromImageRegistry": map[string]any{"type": "registry", "username": "ci", "password": "hunter2-secret"}}
	if st := s.do("POST", "/v2/templates/"+c.TemplateID+"/builds/"+c.BuildID, slow, nil); st != 202 {
		t.Fatalf("start slow build: %d", st)
	}
	errShape(t, s, "POST", "/v3/templates", map[string]any{"name": "fails"}, 409)
	deadline := time.Now().Add(30 * time.Second)
	for {
		var bs buildStatus
		s.do("GET", "/templates/"+c.TemplateID+"/builds/"+c.BuildID+"/status", nil, &bs)
		if bs.Status == "building" && len(bs.LogEntries) > 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("slow build never started: %+v", bs)
		}
		time.Sleep(100 * time.Millisecond)
	}
	// While the rebuild runs, creates still get the ready image.
	during := s.create(map[string]any{"templateID": "fails"})
	if out := s.mustRun(during, "cat /etc/tv"); out != "v1\n" {
		t.Fatalf("create during a build: %q", out)
	}
	s.kill(t, during.SandboxID)
	s.stop(syscall.SIGKILL)
	s.start()
	bs, logs := s.waitBuild(t, c)
	if bs.Status != "error" || bs.Reason == nil || bs.Reason.Message != "builder disappeared" {
		t.Fatalf("after restart: %+v", bs)
	}
	if strings.Contains(strings.Join(logs, "\n"), "hunter2-secret") || strings.Contains(s.logs.String(), "hunter2-secret") {
		t.Fatal("registry password leaked into logs")
	}
	sb = s.create(map[string]any{"templateID": "fails"})
	if out := s.mustRun(sb, "cat /etc/tv"); out != "v1\n" {
		t.Fatalf("ready image after restart: %q", out)
	}
}

func jsonDecode(t *testing.T, resp *http.Response, out any) {
	t.Helper()
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		t.Fatalf("decode: %v", err)
	}
}
