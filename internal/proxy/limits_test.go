package proxy

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/node"
	"github.com/cubicle-dev/cubicle/internal/store"
)

// silentPort listens on addr:0, accepts, reads and never answers: a
// sandbox port that holds every request it gets. It returns the port.
func silentPort(t *testing.T, addr string) int {
	t.Helper()
	l, err := net.Listen("tcp", addr+":0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	t.Cleanup(func() {
		l.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			go io.Copy(io.Discard, c)
		}
	}()
	return l.Addr().(*net.TCPAddr).Port
}

// clientFrom is a client whose connections come from the loopback address
// src, so that one test can be several client addresses.
func clientFrom(src string) *http.Client {
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}
	return &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{DialContext: d.DialContext, DisableKeepAlives: true}}
}

func limitedFront(t *testing.T, f *fixture, lim Limits) (*Proxy, *httptest.Server) {
	t.Helper()
	api := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusTeapot) })
	p := New(Config{Domain: "cubicle.test", Limits: lim}, nil, f.st, api)
	front := httptest.NewServer(p)
	t.Cleanup(front.Close)
	return p, front
}

// hang sends a request that the silent port holds, until ctx ends.
func hang(ctx context.Context, c *http.Client, front *httptest.Server, host string) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, front.URL+"/", nil)
	req.Host = host
	if resp, err := c.Do(req); err == nil {
		resp.Body.Close()
	}
}

// waitInFlight waits (bounded) until the proxy counts n requests in flight.
func waitInFlight(t *testing.T, p *Proxy, n int) {
	t.Helper()
	for range 1000 {
		if p.lim.clients.Len() == n {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("requests in flight: %d, want %d", p.lim.clients.Len(), n)
}

func refusal(t *testing.T, c *http.Client, front *httptest.Server, host string, want int, sandboxID string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, front.URL+"/", nil)
	req.Host = host
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var e sandboxError
	if err := json.Unmarshal(b, &e); err != nil || resp.StatusCode != want || e.Code != want || e.Message == "" || e.SandboxID != sandboxID {
		t.Fatalf("want %d with {code,message,sandboxId}, got %d %q", want, resp.StatusCode, b)
	}
	if !resp.Close {
		t.Fatalf("a refusal must close the connection (Connection: close)")
	}
}

// A sandbox port that accepts and never answers held every request sent to
// it, each with two descriptors, until serve had none left. Past the caps
// requests are refused at once: 429 for the client holding too many, 503
// for the sandbox or the proxy as a whole; the API still answers; and the
// slots come back when the held requests end.
func TestCapsRefuseAFloodOfHangingRequests(t *testing.T) {
	f := setup(t, echoPath())
	host := fmt.Sprintf("%d-%s.cubicle.test", silentPort(t, "127.0.0.1"), f.sb.ID)
	p, front := limitedFront(t, f, Limits{PerClient: 3, PerSandbox: 5, Total: 100})
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	flood := func(src string, n int) {
		for range n {
			wg.Add(1)
			go func() { defer wg.Done(); hang(ctx, clientFrom(src), front, host) }()
		}
	}
	flood("127.0.0.2", 3)
	waitInFlight(t, p, 3)
	refusal(t, clientFrom("127.0.0.2"), front, host, http.StatusTooManyRequests, f.sb.ID)
	flood("127.0.0.3", 2)
	waitInFlight(t, p, 5)
	refusal(t, clientFrom("127.0.0.4"), front, host, http.StatusServiceUnavailable, f.sb.ID)

	// The same sandbox's envd has its own slots: a flood of a public port
	// does not lock the owner out (nothing listens there here, so 502).
	req, _ := http.NewRequest(http.MethodGet, front.URL+"/health", nil)
	req.Header.Set(headerSandboxID, f.sb.ID)
	resp, err := clientFrom("127.0.0.4").Do(req)
	if err != nil || resp.StatusCode == http.StatusServiceUnavailable {
		t.Fatalf("envd of a sandbox whose own ports are full: %v %v", resp, err)
	}
	resp.Body.Close()

	// The API, and another sandbox, are not held up by the full one.
	resp, err = clientFrom("127.0.0.2").Get(front.URL + "/health")
	if err != nil || resp.StatusCode != http.StatusTeapot {
		t.Fatalf("API behind a full sandbox: %v %v", resp, err)
	}
	resp.Body.Close()
	other := &store.Sandbox{ID: "otherother0123456789", TemplateID: "base", State: store.StateRunning, Addr: "127.0.0.1",
		EnvdToken: "t2", TrafficToken: "t2", Network: store.Network{AllowPublicTraffic: true}, StartedAt: time.Now(), EndAt: time.Now().Add(time.Hour)}
	if err := f.st.CreateSandbox(context.Background(), other); err != nil {
		t.Fatal(err)
	}
	req, _ = http.NewRequest(http.MethodGet, front.URL+"/x", nil)
	req.Host = fmt.Sprintf("%d-%s.cubicle.test", f.port, other.ID)
	resp, err = clientFrom("127.0.0.4").Do(req)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("another sandbox while one is full: %v %v", resp, err)
	}
	resp.Body.Close()

	cancel()
	wg.Wait()
	waitInFlight(t, p, 0)
	if n := p.lim.sandboxes.Len(); n != 0 {
		t.Fatalf("%d per-sandbox slots left after the requests ended", n)
	}
}

func TestTotalCapAnswers503(t *testing.T) {
	f := setup(t, echoPath())
	host := fmt.Sprintf("%d-%s.cubicle.test", silentPort(t, "127.0.0.1"), f.sb.ID)
	p, front := limitedFront(t, f, Limits{Total: 2})
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for _, src := range []string{"127.0.0.2", "127.0.0.3"} {
		wg.Add(1)
		go func() { defer wg.Done(); hang(ctx, clientFrom(src), front, host) }()
	}
	waitInFlight(t, p, 2)
	refusal(t, clientFrom("127.0.0.4"), front, host, http.StatusServiceUnavailable, f.sb.ID)
	cancel()
	wg.Wait()
	waitInFlight(t, p, 0)
}

// A user port that never starts its response is answered 504 once the
// response-start timeout passes, and its slot freed; envd's port is exempt,
// since its streams (a command's output) may wait as long as the command.
func TestResponseStartTimeoutSparesEnvd(t *testing.T) {
	f := setup(t, echoPath())
	const agentAddr = "127.7.3.9" // envd's port is fixed; its own loopback address keeps it free
	answer := make(chan struct{})
	release := sync.OnceFunc(func() { close(answer) })
	t.Cleanup(release)
	l, err := net.Listen("tcp", net.JoinHostPort(agentAddr, strconv.Itoa(node.AgentPort)))
	if err != nil {
		t.Fatal(err)
	}
	agentSrv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		<-answer
		io.WriteString(w, "streamed")
	}), ReadHeaderTimeout: 10 * time.Second}
	go agentSrv.Serve(l)
	t.Cleanup(func() { agentSrv.Close() })
	agentSb := &store.Sandbox{ID: "agentagent0123456789", TemplateID: "base", State: store.StateRunning, Addr: agentAddr,
		EnvdToken: "t3", TrafficToken: "t3", Network: store.Network{AllowPublicTraffic: true}, StartedAt: time.Now(), EndAt: time.Now().Add(time.Hour)}
	if err := f.st.CreateSandbox(context.Background(), agentSb); err != nil {
		t.Fatal(err)
	}
	p, front := limitedFront(t, f, Limits{ResponseStart: 200 * time.Millisecond, Total: 10})

	// The envd request is sent first and waits past the timeout...
	type result struct {
		status int
		body   string
		err    error
	}
	envd := make(chan result, 1)
	go func() {
		req, _ := http.NewRequest(http.MethodPost, front.URL+"/process.Process/Start", nil)
		req.Header.Set(headerSandboxID, agentSb.ID)
		resp, err := clientFrom("127.0.0.1").Do(req)
		if err != nil {
			envd <- result{err: err}
			return
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		envd <- result{status: resp.StatusCode, body: string(b)}
	}()
	waitInFlight(t, p, 1)

	// ...while a user port's silent request times out.
	req, _ := http.NewRequest(http.MethodGet, front.URL+"/", nil)
	port := silentPort(t, "127.0.0.1")
	req.Host = fmt.Sprintf("%d-%s.cubicle.test", port, f.sb.ID)
	resp, err := clientFrom("127.0.0.1").Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var e sandboxError
	if json.Unmarshal(b, &e); resp.StatusCode != http.StatusGatewayTimeout || e.Code != http.StatusGatewayTimeout || e.Port != port || e.Message == "" {
		t.Fatalf("silent user port: %d %q, want 504 naming the port", resp.StatusCode, b)
	}
	waitInFlight(t, p, 1) // the user port's slot is back; envd's is held

	release()
	r := <-envd
	if r.err != nil || r.status != http.StatusOK || r.body != "streamed" {
		t.Fatalf("envd request that waited past the timeout: %d %q %v", r.status, r.body, r.err)
	}
	waitInFlight(t, p, 0)
}
