package interp_test

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cubicle-dev/cubicle/internal/agent"
	"github.com/cubicle-dev/cubicle/internal/agent/interp"
	"github.com/cubicle-dev/cubicle/internal/agent/interp/internal/kerneltest"
)

// gatedHost is an agent whose discovery (the first thing it does is ask
// for the environment) and kernel starts wait until the test opens their
// gate, so a test can send requests before each.
type gatedHost struct {
	*agent.Agent
	discovery *gate
	kernels   *gate
	started   chan []string // argv of each kernel start, as it begins
}

type gate struct {
	ch   chan struct{}
	once sync.Once
}

func newGate() *gate  { return &gate{ch: make(chan struct{})} }
func (g *gate) open() { g.once.Do(func() { close(g.ch) }) }
func (g *gate) wait() { <-g.ch }

func newGatedHost(t *testing.T) *gatedHost {
	h := &gatedHost{
		Agent:     agent.New(agent.Config{AccessToken: token, Logger: quietLogger()}),
		discovery: newGate(),
		kernels:   newGate(),
		started:   make(chan []string, 16),
	}
	t.Cleanup(func() {
		h.discovery.open()
		h.kernels.open()
	})
	return h
}

func (h *gatedHost) ProcessEnv(user string) (map[string]string, error) {
	h.discovery.wait()
	return h.Agent.ProcessEnv(user)
}

func (h *gatedHost) Spawn(user string, argv []string, dir string, env []string, output *os.File) (int, <-chan unix.WaitStatus, error) {
	if slices.Contains(argv, "ipykernel_launcher") {
		h.started <- argv
		h.kernels.wait()
	}
	return h.Agent.Spawn(user, argv, dir, env, output)
}

// startService serves a Service on a fresh loopback port.
func startService(t *testing.T, h *gatedHost, cfg interp.Config) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cfg.KernelSpecDirs = []string{}
	cfg.RuntimeDir = filepath.Join(t.TempDir(), "kernels")
	cfg.DefaultCwd = t.TempDir()
	cfg.Logger = quietLogger()
	svc := interp.Start(h, cfg, ln)
	t.Cleanup(func() {
		h.discovery.open()
		h.kernels.open()
		svc.Close()
		h.Shutdown()
	})
	return ln.Addr().String()
}

type response struct {
	status int
	body   string
	err    error
}

// send makes a request on a connection of its own.
func send(ctx context.Context, method, url, body string) <-chan response {
	out := make(chan response, 1)
	go func() {
		req, _ := http.NewRequestWithContext(ctx, method, url, strings.NewReader(body))
		req.Header.Set("X-Access-Token", token)
		client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
		resp, err := client.Do(req)
		if err != nil {
			out <- response{err: err}
			return
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		out <- response{status: resp.StatusCode, body: string(b), err: err}
	}()
	return out
}

func receive(t *testing.T, c <-chan response) response {
	t.Helper()
	select {
	case r := <-c:
		if r.err != nil {
			t.Fatal(r.err)
		}
		return r
	case <-time.After(90 * time.Second):
		t.Fatal("no response")
		return response{}
	}
}

// pending fails the test when c already has a response.
func pending(t *testing.T, c <-chan response, what string) {
	t.Helper()
	select {
	case r := <-c:
		t.Fatalf("%s: answered %d %s; want it held", what, r.status, r.body)
	case <-time.After(200 * time.Millisecond):
	}
}

const kernelStarting = `{"code":503,"message":"the default kernel is starting"}` + "\n"

func TestServiceHoldsRequestsUntilTheDefaultKernelIsReady(t *testing.T) {
	h := newGatedHost(t)
	url := "http://" + startService(t, h, interp.Config{Python: kerneltest.Python(t)})
	ctx := context.Background()

	if r := receive(t, send(ctx, http.MethodGet, url+"/health", "")); r.status != 503 || r.body != kernelStarting {
		t.Fatalf("health during discovery: %d %q", r.status, r.body)
	}
	exec := send(ctx, http.MethodPost, url+"/execute", `{"code": "1+1"}`)
	pending(t, exec, "execute during discovery")

	h.discovery.open()
	var argv []string
	select {
	case argv = <-h.started:
	case <-time.After(30 * time.Second):
		t.Fatal("the default kernel was not started after discovery")
	}
	// Discovery is over and the default kernel is starting.
	if r := receive(t, send(ctx, http.MethodGet, url+"/health", "")); r.status != 503 || r.body != kernelStarting {
		t.Fatalf("health while the kernel starts: %d %q", r.status, r.body)
	}
	pending(t, exec, "execute while the kernel starts")

	h.kernels.open()
	r := receive(t, exec)
	if r.status != 200 {
		t.Fatalf("execute: %d %s", r.status, r.body)
	}
	var lines []line
	sc := bufio.NewScanner(strings.NewReader(r.body))
	for sc.Scan() {
		var l line
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			t.Fatalf("bad line %q", sc.Text())
		}
		lines = append(lines, l)
	}
	endsCleanly(t, lines)
	if res := mainResult(t, lines); res["text"] != "2" {
		t.Fatalf("1+1 = %v", res["text"])
	}
	if r := receive(t, send(ctx, http.MethodGet, url+"/health", "")); r.status != 200 || r.body != "\"OK\"\n" {
		t.Fatalf("health once the kernel is ready: %d %q", r.status, r.body)
	}
	// The held execution ran on the default context's kernel, the one
	// kernel started.
	select {
	case more := <-h.started:
		t.Fatalf("a second kernel was started: %v (first %v)", more, argv)
	default:
	}
	if r := receive(t, send(ctx, http.MethodGet, url+"/contexts", "")); !strings.Contains(r.body, `"language":"python"`) || strings.Count(r.body, `"id"`) != 1 {
		t.Fatalf("contexts: %s", r.body)
	}
}

func TestServiceWithoutPythonAnswers404AndFreesThePort(t *testing.T) {
	h := newGatedHost(t)
	addr := startService(t, h, interp.Config{Python: filepath.Join(t.TempDir(), "no-python")})
	exec := send(context.Background(), http.MethodPost, "http://"+addr+"/execute", `{"code": "1+1"}`)
	pending(t, exec, "execute during discovery")

	h.discovery.open()
	r := receive(t, exec)
	want := `{"code":404,"message":"` + interp.NoKernelMessage + `"}` + "\n"
	if r.status != 404 || r.body != want {
		t.Fatalf("execute: %d %q; want 404 %q", r.status, r.body, want)
	}
	if c, err := net.DialTimeout("tcp", addr, 5*time.Second); err == nil {
		c.Close()
		t.Fatal("the port still accepts connections")
	}
}

func TestServiceBoundsTheWaitForDiscovery(t *testing.T) {
	h := newGatedHost(t)
	url := "http://" + startService(t, h, interp.Config{Python: filepath.Join(t.TempDir(), "no-python"), DiscoveryWait: 100 * time.Millisecond})
	r := receive(t, send(context.Background(), http.MethodPost, url+"/execute", `{"code": "1"}`))
	if r.status != 503 || !strings.Contains(r.body, "kernel discovery has not finished after 100ms") {
		t.Fatalf("execute: %d %s", r.status, r.body)
	}
}
