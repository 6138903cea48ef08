package proxy

import (
	"bufio"
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/dataplane"
	"github.com/cubicle-dev/cubicle/internal/dataplane/dataplanetest"
	"github.com/cubicle-dev/cubicle/internal/store"
	"github.com/cubicle-dev/cubicle/internal/store/sqlite"
)

// countingDialer counts the tunnels the proxy opens.
type countingDialer struct {
	*dataplane.Client
	n atomic.Int64
}

func (d *countingDialer) Dial(ctx context.Context, nodeID, dataAddr, sandboxID string, port int) (net.Conn, error) {
	d.n.Add(1)
	return d.Client.Dial(ctx, nodeID, dataAddr, sandboxID, port)
}

type remoteFixture struct {
	st       *sqlite.Store
	front    *httptest.Server
	port     int
	remote   *store.Sandbox // on node-b, reached through its data plane
	local    *store.Sandbox // on the in-process node
	tunnels  *countingDialer
	upstream *httptest.Server
	handlers sync.WaitGroup
	panics   atomic.Int64
}

// setupRemote is a control plane whose in-process node is "local", and a
// real data-plane server for node "node-b" on loopback. The remote
// sandbox's row names 127.0.0.2, where nothing listens: on node-b's bridge
// it is 127.0.0.1, so a request that arrives was tunnelled, never dialled
// directly.
func setupRemote(t *testing.T, upstream http.Handler) *remoteFixture {
	return setupRemoteLimit(t, upstream, 0)
}

// setupRemoteLimit is setupRemote with node-b allowing maxTunnels.
func setupRemoteLimit(t *testing.T, upstream http.Handler, maxTunnels int) *remoteFixture {
	t.Helper()
	st, err := sqlite.Open(filepath.Join(t.TempDir(), "p.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	up := httptest.NewServer(upstream)
	t.Cleanup(up.Close)
	u, _ := url.Parse(up.URL)
	port, _ := strconv.Atoi(u.Port())

	mk := func(id, nodeID, addr string) *store.Sandbox {
		sb := &store.Sandbox{ID: id, TemplateID: "base", State: store.StateRunning, Node: nodeID, Addr: addr,
			EnvdToken: "envdtok", TrafficToken: "traffic", Network: store.Network{AllowPublicTraffic: true},
			StartedAt: time.Now(), EndAt: time.Now().Add(time.Hour)}
		if err := st.CreateSandbox(context.Background(), sb); err != nil {
			t.Fatal(err)
		}
		return sb
	}
	remote := mk("remote0123456789abcd", "node-b", "127.0.0.2")
	local := mk("local01234567890abcd", "local", "127.0.0.1")
	mk("gone0123456789abcdef", "node-b", "127.0.0.2") // a row node-b no longer holds
	mk("lost0123456789abcdef", "node-c", "127.0.0.2") // a node the registry does not know
	mk("silent0123456789abcd", "node-d", "127.0.0.2") // a node with no data address yet
	mk("down0123456789abcdef", "node-e", "127.0.0.2") // a node whose data plane is down
	mk("dots0123456789abcdef", "a.b", "127.0.0.2")    // a row naming no valid node

	dl, _ := net.Listen("tcp", "127.0.0.1:0")
	downAddr := dl.Addr().String()
	dl.Close()
	pki := dataplanetest.NewPKI(t)
	dataAddr, _ := pki.Serve(t, "node-b", dataplane.ServerConfig{MaxTunnels: maxTunnels, Lookup: func(_ context.Context, id string) (netip.Addr, error) {
		if id == remote.ID {
			return netip.MustParseAddr("127.0.0.1"), nil
		}
		return netip.Addr{}, dataplane.ErrUnknownSandbox
	}})
	tunnels := &countingDialer{Client: pki.Client(t)}
	nodes := &NodeRoutes{
		Local: "local",
		DataAddress: func(_ context.Context, id string) (string, error) {
			switch id {
			case "node-b":
				return dataAddr, nil
			case "node-d":
				return "", nil
			case "node-e":
				return downAddr, nil
			}
			return "", fmt.Errorf("node %s: %w", id, store.ErrNotFound)
		},
		Dialer: tunnels,
	}
	api := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusTeapot) })
	f := &remoteFixture{st: st, port: port, remote: remote, local: local, tunnels: tunnels, upstream: up}
	px := New(Config{Domain: "cubicle.test", Nodes: nodes}, nil, st, api)
	// Every handler is counted and its panic recorded (net/http would only
	// log it), so a test can wait for handlers to end and check.
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.handlers.Add(1)
		defer f.handlers.Done()
		defer func() {
			if v := recover(); v != nil {
				f.panics.Add(1)
				t.Logf("the proxy panicked: %v", v)
			}
		}()
		px.ServeHTTP(w, r)
	}))
	t.Cleanup(front.Close)
	f.front = front
	return f
}

func (f *remoteFixture) host(sb *store.Sandbox, port int) string {
	return fmt.Sprintf("%d-%s.cubicle.test", port, sb.ID)
}

func (f *remoteFixture) do(t *testing.T, method, host string, body io.Reader) (*http.Response, []byte) {
	t.Helper()
	req, _ := http.NewRequest(method, f.front.URL+"/x", body)
	req.Host = host
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, b
}

// TestRemoteSandboxThroughDataPlane: a sandbox on another node is reached
// through that node's data plane, with one pooled tunnel for repeated
// requests; the in-process node's sandbox is still dialled directly.
func TestRemoteSandboxThroughDataPlane(t *testing.T) {
	f := setupRemote(t, echoPath())
	for i := range 3 {
		resp, body := f.do(t, http.MethodGet, f.host(f.remote, f.port), nil)
		if resp.StatusCode != 200 || string(body) != `GET /x tt=""` {
			t.Fatalf("request %d: %d %q", i, resp.StatusCode, body)
		}
	}
	if n := f.tunnels.n.Load(); n != 1 {
		t.Fatalf("%d tunnels for three sequential requests, want one kept alive", n)
	}
	resp, body := f.do(t, http.MethodGet, f.host(f.local, f.port), nil)
	if resp.StatusCode != 200 || f.tunnels.n.Load() != 1 {
		t.Fatalf("local sandbox: %d %q, tunnels %d", resp.StatusCode, body, f.tunnels.n.Load())
	}
}

// TestRemoteLargeBodiesAndStreams: bodies both ways are byte-exact, and a
// streamed response reaches the client before it ends.
func TestRemoteLargeBodiesAndStreams(t *testing.T) {
	const size = 32 << 20
	src := func() io.Reader { return io.LimitReader(rand.NewChaCha8([32]byte{9}), size) }
	want := sha256.New()
	io.Copy(want, src())
	next := make(chan struct{})
	mux := http.NewServeMux()
	mux.HandleFunc("POST /x", func(w http.ResponseWriter, r *http.Request) {
		h := sha256.New()
		n, _ := io.Copy(h, r.Body)
		fmt.Fprintf(w, "%x %d", h.Sum(nil), n)
	})
	mux.HandleFunc("GET /x", func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("stream") == "" {
			io.Copy(w, src())
			return
		}
		for i := range 3 {
			fmt.Fprintf(w, "data: %d\n", i)
			w.(http.Flusher).Flush()
			<-next
		}
	})
	f := setupRemote(t, mux)

	resp, body := f.do(t, http.MethodPost, f.host(f.remote, f.port), src())
	if resp.StatusCode != 200 || string(body) != fmt.Sprintf("%x %d", want.Sum(nil), size) {
		t.Fatalf("upload: %d %q", resp.StatusCode, body)
	}
	resp, body = f.do(t, http.MethodGet, f.host(f.remote, f.port), nil)
	if got := sha256.Sum256(body); resp.StatusCode != 200 || len(body) != size || fmt.Sprintf("%x", got) != fmt.Sprintf("%x", want.Sum(nil)) {
		t.Fatalf("download: %d, %d bytes", resp.StatusCode, len(body))
	}

	req, _ := http.NewRequest(http.MethodGet, f.front.URL+"/x?stream=1", nil)
	req.Host = f.host(f.remote, f.port)
	sresp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer sresp.Body.Close()
	br := bufio.NewReader(sresp.Body)
	for i := range 3 {
		if line, err := br.ReadString('\n'); err != nil || line != fmt.Sprintf("data: %d\n", i) {
			t.Fatalf("event %d: %q %v", i, line, err)
		}
		next <- struct{}{}
	}
}

// TestRemoteWebSocket: an upgrade passes through the tunnel.
func TestRemoteWebSocket(t *testing.T) {
	f := setupRemote(t, wsEcho())
	u, _ := url.Parse(f.front.URL)
	conn, err := net.Dial("tcp", u.Host)
	if err != nil {
		t.Fatal(err)
	}
	checkWSEcho(t, &fixture{port: f.port, sb: f.remote}, conn) // closes conn
	f.handlers.Wait()                                          // the upgraded connection's handler ends with it
	if f.tunnels.n.Load() != 1 || f.panics.Load() != 0 {
		t.Fatalf("%d tunnels, %d panics", f.tunnels.n.Load(), f.panics.Load())
	}
}

// TestRemoteFailures: each data-plane failure gets e2b's proxy error body
// with the sandbox ID: a closed port as a closed port, a sandbox its node
// does not hold, a node the registry does not know, a node without a data
// address.
func TestRemoteFailures(t *testing.T) {
	f := setupRemote(t, echoPath())
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	closed := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	for _, tc := range []struct {
		id, want string
		port     int
	}{
		{f.remote.ID, "The sandbox is running but port is not open", closed},
		{"gone0123456789abcdef", "The sandbox was not found on its node node-b", f.port},
		{"lost0123456789abcdef", "The sandbox's node node-c is not reachable: node node-c: store: not found", f.port},
		{"silent0123456789abcd", "The sandbox's node node-d is not reachable: the node has not reported a data-plane address", f.port},
		// The node refusing the connection is not the sandbox's port being closed.
		{"down0123456789abcdef", "The sandbox's node node-e is not reachable: dataplane: node node-e at 127.0.0.1:", f.port},
		{"dots0123456789abcdef", "The sandbox's node is not valid: ", f.port},
	} {
		resp, body := f.do(t, http.MethodGet, fmt.Sprintf("%d-%s.cubicle.test", tc.port, tc.id), nil)
		e := sandboxErr(t, string(body))
		if resp.StatusCode != http.StatusBadGateway || e.SandboxID != tc.id || !strings.HasPrefix(e.Message, tc.want) {
			t.Errorf("%s: %d %q, want 502 %q", tc.id, resp.StatusCode, body, tc.want)
		}
	}
}

// TestRemoteTunnelLimit: a node at its tunnel limit is a 503 with
// Retry-After, not a sandbox failure.
func TestRemoteTunnelLimit(t *testing.T) {
	hold := make(chan struct{})
	f := setupRemoteLimit(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.(http.Flusher).Flush()
		select {
		case <-hold:
		case <-r.Context().Done():
		}
	}), 1)
	defer close(hold)
	req, _ := http.NewRequest(http.MethodGet, f.front.URL+"/held", nil)
	req.Host = f.host(f.remote, f.port)
	held, err := http.DefaultClient.Do(req) // holds node-b's only tunnel
	if err != nil {
		t.Fatal(err)
	}
	defer held.Body.Close()
	resp, body := f.do(t, http.MethodGet, f.host(f.remote, f.port), nil)
	if e := sandboxErr(t, string(body)); resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" || e.SandboxID != f.remote.ID {
		t.Fatalf("%d %v %q", resp.StatusCode, resp.Header, body)
	}
}
