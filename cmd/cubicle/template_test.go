package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/testenv"
	cubicle "github.com/cubicle-dev/cubicle/sdk/go"
)

func TestMatch(t *testing.T) {
	for _, c := range []struct {
		pat, name string
		want      bool
	}{
		{"*.py", "a.py", true},
		{"*.py", "d/a.py", false},
		{"**/*.py", "d/e/a.py", true},
		{"**/*.py", "a.py", true},
		{"d/**", "d", true},
		{"d/**", "d/x/y", true},
		{"*", ".hidden", true},
		{"{a,b}.txt", "b.txt", true},
		{"{a,b}.txt", "c.txt", false},
		{"x{1,{2,3}}", "x3", true},
		{"build/", "build/", true},
		{"build/", "build", false},
		{"f?.c", "f1.c", true},
		{"[ab].c", "b.c", true},
	} {
		if got := cubicle.MatchPattern(c.pat, c.name); got != c.want {
			t.Errorf("match(%q, %q) = %v", c.pat, c.name, got)
		}
	}
}

// tree builds the test context: files, nested dirs, a symlink, ignored
// files.
func tree(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	write := func(rel, body string, mode os.FileMode) {
		p := filepath.Join(dir, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), mode); err != nil {
			t.Fatal(err)
		}
		os.Chmod(p, mode) // umask-proof
	}
	write("app/main.py", "print('hi')\n", 0o644)
	write("app/run.sh", "#!/bin/sh\necho run\n", 0o755)
	write("app/sub/deep/n.txt", "nested\n", 0o600)
	write("app/.env", "A=1\n", 0o644)
	write("app/debug.tmp", "ignored by **/*.tmp\n", 0o644)
	write("req.txt", "requests\n", 0o644)
	write("secret.txt", "do not send\n", 0o644)
	write("empty", "", 0o644)
	write(".dockerignore", "# comment\nsecret.txt\n\n  **/*.tmp  \n", 0o644)
	if err := os.Symlink("main.py", filepath.Join(dir, "app", "link.py")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("../nowhere", filepath.Join(dir, "dangling")); err != nil {
		t.Fatal(err)
	}
	os.Mkdir(filepath.Join(dir, "emptydir"), 0o755)
	return dir
}

var tplCopies = [][2]string{
	{"app", "/app"},
	{".", "/ctx"},
	{"./app", "/app2"},
	{"app/", "/app3"},
	{"req.txt", "/app/req.txt"},
	{"app/*.py", "/py/"},
	{"**/*.txt", "/txt/"},
	{"app/{main,run}.*", "/mr/"},
	{"app/link.py", "/l"},
	{"dangling", "/d"},
	{"app/sub", "/s"},
	{"empty", "/e"},
	{"emptydir", "/ed"},
}

func goHashes(t *testing.T, dir string) []string {
	t.Helper()
	ignore, _, err := cubicle.ReadDockerignore(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, c := range tplCopies {
		ents, err := cubicle.CollectContext(dir, c[0], ignore)
		if err != nil {
			t.Fatalf("collect %s: %v", c[0], err)
		}
		h, err := cubicle.FilesHash(c[0], c[1], ents)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, h)
	}
	return out
}

// TestFilesHashMatchesSDK runs the e2b JS SDK's own hash (Template.toJSON
// with computeHashes) over the same tree.
func TestFilesHashMatchesSDK(t *testing.T) {
	node := testenv.LookPath(t, "node")
	mod, _ := filepath.Abs("../../test/e2b-js/node_modules/e2b")
	if _, err := os.Stat(filepath.Join(mod, "package.json")); err != nil {
		testenv.Skip(t, "test/e2b-js/node_modules/e2b missing (npm ci in test/e2b-js)")
	}
	dir := tree(t)
	copies, _ := json.Marshal(tplCopies)
	out, err := exec.Command(node, "testdata/sdkhash.js", mod, dir, string(copies)).Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			t.Fatalf("sdkhash.js: %v\n%s", err, ee.Stderr)
		}
		t.Fatal(err)
	}
	var sdk []string
	if err := json.Unmarshal(out, &sdk); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	got := goHashes(t, dir)
	for i, c := range tplCopies {
		if i >= len(sdk) || got[i] != sdk[i] {
			t.Errorf("COPY %s %s: go %s, sdk %v", c[0], c[1], got[i], sdk)
		}
	}
}

func TestCollect(t *testing.T) {
	dir := tree(t)
	ignore, _, _ := cubicle.ReadDockerignore(dir)
	rels := func(src string) []string {
		ents, err := cubicle.CollectContext(dir, src, ignore)
		if err != nil {
			t.Fatalf("%s: %v", src, err)
		}
		var r []string
		for _, e := range ents {
			r = append(r, e.Rel)
		}
		return r
	}
	if got, want := rels("app"), []string{"app", "app/.env", "app/link.py", "app/main.py", "app/run.sh", "app/sub", "app/sub/deep", "app/sub/deep/n.txt"}; !reflect.DeepEqual(got, want) {
		t.Errorf("app: %q", got)
	}
	all := rels(".")
	if all[0] != "" || contains(all, "secret.txt") || contains(all, "app/debug.tmp") || !contains(all, ".dockerignore") || !contains(all, "dangling") {
		t.Errorf(".: %q", all)
	}
	if got := rels("**/*.txt"); !reflect.DeepEqual(got, []string{"app/sub/deep/n.txt", "req.txt"}) {
		t.Errorf("**/*.txt: %q", got)
	}
	for _, src := range []string{"missing", "secret.txt", "req.txt/", "nomatch*", "req.txt/x"} {
		_, err := cubicle.CollectContext(dir, src, ignore)
		var nf *cubicle.NoFilesError
		if !errors.As(err, &nf) {
			t.Errorf("%s: want no-files error, got %v", src, err)
		}
	}

	// An ignored directory hides what is under it (Docker's rule).
	if got := rels2(t, dir, "app", []string{"app/sub"}); contains(got, "app/sub/deep/n.txt") || contains(got, "app/sub") {
		t.Errorf("ignored dir: %q", got)
	}
}

func rels2(t *testing.T, dir, src string, ignore []string) []string {
	ents, err := cubicle.CollectContext(dir, src, ignore)
	if err != nil {
		t.Fatal(err)
	}
	var r []string
	for _, e := range ents {
		r = append(r, e.Rel)
	}
	return r
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func TestHashChangesWithContent(t *testing.T) {
	dir := tree(t)
	a := goHashes(t, dir)
	os.WriteFile(filepath.Join(dir, "app", "main.py"), []byte("print('bye')\n"), 0o644)
	b := goHashes(t, dir)
	if a[0] == b[0] || a[4] != b[4] {
		t.Errorf("app hash must change, req.txt must not: %v %v", a[:5], b[:5])
	}
	os.Chmod(filepath.Join(dir, "req.txt"), 0o600)
	if c := goHashes(t, dir); c[4] == b[4] {
		t.Error("mode change must change the hash")
	}
}

func TestDockerignoreParsing(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, ".dockerignore"), []byte("# c\n/abs\n./rel\n!keep\n  spaced  \n\n"), 0o644)
	p, skipped, err := cubicle.ReadDockerignore(dir)
	if err != nil || !reflect.DeepEqual(p, []string{"abs", "rel", "spaced"}) || !reflect.DeepEqual(skipped, []string{"!keep"}) {
		t.Fatalf("%q %q %v", p, skipped, err)
	}
	if p, _, err := cubicle.ReadDockerignore(t.TempDir()); p != nil || err != nil {
		t.Fatal("missing .dockerignore")
	}
}

type tarEntry struct {
	Name, Link string
	Type       byte
	Mode       int64
	Body       string
}

func readTar(t *testing.T, r io.Reader) []tarEntry {
	t.Helper()
	zr, err := gzip.NewReader(r)
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(zr)
	var out []tarEntry
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(tr)
		out = append(out, tarEntry{Name: h.Name, Link: h.Linkname, Type: h.Typeflag, Mode: h.Mode & 0o7777, Body: string(b)})
	}
}

func TestArchive(t *testing.T) {
	dir := tree(t)
	ignore, _, _ := cubicle.ReadDockerignore(dir)
	ents, err := cubicle.CollectContext(dir, "app", ignore)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := cubicle.WriteContextArchive(&buf, ents); err != nil {
		t.Fatal(err)
	}
	got := readTar(t, &buf)
	want := []tarEntry{
		{Name: "app/", Type: tar.TypeDir, Mode: 0o755},
		{Name: "app/.env", Type: tar.TypeReg, Mode: 0o644, Body: "A=1\n"},
		{Name: "app/link.py", Type: tar.TypeSymlink, Link: "main.py", Mode: 0o777},
		{Name: "app/main.py", Type: tar.TypeReg, Mode: 0o644, Body: "print('hi')\n"},
		{Name: "app/run.sh", Type: tar.TypeReg, Mode: 0o755, Body: "#!/bin/sh\necho run\n"},
		{Name: "app/sub/", Type: tar.TypeDir, Mode: 0o755},
		{Name: "app/sub/deep/", Type: tar.TypeDir, Mode: 0o755},
		{Name: "app/sub/deep/n.txt", Type: tar.TypeReg, Mode: 0o600, Body: "nested\n"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("tar:\n got %+v\nwant %+v", got, want)
	}
	ents, _ = cubicle.CollectContext(dir, ".", ignore)
	buf.Reset()
	cubicle.WriteContextArchive(&buf, ents)
	if got := readTar(t, &buf); got[0].Name != "./" {
		t.Errorf("root entry %q", got[0].Name)
	}
}

// tplStartBody is TemplateBuildStartV2 as the fake server decodes it.
type tplStartBody struct {
	FromImage    string                 `json:"fromImage,omitempty"`
	FromTemplate string                 `json:"fromTemplate,omitempty"`
	Force        bool                   `json:"force"`
	Steps        []cubicle.TemplateStep `json:"steps"`
	StartCmd     string                 `json:"startCmd,omitempty"`
	ReadyCmd     string                 `json:"readyCmd,omitempty"`
}

// fakeServer is just enough of the template API for the build flow.
type fakeServer struct {
	mu       sync.Mutex
	srv      *httptest.Server
	calls    []string
	create   map[string]any
	start    tplStartBody
	uploads  map[string][]tarEntry
	present  map[string]bool
	statuses []tplStatus // served in order, the last one repeats
	offsets  []string
	polls    int
	upKeyHdr string
	upHdr    string
}

func newFakeServer(t *testing.T) *fakeServer {
	f := &fakeServer{uploads: map[string][]tarEntry{}, present: map[string]bool{}}
	f.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		defer f.mu.Unlock()
		f.calls = append(f.calls, r.Method+" "+r.URL.Path)
		switch {
		case r.Method == "POST" && r.URL.Path == "/v3/templates":
			json.NewDecoder(r.Body).Decode(&f.create)
			w.WriteHeader(202)
			json.NewEncoder(w).Encode(map[string]any{"templateID": "tpl_1", "buildID": "bld_1", "names": []string{"demo"}, "tags": []string{"default"}})
		case r.Method == "GET" && strings.HasPrefix(r.URL.Path, "/templates/tpl_1/files/"):
			h := strings.TrimPrefix(r.URL.Path, "/templates/tpl_1/files/")
			w.WriteHeader(201)
			if f.present[h] {
				json.NewEncoder(w).Encode(map[string]any{"present": true})
				return
			}
			json.NewEncoder(w).Encode(map[string]any{"present": false, "url": f.srv.URL + "/upload/" + h + "?token=t", "headers": map[string]string{"X-Upload": "yes", "Content-Length": "1"}})
		case r.Method == "PUT" && strings.HasPrefix(r.URL.Path, "/upload/"):
			if r.ContentLength <= 0 || r.URL.Query().Get("token") != "t" {
				w.WriteHeader(400)
				return
			}
			f.upKeyHdr, f.upHdr = r.Header.Get("X-API-Key"), r.Header.Get("X-Upload")
			b, _ := io.ReadAll(r.Body)
			if int64(len(b)) != r.ContentLength {
				w.WriteHeader(400)
				return
			}
			f.uploads[strings.TrimPrefix(r.URL.Path, "/upload/")] = readTar(t, bytes.NewReader(b))
			w.WriteHeader(201)
		case r.Method == "POST" && r.URL.Path == "/v2/templates/tpl_1/builds/bld_1":
			json.NewDecoder(r.Body).Decode(&f.start)
			w.WriteHeader(202)
		case r.Method == "GET" && r.URL.Path == "/templates/tpl_1/builds/bld_1/status":
			f.offsets = append(f.offsets, r.URL.Query().Get("logsOffset"))
			i := f.polls
			if i >= len(f.statuses) {
				i = len(f.statuses) - 1
			}
			f.polls++
			st := f.statuses[i]
			if st.LogEntries == nil {
				st.LogEntries = []tplLogEntry{}
			}
			json.NewEncoder(w).Encode(st)
		default:
			w.WriteHeader(404)
			json.NewEncoder(w).Encode(map[string]any{"code": 404, "message": "no route " + r.URL.Path})
		}
	}))
	t.Cleanup(f.srv.Close)
	t.Setenv("CUBICLE_API_URL", f.srv.URL)
	t.Setenv("CUBICLE_API_KEY", "k")
	return f
}

func entries(step string, msgs ...string) []tplLogEntry {
	var out []tplLogEntry
	for _, m := range msgs {
		out = append(out, tplLogEntry{Message: m, Level: "info", Step: step})
	}
	return out
}

func TestBuildFlow(t *testing.T) {
	dir := tree(t)
	recipe := filepath.Join(dir, "Recipe")
	os.WriteFile(recipe, []byte("FROM cubicle/base:1\nCOPY app req.txt /opt/\nCOPY req.txt /srv/\nRUN echo hi\nENV A=1\nUSER user\nCMD [\"python\",\"main.py\"]\n# cubicle:ready sleep 1\n"), 0o644)
	f := newFakeServer(t)
	f.statuses = []tplStatus{
		{Status: "waiting"},
		{Status: "building", LogEntries: entries("base", "pulling")},
		{Status: "building", LogEntries: append(entries("3", "hi", "done"), entries("0", "copy")...)},
		{Status: "ready", LogEntries: entries("finalize", "unpacking")},
		{Status: "ready", LogEntries: entries("finalize", "ok")},
		{Status: "ready"},
	}
	ignore, _, _ := cubicle.ReadDockerignore(dir)
	reqEnts, _ := cubicle.CollectContext(dir, "req.txt", ignore)
	reqHash, _ := cubicle.FilesHash("req.txt", "/opt/", reqEnts)
	f.present[reqHash] = true

	out, err := run(t, "template", "build", "-f", recipe, "--name", "demo:v1", "--cpu", "2", "--no-cache")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if want := map[string]any{"name": "demo:v1", "cpuCount": float64(2)}; !reflect.DeepEqual(f.create, want) {
		t.Errorf("create body %v", f.create)
	}
	if !reflect.DeepEqual(f.offsets, []string{"0", "0", "1", "4", "5", "6"}) {
		t.Errorf("logsOffset sequence %v", f.offsets)
	}
	st := f.start
	if st.FromImage != "cubicle/base:1" || !st.Force || st.StartCmd != "python main.py" || st.ReadyCmd != "sleep 1" || len(st.Steps) != 6 {
		t.Fatalf("start body %+v", st)
	}
	if st.Steps[0].FilesHash == "" || st.Steps[1].FilesHash != reqHash || st.Steps[2].FilesHash == reqHash || st.Steps[3].FilesHash != "" {
		t.Errorf("hashes %+v", st.Steps)
	}
	// req.txt to /opt/ was present; app and req.txt (second COPY, other
	// dest, so another hash) were uploaded.
	if len(f.uploads) != 2 || f.upKeyHdr != "" || f.upHdr != "yes" {
		t.Errorf("uploads %d, api key %q, header %q", len(f.uploads), f.upKeyHdr, f.upHdr)
	}
	if ents := f.uploads[st.Steps[0].FilesHash]; len(ents) == 0 || ents[0].Name != "app/" {
		t.Errorf("app upload %+v", ents)
	}
	for _, want := range []string{"Step 1/8: FROM cubicle/base:1", "[base] pulling", "Step 5/8: RUN echo hi", "[3] hi", "Step 2/8: COPY app /opt/",
		"Step 8/8: finalize", "[finalize] ok", "Skipping upload of 'req.txt', already cached", "templateID tpl_1, buildID bld_1"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}

func TestBuildFailure(t *testing.T) {
	dir := t.TempDir()
	recipe := filepath.Join(dir, "Recipe")
	os.WriteFile(recipe, []byte("FROM cubicle/base:1\nRUN exit 3\n"), 0o644)
	f := newFakeServer(t)
	failed := tplStatus{Status: "error", LogEntries: []tplLogEntry{{Message: "exit code: 3", Level: "error", Step: "0"}}}
	failed.Reason = &struct {
		Message string `json:"message"`
		Step    string `json:"step,omitempty"`
	}{Message: "process did not complete successfully: exit code: 3", Step: "0"}
	done := failed
	done.LogEntries = nil
	f.statuses = []tplStatus{{Status: "building"}, failed, done}
	out, err := run(t, "template", "build", "-f", recipe, "--name", "bad")
	var be *tplBuildFailedError
	if !errors.As(err, &be) || be.Step != "0" || be.StepDesc != "RUN exit 3" || !strings.Contains(be.Message, "exit code: 3") {
		t.Fatalf("err %v\n%s", err, out)
	}
	if !strings.Contains(err.Error(), "at step 0 (RUN exit 3)") || !strings.Contains(out, "[0] error: exit code: 3") {
		t.Errorf("%v\n%s", err, out)
	}
	if f.start.Force {
		t.Error("force must be false without --no-cache")
	}
}

func TestBuildMissingFileCreatesNothing(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "Recipe"), []byte("FROM x\nRUN true\nCOPY nope /n\n"), 0o644)
	f := newFakeServer(t)
	_, err := run(t, "template", "build", "-f", filepath.Join(dir, "Recipe"), "--name", "x")
	var re *cubicle.RecipeError
	if !errors.As(err, &re) || re.Line != 3 || !strings.Contains(err.Error(), "no files found") {
		t.Fatalf("err %v", err)
	}
	if len(f.calls) != 0 {
		t.Errorf("calls %v", f.calls)
	}
}

func TestListGetDelete(t *testing.T) {
	var mu sync.Mutex
	var calls []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		calls = append(calls, r.Method+" "+r.URL.RequestURI())
		mu.Unlock()
		switch {
		case r.URL.Path == "/v2/templates" && r.URL.Query().Get("nextToken") == "":
			w.Header().Set("X-Next-Token", "tpl_a")
			fmt.Fprint(w, `[{"templateID":"tpl_a","names":["a","a2"],"buildStatus":"ready","cpuCount":2,"memoryMB":512,"spawnCount":3,"updatedAt":"2025-01-02T03:04:05Z"}]`)
		case r.URL.Path == "/v2/templates":
			fmt.Fprint(w, `[{"templateID":"tpl_b","names":["b"],"buildStatus":"error","cpuCount":1,"memoryMB":256}]`)
		case r.URL.Path == "/templates/a" && r.Method == "GET":
			fmt.Fprint(w, `{"templateID":"tpl_a","buildID":"bld_2","names":["a"],"buildStatus":"ready","builds":[{"buildID":"bld_2","status":"ready"},{"buildID":"bld_1","status":"error"}]}`)
		case r.Method == "DELETE" && r.URL.Path == "/templates/a":
			w.WriteHeader(204)
		case r.Method == "DELETE":
			w.WriteHeader(409)
			fmt.Fprint(w, `{"code":409,"message":"template is in use"}`)
		default:
			w.WriteHeader(404)
			fmt.Fprint(w, `{"code":404,"message":"not found"}`)
		}
	}))
	defer srv.Close()
	t.Setenv("CUBICLE_API_URL", srv.URL)
	t.Setenv("CUBICLE_API_KEY", "k")

	out, err := run(t, "template", "list")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], "ID") || !strings.Contains(lines[1], "a,a2") || !strings.Contains(lines[1], "512MiB") || !strings.Contains(lines[2], "tpl_b") {
		t.Errorf("list:\n%s", out)
	}
	for _, h := range []string{"NAMES", "STATUS", "CPU", "MEM", "SPAWNS", "UPDATED"} {
		if !strings.Contains(lines[0], h) {
			t.Errorf("header lacks %s", h)
		}
	}
	out, err = run(t, "template", "list", "--json")
	var arr []map[string]any
	if err != nil || json.Unmarshal([]byte(out), &arr) != nil || len(arr) != 2 {
		t.Errorf("list --json: %v %s", err, out)
	}
	out, err = run(t, "template", "get", "a")
	if err != nil || !strings.Contains(out, "bld_1") || !strings.Contains(out, "tpl_a") {
		t.Errorf("get: %v\n%s", err, out)
	}
	_, err = run(t, "template", "get", "zzz")
	var ae *cubicle.APIError
	if !errors.As(err, &ae) || ae.StatusCode != 404 || !errors.Is(err, cubicle.ErrTemplateNotFound) {
		t.Errorf("get missing: %v", err)
	}
	out, err = run(t, "template", "delete", "a", "busy", "--force")
	if err == nil || !strings.Contains(out, "template is in use") || !strings.Contains(err.Error(), "busy") {
		t.Errorf("delete: %v\n%s", err, out)
	}
	mu.Lock()
	defer mu.Unlock()
	sort.Strings(calls)
	if !contains(calls, "DELETE /templates/a?force=true") || !contains(calls, "GET /v2/templates?limit=100&nextToken=tpl_a") {
		t.Errorf("calls %v", calls)
	}
}

func TestFollowInterrupted(t *testing.T) {
	f := newFakeServer(t)
	f.statuses = []tplStatus{{Status: "building", LogEntries: entries("0", "working")}, {Status: "building"}}
	c, err := newClient()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		time.Sleep(500 * time.Millisecond)
		cancel()
	}()
	var out bytes.Buffer
	_, err = tplFollow(ctx, c, "tpl_1", "bld_1", newTplProgress(&out, nil))
	var ie *tplInterruptedError
	if !errors.As(err, &ie) || !ie.Started || !strings.Contains(err.Error(), "continues on the server") {
		t.Fatalf("err %v", err)
	}
	if !strings.Contains(out.String(), "[0] working") || f.polls < 2 {
		t.Errorf("polls %d, out %q", f.polls, out.String())
	}
}
