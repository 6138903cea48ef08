package content

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/diskimage"
	"github.com/cubicle-dev/cubicle/internal/testenv"
)

const (
	testVol   = "vol1"
	testToken = "s3cret"
)

// testResolver serves one volume behind a fixed token and counts requests
// still holding the volume, so tests can wait for a handler to finish.
type testResolver struct {
	dir      string
	inflight atomic.Int64
}

func (r *testResolver) Open(_ context.Context, id, token string) (string, func(), error) {
	switch id {
	case testVol:
	case "busy":
		return "", nil, fmt.Errorf("volume is being deleted: %w", ErrConflict)
	case "broken":
		return "", nil, errors.New("database on fire")
	case "nolocal":
		return "", nil, fmt.Errorf("%w: no in-process node", ErrNotImplemented)
	default:
		return "", nil, fmt.Errorf("volume %s: %w", id, ErrNotFound)
	}
	if token != testToken {
		return "", nil, ErrUnauthorized
	}
	r.inflight.Add(1)
	return r.dir, func() { r.inflight.Add(-1) }, nil
}

type env struct {
	t   *testing.T
	srv *httptest.Server
	res *testResolver
	dir string
}

func newEnv(t *testing.T, opts ...Option) *env {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "vol")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	res := &testResolver{dir: dir}
	srv := httptest.NewServer(NewHandler(res, nil, opts...))
	t.Cleanup(srv.Close)
	return &env{t: t, srv: srv, res: res, dir: dir}
}

// url builds /volumecontent/vol1/<res>?k=v&...
func (e *env) url(res string, kv ...string) string {
	q := url.Values{}
	for i := 0; i+1 < len(kv); i += 2 {
		q.Set(kv[i], kv[i+1])
	}
	return e.srv.URL + "/volumecontent/" + testVol + "/" + res + "?" + q.Encode()
}

type resp struct {
	status int
	body   []byte
	header http.Header
}

func (e *env) doRaw(method, u string, body io.Reader, token string, hdr ...string) resp {
	e.t.Helper()
	req, err := http.NewRequest(method, u, body)
	if err != nil {
		e.t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		e.t.Fatal(err)
	}
	return resp{res.StatusCode, b, res.Header}
}

func (e *env) do(method, u string, body io.Reader) resp {
	e.t.Helper()
	return e.doRaw(method, u, body, testToken)
}

func (e *env) path(p string) string { return filepath.Join(e.dir, filepath.FromSlash(p)) }

func (e *env) writeHost(p, data string) {
	e.t.Helper()
	full := e.path(p)
	if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
		e.t.Fatal(err)
	}
	if err := os.WriteFile(full, []byte(data), 0o644); err != nil {
		e.t.Fatal(err)
	}
}

func (e *env) readHost(p string) string {
	e.t.Helper()
	b, err := os.ReadFile(e.path(p))
	if err != nil {
		e.t.Fatal(err)
	}
	return string(b)
}

// waitIdle waits until no request holds the volume (handlers finished).
func (e *env) waitIdle() {
	e.t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for e.res.inflight.Load() != 0 {
		if time.Now().After(deadline) {
			e.t.Fatal("handler did not finish")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func wantStatus(t *testing.T, r resp, status int) {
	t.Helper()
	if r.status != status {
		t.Fatalf("status = %d, want %d; body: %s", r.status, status, r.body)
	}
}

// wantError checks status and the {code: "<status>", message} shape.
func wantError(t *testing.T, r resp, status int, msgContains string) {
	t.Helper()
	wantStatus(t, r, status)
	if ct := r.header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("error Content-Type = %q", ct)
	}
	var ae struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	}
	if err := json.Unmarshal(r.body, &ae); err != nil {
		t.Fatalf("error body %q: %v", r.body, err)
	}
	if ae.Code != fmt.Sprint(status) {
		t.Errorf("code = %q, want %q", ae.Code, fmt.Sprint(status))
	}
	if !strings.Contains(ae.Message, msgContains) {
		t.Errorf("message = %q, want it to contain %q", ae.Message, msgContains)
	}
}

func decodeEntry(t *testing.T, r resp) EntryStat {
	t.Helper()
	var e EntryStat
	if err := json.Unmarshal(r.body, &e); err != nil {
		t.Fatalf("entry %q: %v", r.body, err)
	}
	return e
}

func decodeList(t *testing.T, r resp) []EntryStat {
	t.Helper()
	var es []EntryStat
	if err := json.Unmarshal(r.body, &es); err != nil {
		t.Fatalf("list %q: %v", r.body, err)
	}
	return es
}

func paths(es []EntryStat) []string {
	out := make([]string, len(es))
	for i, e := range es {
		out[i] = e.Path
	}
	return out
}

func requireRoot(t *testing.T) {
	t.Helper()
	testenv.RequireRoot(t, "chown")
}

func TestAuthAndVolumeErrors(t *testing.T) {
	e := newEnv(t)
	u := e.url("path", "path", "/")
	wantError(t, e.doRaw("GET", u, nil, ""), 401, "token")
	wantError(t, e.doRaw("GET", u, nil, "wrong"), 401, "token")
	wantError(t, e.doRaw("GET", u, nil, "", "Authorization", "Basic "+testToken), 401, "token")
	wantStatus(t, e.doRaw("GET", u, nil, "", "Authorization", "bearer  "+testToken+" "), 200)

	other := func(id string) string { return e.srv.URL + "/volumecontent/" + id + "/path?path=/" }
	wantError(t, e.do("GET", other("nope"), nil), 404, "volume nope not found")
	wantError(t, e.do("GET", other("busy"), nil), 409, "being deleted")
	wantError(t, e.do("GET", other("nolocal"), nil), 501, "no in-process node")
	r := e.do("GET", other("broken"), nil)
	wantError(t, r, 500, "internal error")
	if bytes.Contains(r.body, []byte("fire")) {
		t.Errorf("500 leaks internal error: %s", r.body)
	}
	// Unauthenticated callers get 401 even for bad parameters.
	wantError(t, e.doRaw("GET", e.url("dir", "depth", "x"), nil, ""), 401, "")
}

func TestRoutes(t *testing.T) {
	e := newEnv(t)
	wantError(t, e.do("GET", e.url("bogus"), nil), 404, "no such route")
	wantError(t, e.do("GET", e.srv.URL+"/volumecontent/"+testVol, nil), 404, "")
	wantError(t, e.do("GET", e.srv.URL+"/volumecontent/"+testVol+"/file/x", nil), 404, "")
	wantError(t, e.do("GET", e.srv.URL+"/volumecontent/", nil), 404, "")
	r := e.do("POST", e.url("path", "path", "/"), nil)
	wantError(t, r, 405, "not allowed")
	if r.header.Get("Allow") == "" {
		t.Error("405 without Allow")
	}
	wantError(t, e.do("DELETE", e.url("file", "path", "/x"), nil), 405, "")
}

func TestBadQueryValues(t *testing.T) {
	e := newEnv(t)
	e.writeHost("f", "x")
	for _, tc := range []struct {
		method, res string
		kv          []string
		msg         string
	}{
		{"GET", "path", []string{"path", "relative/x"}, "must be absolute"},
		{"GET", "path", []string{"path", "/a\x00b"}, "NUL"},
		{"GET", "dir", []string{"path", "/", "depth", "0"}, "invalid depth"},
		{"GET", "dir", []string{"path", "/", "depth", "-1"}, "invalid depth"},
		{"GET", "dir", []string{"path", "/", "depth", "two"}, "invalid depth"},
		{"POST", "dir", []string{"path", "/d", "uid", "abc"}, "invalid uid"},
		{"POST", "dir", []string{"path", "/d", "uid", "-1"}, "invalid uid"},
		{"POST", "dir", []string{"path", "/d", "gid", "4294967296"}, "invalid gid"},
		{"POST", "dir", []string{"path", "/d", "mode", "99999"}, "invalid mode"},
		{"POST", "dir", []string{"path", "/d", "mode", "rwx"}, "invalid mode"},
		{"POST", "dir", []string{"path", "/d", "force", "maybe"}, "invalid force"},
		{"PUT", "file", []string{"path", "/g", "mode", "-5"}, "invalid mode"},
		{"PUT", "file", []string{"path", "/g", "mode", "0o4755"}, "setuid and setgid"},
		{"PUT", "file", []string{"path", "/g", "mode", "2541"}, "setuid and setgid"}, // 0o4755
		{"POST", "dir", []string{"path", "/d", "mode", "0o2775"}, "setuid and setgid"},
		{"PUT", "file", []string{"path", "/g", "force", "2"}, "invalid force"},
		{"PUT", "file", []string{"path", "/g", "uid", "1.5"}, "invalid uid"},
	} {
		t.Run(tc.method+" "+tc.res+" "+strings.Join(tc.kv, "="), func(t *testing.T) {
			wantError(t, e.do(tc.method, e.url(tc.res, tc.kv...), strings.NewReader("body")), 400, tc.msg)
		})
	}
	if _, err := os.Stat(e.path("d")); err == nil {
		t.Error("rejected mkdir created the directory")
	}
	if _, err := os.Stat(e.path("g")); err == nil {
		t.Error("rejected upload created the file")
	}
}

func TestGetPath(t *testing.T) {
	e := newEnv(t)
	e.writeHost("data/f.txt", "hello")
	if err := syscall.Chmod(e.path("data/f.txt"), 0o4750); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("data/f.txt", e.path("link")); err != nil {
		t.Fatal(err)
	}
	before := time.Now().Add(-time.Minute)

	r := e.do("GET", e.url("path", "path", "/data/f.txt"), nil)
	wantStatus(t, r, 200)
	got := decodeEntry(t, r)
	if got.Name != "f.txt" || got.Type != "file" || got.Path != "/data/f.txt" || got.Size != 5 || got.Mode != 0o4750 {
		t.Errorf("file entry = %+v", got)
	}
	if got.UID != uint32(os.Geteuid()) || got.Target != "" {
		t.Errorf("file entry owner/target = %+v", got)
	}
	for _, ts := range []string{got.Atime, got.Mtime, got.Ctime} {
		tm, err := time.Parse(time.RFC3339Nano, ts)
		if err != nil || tm.Before(before) || !strings.HasSuffix(ts, "Z") {
			t.Errorf("time %q: %v", ts, err)
		}
	}
	if bytes.Contains(r.body, []byte(`"target"`)) {
		t.Errorf("target present for a file: %s", r.body)
	}

	// Cleaning: trailing slash, "." and ".." collapse lexically.
	got = decodeEntry(t, e.do("GET", e.url("path", "path", "/data/./x/../"), nil))
	if got.Type != "directory" || got.Path != "/data" || got.Name != "data" {
		t.Errorf("dir entry = %+v", got)
	}
	for _, p := range []string{"/", "", "/.."} {
		got = decodeEntry(t, e.do("GET", e.url("path", "path", p), nil))
		if got.Type != "directory" || got.Path != "/" {
			t.Errorf("root entry for %q = %+v", p, got)
		}
	}

	got = decodeEntry(t, e.do("GET", e.url("path", "path", "/link"), nil))
	if got.Type != "symlink" || got.Target != "data/f.txt" || got.Size != int64(len("data/f.txt")) {
		t.Errorf("symlink entry = %+v", got)
	}

	wantError(t, e.do("GET", e.url("path", "path", "/data/missing"), nil), 404, "path /data/missing not found")
	wantError(t, e.do("GET", e.url("path", "path", "/data/f.txt/below"), nil), 404, "not found")
}

func TestPatchPath(t *testing.T) {
	requireRoot(t)
	e := newEnv(t)
	e.writeHost("f", "x")
	patch := func(p, body string) resp {
		return e.do("PATCH", e.url("path", "path", p), strings.NewReader(body))
	}

	// No set-ID bits through the API; the file is left as it was.
	wantError(t, patch("/f", `{"mode":2541}`), 400, "setuid and setgid")            // 0o4755
	wantError(t, patch("/f", `{"uid":1234,"mode":1517}`), 400, "setuid and setgid") // 0o2755
	if fi, _ := os.Stat(e.path("f")); fi.Mode()&(os.ModeSetuid|os.ModeSetgid) != 0 || fi.Sys().(*syscall.Stat_t).Uid == 1234 {
		t.Errorf("refused patch changed the file: %v", fi.Mode())
	}

	r := patch("/f", `{"uid":1234,"gid":2345,"mode":1005}`) // 1005 = 0o1755
	wantStatus(t, r, 200)
	got := decodeEntry(t, r)
	if got.UID != 1234 || got.GID != 2345 || got.Mode != 0o1755 {
		t.Errorf("after patch: %+v", got)
	}
	fi, _ := os.Stat(e.path("f"))
	st := fi.Sys().(*syscall.Stat_t)
	if st.Uid != 1234 || st.Gid != 2345 || st.Mode&0o7777 != 0o1755 {
		t.Errorf("host stat uid=%d gid=%d mode=%o", st.Uid, st.Gid, st.Mode&0o7777)
	}

	// Subsets leave the rest alone.
	got = decodeEntry(t, patch("/f", `{"mode":384}`))
	if got.UID != 1234 || got.GID != 2345 || got.Mode != 0o600 {
		t.Errorf("mode-only patch: %+v", got)
	}
	got = decodeEntry(t, patch("/f", `{"gid":7}`))
	if got.UID != 1234 || got.GID != 7 || got.Mode != 0o600 {
		t.Errorf("gid-only patch: %+v", got)
	}
	got = decodeEntry(t, patch("/f", `{}`))
	if got.GID != 7 {
		t.Errorf("empty patch: %+v", got)
	}
	wantStatus(t, patch("/f", ``), 200)
	got = decodeEntry(t, patch("/", `{"mode":493}`))
	if got.Mode != 0o755 || got.Type != "directory" {
		t.Errorf("root patch: %+v", got)
	}

	// Symlink: chown changes the link itself, mode is refused.
	e.writeHost("target", "t")
	if err := os.Symlink("target", e.path("ln")); err != nil {
		t.Fatal(err)
	}
	got = decodeEntry(t, patch("/ln", `{"uid":4321}`))
	if got.Type != "symlink" || got.UID != 4321 {
		t.Errorf("symlink chown: %+v", got)
	}
	fi, _ = os.Stat(e.path("target"))
	if fi.Sys().(*syscall.Stat_t).Uid != 0 {
		t.Error("chown of a symlink changed its target")
	}
	wantError(t, patch("/ln", `{"mode":420}`), 400, "symlink")

	wantError(t, patch("/f", `{"mode":`), 400, "invalid JSON")
	wantError(t, patch("/f", `[1]`), 400, "invalid JSON")
	wantError(t, patch("/f", `{"uid":"1"}`), 400, "invalid JSON")
	wantError(t, patch("/f", `{"uid":1.5}`), 400, "invalid JSON")
	wantError(t, patch("/f", `{"uid":-1}`), 400, "invalid uid")
	wantError(t, patch("/f", `{"gid":4294967295}`), 400, "invalid gid")
	wantError(t, patch("/f", `{"mode":4096}`), 400, "invalid mode")
	wantError(t, patch("/missing", `{"mode":420}`), 404, "path /missing not found")
}

func TestDeletePath(t *testing.T) {
	e := newEnv(t)
	e.writeHost("f", "x")
	e.writeHost("d/sub/deep/file", "y")
	del := func(p string) resp { return e.do("DELETE", e.url("path", "path", p), nil) }

	r := del("/f")
	wantStatus(t, r, 204)
	if len(r.body) != 0 {
		t.Errorf("204 with body %q", r.body)
	}
	if _, err := os.Lstat(e.path("f")); !os.IsNotExist(err) {
		t.Error("file not deleted")
	}
	wantStatus(t, del("/d"), 204)
	if _, err := os.Lstat(e.path("d")); !os.IsNotExist(err) {
		t.Error("dir not deleted recursively")
	}
	wantError(t, del("/f"), 404, "path /f not found")
	for _, p := range []string{"/", "", "/..", "/./"} {
		wantError(t, del(p), 400, "root")
	}
	if _, err := os.Stat(e.dir); err != nil {
		t.Fatal("volume root gone")
	}
}

func TestListDir(t *testing.T) {
	e := newEnv(t)
	e.writeHost("a/x.txt", "1")
	e.writeHost("a/sub/y.txt", "22")
	e.writeHost("a/sub/deeper/z.txt", "333")
	e.writeHost("b.txt", "b")
	if err := os.Mkdir(e.path("empty"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("a", e.path("alink")); err != nil {
		t.Fatal(err)
	}
	list := func(kv ...string) resp { return e.do("GET", e.url("dir", kv...), nil) }

	r := list("path", "/")
	wantStatus(t, r, 200)
	if got, want := strings.Join(paths(decodeList(t, r)), ","), "/a,/alink,/b.txt,/empty"; got != want {
		t.Errorf("depth default = %s, want %s", got, want)
	}
	es := decodeList(t, list("path", "/a", "depth", "1"))
	if got, want := strings.Join(paths(es), ","), "/a/sub,/a/x.txt"; got != want {
		t.Errorf("depth 1 = %s, want %s", got, want)
	}
	if es[0].Name != "sub" || es[0].Type != "directory" || es[1].Type != "file" || es[1].Size != 1 {
		t.Errorf("entries = %+v", es)
	}
	if got, want := strings.Join(paths(decodeList(t, list("path", "/a", "depth", "2"))), ","),
		"/a/sub,/a/sub/deeper,/a/sub/y.txt,/a/x.txt"; got != want {
		t.Errorf("depth 2 = %s, want %s", got, want)
	}
	// Depth above the cap is clamped; symlinked dirs are listed, not entered.
	es = decodeList(t, list("path", "/", "depth", "1000"))
	if got, want := strings.Join(paths(es), ","),
		"/a,/a/sub,/a/sub/deeper,/a/sub/deeper/z.txt,/a/sub/y.txt,/a/x.txt,/alink,/b.txt,/empty"; got != want {
		t.Errorf("full = %s, want %s", got, want)
	}
	if es[6].Type != "symlink" || es[6].Target != "a" {
		t.Errorf("alink = %+v", es[6])
	}
	// Listing through an in-volume symlink works and keeps the asked path.
	if got, want := strings.Join(paths(decodeList(t, list("path", "/alink"))), ","), "/alink/sub,/alink/x.txt"; got != want {
		t.Errorf("via link = %s, want %s", got, want)
	}
	r = list("path", "/empty")
	wantStatus(t, r, 200)
	if strings.TrimSpace(string(r.body)) != "[]" {
		t.Errorf("empty dir = %s, want []", r.body)
	}
	wantError(t, list("path", "/b.txt"), 400, "path /b.txt is not a directory")
	wantError(t, list("path", "/nope"), 404, "path /nope not found")
}

func TestMakeDir(t *testing.T) {
	requireRoot(t)
	e := newEnv(t)
	mk := func(kv ...string) resp { return e.do("POST", e.url("dir", kv...), nil) }

	r := mk("path", "/d")
	wantStatus(t, r, 201)
	got := decodeEntry(t, r)
	if got.Type != "directory" || got.Path != "/d" || got.Name != "d" || got.Mode != 0o755 {
		t.Errorf("mkdir = %+v", got)
	}
	wantError(t, mk("path", "/d"), 409, "already exists")
	wantError(t, mk("path", "/"), 409, "already exists")
	wantError(t, mk("path", "/x/y/z"), 404, "parent directory /x/y of /x/y/z not found")

	got = decodeEntry(t, mk("path", "/d/m", "mode", "448", "uid", "1000", "gid", "1001"))
	if got.Mode != 0o700 || got.UID != 1000 || got.GID != 1001 {
		t.Errorf("mkdir with attrs = %+v", got)
	}
	got = decodeEntry(t, mk("path", "/d/sticky", "mode", "01777"))
	if got.Mode != 0o1777 {
		t.Errorf("octal sticky mode = %o", got.Mode)
	}

	// force = mkdir -p: parents 0755, attrs on the created chain, last gets mode.
	r = mk("path", "/x/y/z", "force", "true", "mode", "504", "uid", "1000", "gid", "1000")
	wantStatus(t, r, 201)
	got = decodeEntry(t, r)
	if got.Mode != 0o770 || got.UID != 1000 || got.Path != "/x/y/z" {
		t.Errorf("mkdir -p = %+v", got)
	}
	for _, p := range []string{"x", "x/y"} {
		fi, err := os.Stat(e.path(p))
		if err != nil {
			t.Fatal(err)
		}
		if st := fi.Sys().(*syscall.Stat_t); st.Mode&0o7777 != 0o755 || st.Uid != 1000 {
			t.Errorf("parent %s mode=%o uid=%d", p, st.Mode&0o7777, st.Uid)
		}
	}
	// Existing directory is fine with force, and left unchanged.
	got = decodeEntry(t, mk("path", "/d", "force", "true", "mode", "511"))
	if got.Mode != 0o755 {
		t.Errorf("force on existing changed mode: %o", got.Mode)
	}
	wantStatus(t, mk("path", "/", "force", "1"), 201)

	e.writeHost("file", "x")
	wantError(t, mk("path", "/file", "force", "true"), 409, "not a directory")
	wantError(t, mk("path", "/file/sub", "force", "true"), 409, "path /file exists and is not a directory")
	wantError(t, mk("path", "/file"), 409, "already exists")
}

func TestReadFile(t *testing.T) {
	e := newEnv(t)
	e.writeHost("dir/f.bin", "0123456789")
	if err := os.Symlink("dir/f.bin", e.path("ln")); err != nil {
		t.Fatal(err)
	}

	r := e.do("GET", e.url("file", "path", "/dir/f.bin"), nil)
	wantStatus(t, r, 200)
	if string(r.body) != "0123456789" || r.header.Get("Content-Type") != "application/octet-stream" {
		t.Errorf("read = %q (%s)", r.body, r.header.Get("Content-Type"))
	}
	r = e.doRaw("GET", e.url("file", "path", "/dir/f.bin"), nil, testToken, "Range", "bytes=2-4")
	wantStatus(t, r, 206)
	if string(r.body) != "234" {
		t.Errorf("range = %q", r.body)
	}
	if r = e.do("GET", e.url("file", "path", "/ln"), nil); string(r.body) != "0123456789" {
		t.Errorf("via in-volume symlink = %d %q", r.status, r.body)
	}
	// .html must not be sniffed into text/html.
	e.writeHost("x.html", "<b>hi</b>")
	if ct := e.do("GET", e.url("file", "path", "/x.html"), nil).header.Get("Content-Type"); ct != "application/octet-stream" {
		t.Errorf("html Content-Type = %q", ct)
	}

	wantError(t, e.do("GET", e.url("file", "path", "/dir"), nil), 400, "path /dir is a directory")
	wantError(t, e.do("GET", e.url("file", "path", "/"), nil), 400, "is a directory")
	wantError(t, e.do("GET", e.url("file", "path", "/nope"), nil), 404, "path /nope not found")

	// A planted FIFO must not hang the request.
	if err := syscall.Mkfifo(e.path("fifo"), 0o644); err != nil {
		t.Fatal(err)
	}
	wantError(t, e.do("GET", e.url("file", "path", "/fifo"), nil), 400, "not a regular file")
}

func TestWriteFile(t *testing.T) {
	requireRoot(t)
	e := newEnv(t)
	put := func(body string, kv ...string) resp {
		return e.doRaw("PUT", e.url("file", kv...), strings.NewReader(body), testToken, "Content-Type", "application/octet-stream")
	}

	r := put("hello", "path", "/a.txt")
	wantStatus(t, r, 201)
	got := decodeEntry(t, r)
	if got.Type != "file" || got.Path != "/a.txt" || got.Name != "a.txt" || got.Size != 5 || got.Mode != 0o644 {
		t.Errorf("put = %+v", got)
	}
	if e.readHost("a.txt") != "hello" {
		t.Error("content mismatch")
	}
	// Overwrite, with attributes.
	got = decodeEntry(t, put("bye", "path", "/a.txt", "mode", "1005", "uid", "1000", "gid", "1002")) // 0o1755
	if got.Size != 3 || got.Mode != 0o1755 || got.UID != 1000 || got.GID != 1002 {
		t.Errorf("overwrite = %+v", got)
	}
	if e.readHost("a.txt") != "bye" {
		t.Error("overwrite content mismatch")
	}
	// Empty body makes an empty file.
	if got = decodeEntry(t, put("", "path", "/empty")); got.Size != 0 || got.Type != "file" {
		t.Errorf("empty = %+v", got)
	}

	wantError(t, put("x", "path", "/no/such/dir/f"), 404, "parent directory /no/such/dir of /no/such/dir/f not found")
	if _, err := os.Stat(e.path("no")); err == nil {
		t.Error("parents created without force")
	}
	r = put("deep", "path", "/p/q/r.txt", "force", "true", "uid", "1000", "gid", "1000")
	wantStatus(t, r, 201)
	if e.readHost("p/q/r.txt") != "deep" {
		t.Error("force content mismatch")
	}
	for _, p := range []string{"p", "p/q"} {
		fi, _ := os.Stat(e.path(p))
		if st := fi.Sys().(*syscall.Stat_t); st.Mode&0o7777 != 0o755 || st.Uid != 1000 {
			t.Errorf("created parent %s mode=%o uid=%d", p, st.Mode&0o7777, st.Uid)
		}
	}
	wantError(t, put("x", "path", "/p"), 409, "path /p is a directory")
	wantError(t, put("x", "path", "/"), 400, "root")
	wantError(t, put("x", "path", "/a.txt/sub"), 409, "not a directory")

	// Writing onto an in-volume symlink replaces the link, not its target.
	e.writeHost("target", "orig")
	if err := os.Symlink("target", e.path("ln")); err != nil {
		t.Fatal(err)
	}
	got = decodeEntry(t, put("new", "path", "/ln"))
	if got.Type != "file" || e.readHost("target") != "orig" || e.readHost("ln") != "new" {
		t.Errorf("put over symlink = %+v, target %q", got, e.readHost("target"))
	}
	e.assertNoTemp()
}

func (e *env) assertNoTemp() {
	e.t.Helper()
	e.waitIdle()
	_ = filepath.Walk(e.dir, func(p string, _ os.FileInfo, err error) error {
		if err == nil && strings.HasPrefix(filepath.Base(p), tmpPrefix) {
			e.t.Errorf("temp file left behind: %s", p)
		}
		return nil
	})
}

// patternReader yields n deterministic bytes in small, uneven reads.
type patternReader struct{ n, off int64 }

func (p *patternReader) Read(b []byte) (int, error) {
	if p.off >= p.n {
		return 0, io.EOF
	}
	b = b[:min(int64(len(b)), p.n-p.off, 7777)]
	for i := range b {
		b[i] = byte((p.off + int64(i)) * 31 % 251)
	}
	p.off += int64(len(b))
	return len(b), nil
}

func TestWriteFileLargeChunked(t *testing.T) {
	e := newEnv(t)
	const size = 20 << 20
	want := sha256.New()
	if _, err := io.Copy(want, &patternReader{n: size}); err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequest("PUT", e.url("file", "path", "/big.bin"), io.NopCloser(&patternReader{n: size}))
	req.Header.Set("Authorization", "Bearer "+testToken)
	req.Header.Set("Content-Type", "application/octet-stream")
	req.ContentLength = -1 // unknown length: sent chunked
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != 201 {
		t.Fatalf("status %d: %s", res.StatusCode, body)
	}
	var got EntryStat
	if err := json.Unmarshal(body, &got); err != nil || got.Size != size {
		t.Fatalf("entry %s: %v", body, err)
	}
	f, err := os.Open(e.path("big.bin"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(h.Sum(nil), want.Sum(nil)) {
		t.Error("uploaded content differs")
	}
	// And read it back streamed.
	res2 := e.do("GET", e.url("file", "path", "/big.bin"), nil)
	if s := sha256.Sum256(res2.body); !bytes.Equal(s[:], want.Sum(nil)) {
		t.Error("downloaded content differs")
	}
}

type failingReader struct {
	r   io.Reader
	err error
}

func (f *failingReader) Read(b []byte) (int, error) {
	n, err := f.r.Read(b)
	if err == io.EOF {
		return n, f.err
	}
	return n, err
}

func TestWriteFileAtomic(t *testing.T) {
	e := newEnv(t)
	e.writeHost("keep.txt", "old content")
	req, _ := http.NewRequest("PUT", e.url("file", "path", "/keep.txt"),
		io.NopCloser(&failingReader{r: &patternReader{n: 3 << 20}, err: errors.New("client gave up")}))
	req.Header.Set("Authorization", "Bearer "+testToken)
	req.ContentLength = -1
	if res, err := http.DefaultClient.Do(req); err == nil {
		res.Body.Close()
		if res.StatusCode < 400 {
			t.Fatalf("aborted upload answered %d", res.StatusCode)
		}
	}
	e.waitIdle()
	if got := e.readHost("keep.txt"); got != "old content" {
		t.Errorf("aborted upload changed the file: %d bytes", len(got))
	}
	e.assertNoTemp()

	// Declared length longer than what is sent: same outcome.
	req, _ = http.NewRequest("PUT", e.url("file", "path", "/keep.txt"),
		io.NopCloser(&failingReader{r: strings.NewReader("short"), err: errors.New("boom")}))
	req.Header.Set("Authorization", "Bearer "+testToken)
	req.ContentLength = 1000
	if res, err := http.DefaultClient.Do(req); err == nil {
		res.Body.Close()
	}
	e.waitIdle()
	if got := e.readHost("keep.txt"); got != "old content" {
		t.Errorf("truncated upload changed the file: %q", got)
	}
	e.assertNoTemp()
}

func TestMaxUploadSize(t *testing.T) {
	e := newEnv(t, WithMaxUploadSize(10))
	e.writeHost("f", "old")
	wantStatus(t, e.do("PUT", e.url("file", "path", "/f"), strings.NewReader("0123456789")), 201)
	wantError(t, e.do("PUT", e.url("file", "path", "/f"), strings.NewReader("0123456789A")), 413, "exceeds")
	if e.readHost("f") != "0123456789" {
		t.Error("oversized upload changed the file")
	}
	e.assertNoTemp()
}

func sha(t *testing.T, p string) [32]byte {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return sha256.Sum256(b)
}

// TestSymlinkEscape plants the links a hostile sandbox could create and
// checks that no route reads, writes, lists, deletes or changes anything
// outside the volume.
func TestSymlinkEscape(t *testing.T) {
	requireRoot(t)
	e := newEnv(t)
	outside := filepath.Join(filepath.Dir(e.dir), "outside")
	if err := os.Mkdir(outside, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(outside, "secret"), []byte("TOPSECRET"), 0o600); err != nil {
		t.Fatal(err)
	}
	for link, target := range map[string]string{
		"etc":    "/etc",
		"passwd": "/etc/passwd",
		"out":    outside,
		"up":     "../outside",
		"uproot": "../../../../../../../..",
		"loop":   "loop",
	} {
		if err := os.Symlink(target, e.path(link)); err != nil {
			t.Fatal(err)
		}
	}
	passwdSum := sha(t, "/etc/passwd")
	passwdFi, _ := os.Stat("/etc/passwd")
	passwdSt := *passwdFi.Sys().(*syscall.Stat_t)
	const forbidden = "resolves outside the volume"

	t.Run("GET file", func(t *testing.T) {
		for _, p := range []string{"/etc/passwd", "/passwd", "/out/secret", "/up/secret", "/uproot/etc/passwd", "/etc/hostname"} {
			r := e.do("GET", e.url("file", "path", p), nil)
			wantError(t, r, 403, forbidden)
			if bytes.Contains(r.body, []byte("root:")) || bytes.Contains(r.body, []byte("TOPSECRET")) {
				t.Fatalf("%s leaked content: %s", p, r.body)
			}
		}
		wantError(t, e.do("GET", e.url("file", "path", "/loop"), nil), 400, "symbolic links")
		// ".." in the query is cleaned lexically and stays inside.
		wantError(t, e.do("GET", e.url("file", "path", "/../outside/secret"), nil), 404, "not found")
	})

	t.Run("GET path", func(t *testing.T) {
		got := decodeEntry(t, e.do("GET", e.url("path", "path", "/etc"), nil))
		if got.Type != "symlink" || got.Target != "/etc" {
			t.Errorf("link itself = %+v", got)
		}
		wantError(t, e.do("GET", e.url("path", "path", "/etc/passwd"), nil), 403, forbidden)
		wantError(t, e.do("GET", e.url("path", "path", "/out/secret"), nil), 403, forbidden)
	})

	t.Run("GET dir", func(t *testing.T) {
		for _, p := range []string{"/etc", "/out", "/up", "/uproot", "/etc/ssl"} {
			wantError(t, e.do("GET", e.url("dir", "path", p, "depth", "3"), nil), 403, forbidden)
		}
		es := decodeList(t, e.do("GET", e.url("dir", "path", "/", "depth", "32"), nil))
		for _, en := range es {
			if strings.Count(en.Path, "/") > 1 || en.Type != "symlink" {
				t.Errorf("listing went through a link: %+v", en)
			}
		}
		if len(es) != 6 {
			t.Errorf("listing = %v", paths(es))
		}
	})

	t.Run("PUT file", func(t *testing.T) {
		for _, p := range []string{"/etc/cubicle-escape-test", "/out/new", "/up/new", "/out/secret"} {
			for _, force := range []string{"false", "true"} {
				wantError(t, e.do("PUT", e.url("file", "path", p, "force", force), strings.NewReader("pwned")), 403, forbidden)
			}
		}
		wantError(t, e.do("PUT", e.url("file", "path", "/etc/sub/dir/x", "force", "true"), strings.NewReader("pwned")), 403, forbidden)
		if _, err := os.Lstat("/etc/cubicle-escape-test"); err == nil {
			os.Remove("/etc/cubicle-escape-test")
			t.Fatal("wrote into host /etc")
		}
		if _, err := os.Lstat("/etc/sub"); err == nil {
			t.Fatal("created a directory in host /etc")
		}
		ents, _ := os.ReadDir(outside)
		if len(ents) != 1 {
			t.Errorf("outside dir now holds %d entries", len(ents))
		}
		if b, _ := os.ReadFile(filepath.Join(outside, "secret")); string(b) != "TOPSECRET" {
			t.Error("outside file overwritten")
		}
	})

	t.Run("POST dir", func(t *testing.T) {
		for _, force := range []string{"false", "true"} {
			wantError(t, e.do("POST", e.url("dir", "path", "/etc/cubicle-escape-dir", "force", force), nil), 403, forbidden)
			wantError(t, e.do("POST", e.url("dir", "path", "/out/newdir", "force", force), nil), 403, forbidden)
		}
		if _, err := os.Lstat("/etc/cubicle-escape-dir"); err == nil {
			os.Remove("/etc/cubicle-escape-dir")
			t.Fatal("created a directory in host /etc")
		}
	})

	t.Run("PATCH", func(t *testing.T) {
		wantError(t, e.do("PATCH", e.url("path", "path", "/etc/passwd"), strings.NewReader(`{"mode":511,"uid":1000}`)), 403, forbidden)
		wantError(t, e.do("PATCH", e.url("path", "path", "/out/secret"), strings.NewReader(`{"mode":511}`)), 403, forbidden)
		wantError(t, e.do("PATCH", e.url("path", "path", "/etc/."), strings.NewReader(`{"mode":511}`)), 400, "symlink")
		// chown of the links changes only the links.
		for _, p := range []string{"/passwd", "/etc", "/out"} {
			got := decodeEntry(t, e.do("PATCH", e.url("path", "path", p), strings.NewReader(`{"uid":1000,"gid":1000}`)))
			if got.Type != "symlink" || got.UID != 1000 {
				t.Errorf("lchown %s = %+v", p, got)
			}
		}
		fi, _ := os.Stat("/etc/passwd")
		st := fi.Sys().(*syscall.Stat_t)
		if st.Uid != passwdSt.Uid || st.Gid != passwdSt.Gid || st.Mode != passwdSt.Mode {
			t.Fatalf("host /etc/passwd changed: uid=%d gid=%d mode=%o", st.Uid, st.Gid, st.Mode)
		}
		fi, _ = os.Stat("/etc")
		if st := fi.Sys().(*syscall.Stat_t); st.Uid != 0 || st.Mode&0o7777 != 0o755 {
			t.Fatalf("host /etc changed: uid=%d mode=%o", st.Uid, st.Mode&0o7777)
		}
		fi, _ = os.Stat(filepath.Join(outside, "secret"))
		if st := fi.Sys().(*syscall.Stat_t); st.Uid != 0 || st.Mode&0o777 != 0o600 {
			t.Errorf("outside file changed: uid=%d mode=%o", st.Uid, st.Mode)
		}
	})

	t.Run("DELETE", func(t *testing.T) {
		wantError(t, e.do("DELETE", e.url("path", "path", "/etc/passwd"), nil), 403, forbidden)
		wantError(t, e.do("DELETE", e.url("path", "path", "/out/secret"), nil), 403, forbidden)
		wantError(t, e.do("DELETE", e.url("path", "path", "/uproot/tmp"), nil), 403, forbidden)
		// Deleting a link removes the link only.
		for _, p := range []string{"/out", "/etc", "/passwd", "/uproot"} {
			wantStatus(t, e.do("DELETE", e.url("path", "path", p), nil), 204)
			if _, err := os.Lstat(e.path(p)); !os.IsNotExist(err) {
				t.Errorf("link %s still there", p)
			}
		}
		if b, _ := os.ReadFile(filepath.Join(outside, "secret")); string(b) != "TOPSECRET" {
			t.Error("outside file deleted")
		}
		if _, err := os.Stat("/etc/hostname"); err != nil && !os.IsNotExist(err) {
			t.Error(err)
		}
	})

	if sha(t, "/etc/passwd") != passwdSum {
		t.Fatal("host /etc/passwd content changed")
	}
}

// TestEscapeSentinel pins that escapes are recognised by os.Root's own error
// value, not only by its message text.
func TestEscapeSentinel(t *testing.T) {
	e := newEnv(t)
	wantStatus(t, e.do("GET", e.url("path", "path", "/"), nil), 200)
	h := e.srv.Config.Handler.(*handler)
	if h.escapeErr == nil {
		t.Fatal("escape sentinel not captured")
	}
	root, err := os.OpenRoot(e.dir)
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	if err := os.Symlink("/", e.path("esc")); err != nil {
		t.Fatal(err)
	}
	_, err = root.Stat("esc/etc")
	if !errors.Is(err, h.escapeErr) {
		t.Fatalf("root.Stat through escaping link = %v, not the sentinel", err)
	}
}

// An upload into a volume that fills up is a 507 (not a 400 blaming the
// client's body), the partial upload is removed, and the files already
// there are intact. The volume is a real 8 MiB sized image.
func TestUploadPastVolumeSize(t *testing.T) {
	testenv.RequireRoot(t, "to mount an image")
	e := newEnv(t)
	img := filepath.Join(t.TempDir(), "vol.img")
	if err := diskimage.Create(t.Context(), img, 8); err != nil {
		t.Fatal(err)
	}
	if err := diskimage.Mount(t.Context(), img, e.dir); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := diskimage.Release(img); err != nil {
			t.Error(err)
		}
	})
	e.writeHost("keep", "precious")
	r := e.do("PUT", e.url("file", "path", "/big"), bytes.NewReader(make([]byte, 16<<20)))
	var body struct{ Code, Message string }
	if r.status != http.StatusInsufficientStorage || json.Unmarshal(r.body, &body) != nil || body.Code != "507" || body.Message == "" {
		t.Fatalf("16 MiB into 8 MiB: %d %s, want 507 {code, message}", r.status, r.body)
	}
	e.waitIdle()
	ents, err := os.ReadDir(e.dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, de := range ents {
		names = append(names, de.Name())
	}
	if strings.Join(names, ",") != "keep,lost+found" || e.readHost("keep") != "precious" {
		t.Fatalf("after the failed upload: %v", names)
	}
	if r := e.do("PUT", e.url("file", "path", "/small"), strings.NewReader("fits")); r.status != http.StatusCreated {
		t.Fatalf("small upload after: %d %s", r.status, r.body)
	}
}
