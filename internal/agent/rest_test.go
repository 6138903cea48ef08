package agent

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"mime/multipart"
	"net/http"
	"net/textproto"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/sys/unix"

	pb "github.com/cubicle-dev/cubicle/sdk/go/envd/process"

	"github.com/cubicle-dev/cubicle/internal/agentapi"
)

func (e *testEnv) do(t *testing.T, method, path string, body io.Reader, hdr map[string]string) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, e.srv.URL+path, body)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := e.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, b
}

func (e *testEnv) tok() map[string]string { return map[string]string{"X-Access-Token": e.token} }

func checkJSONError(t *testing.T, resp *http.Response, body []byte, status int) {
	t.Helper()
	if resp.StatusCode != status {
		t.Fatalf("status %d want %d: %s", resp.StatusCode, status, body)
	}
	var v struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	}
	if err := json.Unmarshal(body, &v); err != nil || v.Code != status || v.Message == "" {
		t.Fatalf("bad error body %q (%v)", body, err)
	}
}

func TestHealthTokenEnvsMetrics(t *testing.T) {
	e := newTestEnv(t, testToken)
	if resp, _ := e.do(t, "GET", "/health", nil, nil); resp.StatusCode != 204 {
		t.Fatalf("health %d", resp.StatusCode)
	}
	resp, body := e.do(t, "GET", "/envs", nil, nil)
	checkJSONError(t, resp, body, 401)
	resp, body = e.do(t, "GET", "/envs", nil, map[string]string{"X-Access-Token": "wrong"})
	checkJSONError(t, resp, body, 401)
	resp, body = e.do(t, "POST", "/process.Process/List", strings.NewReader("{}"), map[string]string{"Content-Type": "application/json"})
	checkJSONError(t, resp, body, 401)
	resp, body = e.do(t, "GET", "/envs", nil, e.tok())
	if resp.StatusCode != 200 || strings.TrimSpace(string(body)) != "{}" {
		t.Fatalf("envs %d %s", resp.StatusCode, body)
	}
	resp, body = e.do(t, "GET", "/metrics", nil, e.tok())
	var m map[string]any
	if resp.StatusCode != 200 || json.Unmarshal(body, &m) != nil {
		t.Fatalf("metrics %d %s", resp.StatusCode, body)
	}
	for _, k := range []string{"ts", "cpu_count", "cpu_used_pct", "mem_total", "mem_used", "mem_cache", "mem_total_mib", "mem_used_mib", "disk_used", "disk_total"} {
		if _, ok := m[k]; !ok {
			t.Fatalf("metrics lacks %s: %s", k, body)
		}
	}
	if m["mem_total"].(float64) <= 0 || m["disk_total"].(float64) <= 0 || m["cpu_count"].(float64) < 1 {
		t.Fatalf("implausible metrics %s", body)
	}
	// CORS preflight needs no token.
	resp, _ = e.do(t, "OPTIONS", "/process.Process/Start", nil, map[string]string{"Origin": "http://x", "Access-Control-Request-Method": "POST"})
	if resp.StatusCode != 204 || resp.Header.Get("Access-Control-Allow-Origin") != "*" {
		t.Fatalf("preflight %d %v", resp.StatusCode, resp.Header)
	}
	// Bad Basic user → 401.
	resp, body = e.do(t, "GET", "/envs", nil, map[string]string{"X-Access-Token": e.token, "Authorization": basicUser("ghost")})
	checkJSONError(t, resp, body, 401)
}

func TestAgentWithoutTokenRefusesEverything(t *testing.T) {
	e := newTestEnv(t, "")
	for _, c := range []struct{ method, path, body string }{
		{"GET", "/envs", ""},
		{"POST", "/init", `{"accessToken":"mine"}`},
		{"POST", "/process.Process/List", `{}`},
		{"GET", "/files?path=/etc/hostname", ""},
	} {
		hdr := map[string]string{"Content-Type": "application/json", "X-Access-Token": ""}
		resp, b := e.do(t, c.method, c.path, strings.NewReader(c.body), hdr)
		if resp.StatusCode != 401 {
			t.Fatalf("%s %s without a token: %d %s", c.method, c.path, resp.StatusCode, b)
		}
	}
}

func TestInit(t *testing.T) {
	e := newTestEnv(t, testToken)
	post := func(body string, hdr map[string]string) int {
		if hdr == nil {
			hdr = map[string]string{}
		}
		hdr["Content-Type"] = "application/json"
		resp, _ := e.do(t, "POST", "/init", strings.NewReader(body), hdr)
		return resp.StatusCode
	}
	body := `{"accessToken":"t1","envVars":{"A":"1"},"defaultUser":"root","defaultWorkdir":"/","timestamp":"2026-01-01T00:00:00Z","volumeMounts":[],"lifecycleID":"x"}`
	// The agent starts with its token: even the first /init needs it, so
	// whoever reaches a new sandbox first cannot take it over.
	if c := post(body, nil); c != 401 {
		t.Fatalf("first init without the start token %d", c)
	}
	if c := post(body, map[string]string{"X-Access-Token": testToken}); c != 204 {
		t.Fatalf("first init %d", c)
	}
	// Idempotent: same body again.
	if c := post(body, nil); c != 204 {
		t.Fatalf("repeat init %d", c)
	}
	// A different token without proof of the current one is refused.
	if c := post(`{"accessToken":"evil"}`, nil); c != 401 {
		t.Fatalf("takeover init %d", c)
	}
	// With the current token in X-Access-Token it rotates.
	if c := post(`{"accessToken":"t2","envVars":{"B":"2"}}`, map[string]string{"X-Access-Token": "t1"}); c != 204 {
		t.Fatalf("rotate init %d", c)
	}
	e.token = "t2"
	resp, b := e.do(t, "GET", "/envs", nil, e.tok())
	if resp.StatusCode != 200 || !strings.Contains(string(b), `"A":"1"`) || !strings.Contains(string(b), `"B":"2"`) {
		t.Fatalf("envs after init %d %s", resp.StatusCode, b)
	}
	// defaultUser root and defaultWorkdir / now apply to processes.
	r := e.run(context.Background(), bash(`echo "$(id -u) $(pwd) $A"`))
	if trim(r.stdout) != "0 / 1" {
		t.Fatalf("after init: %q %v", r.stdout, r.err)
	}
	if c := post(`{"defaultUser":"ghost"}`, map[string]string{"X-Access-Token": "t2"}); c != 400 {
		t.Fatalf("unknown default user %d", c)
	}
}

func multipartBody(t *testing.T, files map[string]string, order []string) (string, *bytes.Buffer) {
	t.Helper()
	var buf bytes.Buffer
	mw := multipart.NewWriter(&buf)
	for _, name := range order {
		h := textproto.MIMEHeader{}
		h.Set("Content-Disposition", fmt.Sprintf(`form-data; name="file"; filename=%q`, name))
		h.Set("Content-Type", "application/octet-stream")
		w, err := mw.CreatePart(h)
		if err != nil {
			t.Fatal(err)
		}
		io.WriteString(w, files[name])
	}
	mw.Close()
	return mw.FormDataContentType(), &buf
}

func TestFilesUploadDownload(t *testing.T) {
	e := newTestEnv(t, testToken)
	abs := filepath.Join(e.userHome, "deep/dir/abs.txt")
	files := map[string]string{"rel/one.txt": "one", abs: "two", "empty.txt": ""}
	ct, body := multipartBody(t, files, []string{"rel/one.txt", abs, "empty.txt"})
	hdr := e.tok()
	hdr["Content-Type"] = ct
	hdr["X-Metadata-Owner-Team"] = "infra"
	resp, b := e.do(t, "POST", "/files", body, hdr)
	if resp.StatusCode != 200 {
		t.Fatalf("upload %d %s", resp.StatusCode, b)
	}
	var entries []struct {
		Path, Name, Type string
		Metadata         map[string]string
	}
	if err := json.Unmarshal(b, &entries); err != nil || len(entries) != 3 {
		t.Fatalf("upload response %s", b)
	}
	if entries[0].Path != filepath.Join(e.userHome, "rel/one.txt") || entries[0].Name != "one.txt" || entries[0].Type != "file" || entries[1].Path != abs {
		t.Fatalf("entries %+v", entries)
	}
	for _, en := range entries {
		var st unix.Stat_t
		if err := unix.Stat(en.Path, &st); err != nil || st.Uid != 1000 || st.Gid != 1000 {
			t.Fatalf("%s owner %d:%d %v", en.Path, st.Uid, st.Gid, err)
		}
		val := make([]byte, 64)
		n, err := unix.Getxattr(en.Path, "user.e2b.owner-team", val)
		if err != nil || string(val[:n]) != "infra" {
			t.Fatalf("xattr on %s: %q %v", en.Path, val[:n], err)
		}
	}
	var st unix.Stat_t
	if err := unix.Stat(filepath.Join(e.userHome, "deep"), &st); err != nil || st.Uid != 1000 {
		t.Fatalf("parent dir owner %d %v", st.Uid, err)
	}

	// Download: plain, Content-Disposition, empty file.
	resp, b = e.do(t, "GET", "/files?path=rel/one.txt", nil, e.tok())
	if resp.StatusCode != 200 || string(b) != "one" || !strings.Contains(resp.Header.Get("Content-Disposition"), `filename=one.txt`) {
		t.Fatalf("download %d %q %v", resp.StatusCode, b, resp.Header)
	}
	resp, b = e.do(t, "GET", "/files?path=empty.txt", nil, e.tok())
	if resp.StatusCode != 200 || len(b) != 0 || resp.Header.Get("Content-Length") != "0" {
		t.Fatalf("empty download %d %v", resp.StatusCode, resp.Header)
	}
	// Range.
	big := strings.Repeat("0123456789", 100)
	writeFileT(t, filepath.Join(e.userHome, "r.txt"), big)
	hr := e.tok()
	hr["Range"] = "bytes=10-19"
	resp, b = e.do(t, "GET", "/files?path=r.txt", nil, hr)
	if resp.StatusCode != 206 || string(b) != "0123456789" {
		t.Fatalf("range %d %q", resp.StatusCode, b)
	}
	// gzip on request (raw transport so Go does not decode transparently).
	req, _ := http.NewRequest("GET", e.srv.URL+"/files?path=r.txt", nil)
	req.Header.Set("X-Access-Token", e.token)
	req.Header.Set("Accept-Encoding", "gzip")
	gresp, err := (&http.Transport{DisableCompression: true}).RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	if gresp.Header.Get("Content-Encoding") != "gzip" {
		t.Fatalf("no gzip: %v", gresp.Header)
	}
	zr, err := gzip.NewReader(gresp.Body)
	if err != nil {
		t.Fatal(err)
	}
	plain, _ := io.ReadAll(zr)
	gresp.Body.Close()
	if string(plain) != big {
		t.Fatal("gzip download mismatch")
	}
	h406 := e.tok()
	h406["Accept-Encoding"] = "identity;q=0"
	resp, _ = e.do(t, "GET", "/files?path=r.txt", nil, h406)
	if resp.StatusCode != 406 {
		t.Fatalf("406 case %d", resp.StatusCode)
	}

	// Errors.
	resp, b = e.do(t, "GET", "/files?path=nothing-here", nil, e.tok())
	checkJSONError(t, resp, b, 404)
	resp, b = e.do(t, "GET", "/files?path=deep", nil, e.tok())
	checkJSONError(t, resp, b, 400)
	resp, b = e.do(t, "GET", "/files?path="+url.QueryEscape("a\x00b"), nil, e.tok())
	checkJSONError(t, resp, b, 400)
	resp, b = e.do(t, "GET", "/files?path=rel/one.txt", nil, nil)
	checkJSONError(t, resp, b, 401)
	resp, b = e.do(t, "GET", "/files?path=rel/one.txt&username=ghost", nil, e.tok())
	checkJSONError(t, resp, b, 401)
	// Traversal out of home lands on a real absolute path, checked as the user:
	// root's 0700 home is not readable by uid 1000.
	secret := filepath.Join(e.root, "root", "secret")
	writeFileT(t, secret, "s")
	resp, b = e.do(t, "GET", "/files?path="+url.QueryEscape("../../root/secret"), nil, e.tok())
	checkJSONError(t, resp, b, 403)
	resp, b = e.do(t, "GET", "/files?path="+url.QueryEscape(secret)+"&username=root", nil, e.tok())
	if resp.StatusCode != 200 || string(b) != "s" {
		t.Fatalf("root read %d", resp.StatusCode)
	}
	hdr = e.tok()
	hdr["Content-Type"] = "application/octet-stream"
	resp, b = e.do(t, "POST", "/files?path="+url.QueryEscape(filepath.Join(e.root, "root", "planted")), strings.NewReader("x"), hdr)
	checkJSONError(t, resp, b, 403)

	// Two parts for one path → 400.
	ct, body = multipartBody(t, map[string]string{"dup.txt": "a"}, []string{"dup.txt", "dup.txt"})
	hdr = e.tok()
	hdr["Content-Type"] = ct
	resp, b = e.do(t, "POST", "/files", body, hdr)
	checkJSONError(t, resp, b, 400)
	// Single-file write with path= overrides the filename.
	ct, body = multipartBody(t, map[string]string{"ignored": "via-path"}, []string{"ignored"})
	hdr["Content-Type"] = ct
	resp, b = e.do(t, "POST", "/files?path=named.txt", body, hdr)
	if got, _ := os.ReadFile(filepath.Join(e.userHome, "named.txt")); resp.StatusCode != 200 || string(got) != "via-path" {
		t.Fatalf("path= upload %d %s", resp.StatusCode, b)
	}
	// Upload onto a directory → 400.
	hdr = e.tok()
	hdr["Content-Type"] = "application/octet-stream"
	resp, b = e.do(t, "POST", "/files?path=deep", strings.NewReader("x"), hdr)
	checkJSONError(t, resp, b, 400)
	// Bad metadata → 400.
	hdr["X-Metadata-Bad"] = "caf\xc3\xa9"
	resp, b = e.do(t, "POST", "/files?path=m.txt", strings.NewReader("x"), hdr)
	checkJSONError(t, resp, b, 400)
}

func TestFilesOctetStreamGzip(t *testing.T) {
	e := newTestEnv(t, testToken)
	var zb bytes.Buffer
	zw := gzip.NewWriter(&zb)
	io.WriteString(zw, "compressed payload")
	zw.Close()
	hdr := e.tok()
	hdr["Content-Type"] = "application/octet-stream"
	hdr["Content-Encoding"] = "gzip"
	resp, b := e.do(t, "POST", "/files?path=z/out.txt", &zb, hdr)
	if resp.StatusCode != 200 {
		t.Fatalf("octet gzip %d %s", resp.StatusCode, b)
	}
	got, err := os.ReadFile(filepath.Join(e.userHome, "z/out.txt"))
	if err != nil || string(got) != "compressed payload" {
		t.Fatalf("content %q %v", got, err)
	}
	delete(hdr, "Content-Encoding")
	resp, b = e.do(t, "POST", "/files", strings.NewReader("x"), hdr)
	checkJSONError(t, resp, b, 400) // octet-stream needs path
}

func TestFilesSignature(t *testing.T) {
	e := newTestEnv(t, testToken)
	p := filepath.Join(e.userHome, "signed.txt")
	writeFileT(t, p, "signed")
	get := func(q string) int {
		resp, _ := e.do(t, "GET", "/files?"+q, nil, nil)
		return resp.StatusCode
	}
	sig := agentapi.Signature(p, "read", "", testToken, 0)
	if c := get("path=" + url.QueryEscape(p) + "&signature=" + url.QueryEscape(sig)); c != 200 {
		t.Fatalf("valid signature %d", c)
	}
	exp := time.Now().Add(time.Minute).Unix()
	sig = agentapi.Signature(p, "read", "user", testToken, exp)
	if c := get(fmt.Sprintf("path=%s&username=user&signature=%s&signature_expiration=%d", url.QueryEscape(p), url.QueryEscape(sig), exp)); c != 200 {
		t.Fatalf("valid expiring signature %d", c)
	}
	// Refusals carry envd's status and texts (auth.go validateSigning).
	envdRefusal := func(q string, hdr map[string]string, want string) {
		t.Helper()
		resp, b := e.do(t, "GET", "/files?"+q, nil, hdr)
		checkJSONError(t, resp, b, 401)
		var v struct{ Message string }
		if json.Unmarshal(b, &v); v.Message != want {
			t.Fatalf("%s: message %q want %q", q, v.Message, want)
		}
	}
	old := time.Now().Add(-time.Minute).Unix()
	sig = agentapi.Signature(p, "read", "", testToken, old)
	envdRefusal(fmt.Sprintf("path=%s&signature=%s&signature_expiration=%d", url.QueryEscape(p), url.QueryEscape(sig), old), nil, "signature is already expired")
	// An expiration the signature does not cover is an invalid signature,
	// not an expired one.
	envdRefusal(fmt.Sprintf("path=%s&signature=%s&signature_expiration=%d", url.QueryEscape(p), url.QueryEscape(agentapi.Signature(p, "read", "", testToken, 0)), old), nil, "invalid signature")
	envdRefusal("path="+url.QueryEscape(p), nil, "missing signature query parameter")
	envdRefusal("path="+url.QueryEscape(p), map[string]string{"X-Access-Token": "wrong"}, "access token present in header but does not match")
	// Write signature used for read, wrong token, tampered path, empty.
	for _, s := range []string{agentapi.Signature(p, "write", "", testToken, 0), agentapi.Signature(p, "read", "", "other", 0), "v1_garbage", ""} {
		envdRefusal("path="+url.QueryEscape(p)+"&signature="+url.QueryEscape(s), nil, "invalid signature")
	}
	// Signed upload.
	sig = agentapi.Signature("up.txt", "write", "", testToken, 0)
	resp, b := e.do(t, "POST", "/files?path=up.txt&signature="+url.QueryEscape(sig), strings.NewReader("u"), map[string]string{"Content-Type": "application/octet-stream"})
	if resp.StatusCode != 200 {
		t.Fatalf("signed upload %d %s", resp.StatusCode, b)
	}
	// Known vector: the expected value is computed independently.
	sum := sha256.Sum256([]byte("/a:read:user:tok:5"))
	want := "v1_" + strings.TrimRight(b64raw(sum[:]), "=")
	if got := agentapi.Signature("/a", "read", "user", "tok", 5); got != want {
		t.Fatalf("signature %s want %s", got, want)
	}
}

// patternReader yields n pseudo-random bytes without holding them.
type patternReader struct {
	r *rand.ChaCha8
	n int64
}

func (p *patternReader) Read(b []byte) (int, error) {
	if p.n <= 0 {
		return 0, io.EOF
	}
	if int64(len(b)) > p.n {
		b = b[:p.n]
	}
	n, _ := p.r.Read(b)
	p.n -= int64(n)
	return n, nil
}

func TestFilesLargeStreamingBoundedMemory(t *testing.T) {
	e := newTestEnv(t, testToken)
	size := int64(100 << 20)
	if raceEnabled {
		size = 16 << 20 // the race detector makes 100 MiB take minutes
	}
	seed := [32]byte{1, 2, 3}
	src := &patternReader{r: rand.NewChaCha8(seed), n: size}
	wantHash := sha256.New()
	pr, pw := io.Pipe()
	mw := multipart.NewWriter(pw)
	go func() {
		part, err := mw.CreateFormFile("file", "big.bin")
		if err == nil {
			_, err = io.Copy(io.MultiWriter(part, wantHash), src)
		}
		if err == nil {
			err = mw.Close()
		}
		pw.CloseWithError(err)
	}()

	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	base := ms.HeapInuse
	var peak atomic.Uint64
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		tk := time.NewTicker(5 * time.Millisecond)
		defer tk.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tk.C:
				var m runtime.MemStats
				runtime.ReadMemStats(&m)
				if m.HeapInuse > peak.Load() {
					peak.Store(m.HeapInuse)
				}
			}
		}
	}()
	hdr := e.tok()
	hdr["Content-Type"] = mw.FormDataContentType()
	resp, b := e.do(t, "POST", "/files?path=big.bin", pr, hdr)
	if resp.StatusCode != 200 {
		t.Fatalf("upload %d %s", resp.StatusCode, b)
	}
	// Download, hashing as it streams.
	req, _ := http.NewRequest("GET", e.srv.URL+"/files?path=big.bin", nil)
	req.Header.Set("X-Access-Token", e.token)
	dresp, err := e.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	gotHash := sha256.New()
	n, err := io.Copy(gotHash, dresp.Body)
	dresp.Body.Close()
	close(stop)
	<-sampled
	if err != nil || n != size {
		t.Fatalf("download %d bytes: %v", n, err)
	}
	if !bytes.Equal(gotHash.Sum(nil), wantHash.Sum(nil)) {
		t.Fatal("content mismatch")
	}
	growth := int64(peak.Load()) - int64(base)
	t.Logf("heap in use: base %d MiB, peak growth %d MiB for a %d MiB file", base>>20, growth>>20, size>>20)
	if growth > 24<<20 {
		t.Fatalf("heap grew by %d MiB; file is buffered", growth>>20)
	}
}

// TestConnectEnvelopeRaw speaks the Connect streaming protocol by hand, as the
// JS SDK does over HTTP/1.1 with application/connect+json.
func TestConnectEnvelopeRaw(t *testing.T) {
	e := newTestEnv(t, testToken)
	msg := []byte(`{"process":{"cmd":"/bin/bash","args":["-l","-c","echo hi"]},"stdin":false}`)
	var env bytes.Buffer
	env.WriteByte(0)
	binary.Write(&env, binary.BigEndian, uint32(len(msg)))
	env.Write(msg)
	req, _ := http.NewRequest("POST", e.srv.URL+"/process.Process/Start", &env)
	req.Header.Set("Content-Type", "application/connect+json")
	req.Header.Set("Connect-Protocol-Version", "1")
	req.Header.Set("Connect-Timeout-Ms", "10000")
	req.Header.Set("X-Access-Token", e.token)
	req.Header.Set("Authorization", "Basic cm9vdDo=")
	resp, err := e.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/connect+json" {
		t.Fatalf("status %d ct %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	br := bufio.NewReader(resp.Body)
	var frames []string
	var flags []byte
	for i := 0; i < 20; i++ {
		var hdr [5]byte
		if _, err := io.ReadFull(br, hdr[:]); err != nil {
			if err == io.EOF {
				break
			}
			t.Fatal(err)
		}
		payload := make([]byte, binary.BigEndian.Uint32(hdr[1:]))
		if _, err := io.ReadFull(br, payload); err != nil {
			t.Fatal(err)
		}
		flags = append(flags, hdr[0])
		// protojson randomly adds spaces; compare compacted JSON.
		var c bytes.Buffer
		if err := json.Compact(&c, payload); err != nil {
			t.Fatalf("frame %q: %v", payload, err)
		}
		frames = append(frames, c.String())
	}
	if len(frames) < 4 {
		t.Fatalf("frames %q", frames)
	}
	if !strings.HasPrefix(frames[0], `{"event":{"start":{"pid":`) {
		t.Fatalf("first frame %s", frames[0])
	}
	if frames[1] != `{"event":{"data":{"stdout":"aGkK"}}}` {
		t.Fatalf("data frame %s", frames[1])
	}
	if frames[2] != `{"event":{"end":{"exited":true,"status":"exit status 0"}}}` {
		t.Fatalf("end frame %s", frames[2])
	}
	last := len(frames) - 1
	if flags[last] != 0x02 || strings.TrimSpace(frames[last]) != "{}" {
		t.Fatalf("end-of-stream frame flag %#x %s", flags[last], frames[last])
	}
	for _, f := range flags[:last] {
		if f != 0 {
			t.Fatalf("data frame flag %#x", f)
		}
	}

	// Unary error shape.
	resp2, body := e.do(t, "POST", "/process.Process/SendSignal", strings.NewReader(`{"process":{"pid":999999},"signal":"SIGNAL_SIGKILL"}`), map[string]string{"Content-Type": "application/json", "X-Access-Token": e.token})
	var ue struct{ Code, Message string }
	if err := json.Unmarshal(body, &ue); err != nil || resp2.StatusCode != 404 || ue.Code != "not_found" || ue.Message != "process with pid 999999 not found" {
		t.Fatalf("unary error %d %s", resp2.StatusCode, body)
	}
	_ = strconv.Itoa
	_ = pb.Signal_SIGNAL_SIGKILL
	_ = connect.CodeNotFound
}

func TestFileErrStatus(t *testing.T) {
	cases := []struct {
		err  error
		want int
	}{
		{fmt.Errorf("write: %w", &os.PathError{Op: "write", Path: "/x", Err: unix.ENOSPC}), http.StatusInsufficientStorage},
		{&os.PathError{Op: "open", Path: "/x", Err: unix.EDQUOT}, http.StatusInsufficientStorage},
		{&os.PathError{Op: "open", Path: "/x", Err: unix.ENOENT}, http.StatusNotFound},
		{&os.PathError{Op: "open", Path: "/x", Err: unix.EACCES}, http.StatusForbidden},
		{fmt.Errorf("%w: x", ErrIsDir), http.StatusBadRequest},
		{fmt.Errorf("%w: x", ErrInvalidPath), http.StatusBadRequest},
		{fmt.Errorf("other"), http.StatusInternalServerError},
	}
	for _, c := range cases {
		if got := fileErrStatus(c.err); got != c.want {
			t.Errorf("%v: %d want %d", c.err, got, c.want)
		}
	}
}
