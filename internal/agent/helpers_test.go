package agent

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/cubicle-dev/cubicle/internal/testenv"
	"github.com/cubicle-dev/cubicle/sdk/go/envd/filesystem/filesystemconnect"
	pb "github.com/cubicle-dev/cubicle/sdk/go/envd/process"
	"github.com/cubicle-dev/cubicle/sdk/go/envd/process/processconnect"
)

const testToken = "secret-token"

type testEnv struct {
	t        *testing.T
	a        *Agent
	srv      *httptest.Server
	root     string // world-traversable base dir
	userHome string // home of "user" (uid 1000)
	token    string
	proc     processconnect.ProcessClient
	fs       filesystemconnect.FilesystemClient
	h2proc   processconnect.ProcessClient // h2c client for StreamInput
}

// newTestEnv starts an agent on a loopback httptest server with a private user
// database: root (0) and user (1000) whose home lives in a temp dir.
func newTestEnv(t *testing.T, token string) *testEnv {
	t.Helper()
	testenv.RequireRoot(t, "agent tests: setuid, chown")
	base := t.TempDir()
	// t.TempDir and its parent are 0700; uid 1000 must traverse them.
	for _, d := range []string{base, filepath.Dir(base)} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	home := filepath.Join(base, "home", "user")
	if err := os.MkdirAll(home, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(home, 1000, 1000); err != nil {
		t.Fatal(err)
	}
	rootHome := filepath.Join(base, "root")
	if err := os.MkdirAll(rootHome, 0o700); err != nil {
		t.Fatal(err)
	}
	passwd := filepath.Join(base, "passwd")
	group := filepath.Join(base, "group")
	writeFileT(t, passwd, fmt.Sprintf("root:x:0:0:root:%s:/bin/bash\nuser:x:1000:1000:User:%s:/bin/bash\n", rootHome, home))
	writeFileT(t, group, "root:x:0:\nuser:x:1000:\nextra:x:1500:user\n")

	// LogDir: tests must never write the real /var/log/cubicle.
	// Root: /init's egressCA must never touch the host's trust store.
	tree := filepath.Join(base, "tree")
	if err := os.Mkdir(tree, 0o755); err != nil {
		t.Fatal(err)
	}
	a := New(Config{PasswdPath: passwd, GroupPath: group, AccessToken: token, LogDir: filepath.Join(base, "log"), Root: tree})
	srv := httptest.NewUnstartedServer(a.Handler())
	EnableH2C(srv.Config)
	srv.Start()
	t.Cleanup(func() {
		srv.CloseClientConnections()
		srv.Close()
		a.Shutdown()
	})
	e := &testEnv{t: t, a: a, srv: srv, root: base, userHome: home, token: token}
	opts := connect.WithClientOptions(connect.WithProtoJSON(), connect.WithInterceptors(e.authInterceptor()))
	e.proc = processconnect.NewProcessClient(srv.Client(), srv.URL, opts)
	e.fs = filesystemconnect.NewFilesystemClient(srv.Client(), srv.URL, opts)
	h2t := &http.Transport{Protocols: h2cOnly()}
	t.Cleanup(h2t.CloseIdleConnections)
	h2 := &http.Client{Transport: h2t}
	e.h2proc = processconnect.NewProcessClient(h2, srv.URL, opts)
	return e
}

func h2cOnly() *http.Protocols {
	var p http.Protocols
	p.SetUnencryptedHTTP2(true)
	return &p
}

type userKeyT struct{}

// asUserCtx makes RPCs from ctx carry Basic auth for name (as the SDK does).
func asUserCtx(ctx context.Context, name string) context.Context {
	return context.WithValue(ctx, userKeyT{}, name)
}

// authInterceptor adds X-Access-Token and, when requested, Basic auth.
func (e *testEnv) authInterceptor() connect.Interceptor {
	return authIC{e: e}
}

type authIC struct{ e *testEnv }

func (i authIC) set(ctx context.Context, h http.Header) {
	if i.e.token != "" {
		h.Set("X-Access-Token", i.e.token)
	}
	if name, ok := ctx.Value(userKeyT{}).(string); ok {
		h.Set("Authorization", basicUser(name))
	}
	h.Set("Keepalive-Ping-Interval", "1")
}

func (i authIC) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		i.set(ctx, req.Header())
		return next(ctx, req)
	}
}

func (i authIC) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return func(ctx context.Context, spec connect.Spec) connect.StreamingClientConn {
		conn := next(ctx, spec)
		i.set(ctx, conn.RequestHeader())
		return conn
	}
}

func (i authIC) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return next
}

func basicUser(name string) string {
	return "Basic " + b64(name+":")
}

func writeFileT(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// result is what a finished Start/Connect stream produced.
type result struct {
	pid     uint32
	stdout  string
	stderr  string
	pty     string
	end     *pb.ProcessEvent_EndEvent
	events  []string
	err     error
	started bool
}

// collect drains a process stream (bounded by ctx).
func collect(recv func() bool, msg func() *pb.ProcessEvent, errf func() error) result {
	var r result
	for recv() {
		ev := msg()
		switch x := ev.GetEvent().(type) {
		case *pb.ProcessEvent_Start:
			r.started = true
			r.pid = x.Start.GetPid()
			r.events = append(r.events, "start")
		case *pb.ProcessEvent_Data:
			r.events = append(r.events, "data")
			r.stdout += string(x.Data.GetStdout())
			r.stderr += string(x.Data.GetStderr())
			r.pty += string(x.Data.GetPty())
		case *pb.ProcessEvent_End:
			r.events = append(r.events, "end")
			r.end = x.End
		case *pb.ProcessEvent_Keepalive:
			r.events = append(r.events, "keepalive")
		}
	}
	r.err = errf()
	return r
}

func (e *testEnv) run(ctx context.Context, req *pb.StartRequest) result {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	s, err := e.proc.Start(ctx, connect.NewRequest(req))
	if err != nil {
		return result{err: err}
	}
	defer s.Close()
	return collect(s.Receive, func() *pb.ProcessEvent { return s.Msg().GetEvent() }, s.Err)
}

func bash(cmd string) *pb.StartRequest {
	f := false
	return &pb.StartRequest{Process: &pb.ProcessConfig{Cmd: "/bin/bash", Args: []string{"-l", "-c", cmd}}, Stdin: &f}
}

// waitFor polls cond every 20 ms up to d.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if cond() {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("timed out waiting for %s", what)
}

func codeOf(err error) connect.Code {
	return connect.CodeOf(err)
}

func trim(s string) string { return strings.TrimSpace(s) }
