package dataplane_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/spf13/pflag"
	"golang.org/x/net/websocket"

	"github.com/cubicle-dev/cubicle/internal/clusterpki"
	"github.com/cubicle-dev/cubicle/internal/dataplane"
	"github.com/cubicle-dev/cubicle/internal/dataplane/dataplanetest"
	"github.com/cubicle-dev/cubicle/internal/store"
	"github.com/cubicle-dev/cubicle/internal/testenv"
)

var loopback = netip.MustParseAddr("127.0.0.1")

// sandboxes is a node's lookup over a fixed map.
func sandboxes(m map[string]netip.Addr) dataplane.Lookup {
	return func(_ context.Context, id string) (netip.Addr, error) {
		a, ok := m[id]
		if !ok {
			return netip.Addr{}, fmt.Errorf("sandbox %s: %w", id, dataplane.ErrUnknownSandbox)
		}
		return a, nil
	}
}

// countingListener counts the connections the stand-in sandbox accepted.
type countingListener struct {
	net.Listener
	n atomic.Int64
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.n.Add(1)
	}
	return c, err
}

// httpSandbox runs h as the sandbox's service on loopback; it returns the port.
func httpSandbox(t *testing.T, h http.Handler) (int, *countingListener) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cl := &countingListener{Listener: ln}
	srv := &http.Server{Handler: h}
	go srv.Serve(cl)
	t.Cleanup(func() { srv.Close() })
	return ln.Addr().(*net.TCPAddr).Port, cl
}

type fixture struct {
	pki  *dataplanetest.PKI
	cl   *dataplane.Client
	addr string
}

// nodeA starts node "node-a" holding sandbox "sb1" at loopback.
func nodeA(t *testing.T, cfg dataplane.ServerConfig) *fixture {
	t.Helper()
	pki := dataplanetest.NewPKI(t)
	if cfg.Lookup == nil {
		cfg.Lookup = sandboxes(map[string]netip.Addr{"sb1": loopback})
	}
	addr, _ := pki.Serve(t, "node-a", cfg)
	return &fixture{pki: pki, cl: pki.Client(t), addr: addr}
}

// transport sends every request through a tunnel to sandbox sb1's port.
func (f *fixture) transport(port int) *http.Transport {
	return &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return f.cl.Dial(ctx, "node-a", f.addr, "sb1", port)
	}}
}

// stream is n deterministic bytes.
func stream(n int64) io.Reader {
	return io.LimitReader(rand.NewChaCha8([32]byte{1, 2, 3}), n)
}

func sum(r io.Reader) (string, int64, error) {
	h := sha256.New()
	n, err := io.Copy(h, r)
	return hex.EncodeToString(h.Sum(nil)), n, err
}

// TestHundredMegabytesBothWays: a 100 MB upload and download pass through
// the tunnel byte for byte.
func TestHundredMegabytesBothWays(t *testing.T) {
	const size = 100 << 20
	want, _, _ := sum(stream(size))
	mux := http.NewServeMux()
	mux.HandleFunc("POST /upload", func(w http.ResponseWriter, r *http.Request) {
		s, n, err := sum(r.Body)
		if err != nil {
			http.Error(w, err.Error(), 500)
			return
		}
		fmt.Fprintf(w, "%s %d", s, n)
	})
	mux.HandleFunc("GET /download", func(w http.ResponseWriter, r *http.Request) {
		io.Copy(w, stream(size))
	})
	port, _ := httpSandbox(t, mux)
	f := nodeA(t, dataplane.ServerConfig{})
	c := &http.Client{Transport: f.transport(port)}
	defer c.CloseIdleConnections()

	resp, err := c.Post("http://sb/upload", "application/octet-stream", stream(size))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if got := string(b); got != fmt.Sprintf("%s %d", want, size) {
		t.Fatalf("upload: the sandbox got %q, want %s %d", got, want, size)
	}

	resp, err = c.Get("http://sb/download")
	if err != nil {
		t.Fatal(err)
	}
	got, n, err := sum(resp.Body)
	resp.Body.Close()
	if err != nil || got != want || n != size {
		t.Fatalf("download: %d bytes, sha256 %s, err %v; want %d bytes, %s", n, got, err, size, want)
	}
}

// TestWebSocketEcho: an upgraded connection works both ways.
func TestWebSocketEcho(t *testing.T) {
	port, _ := httpSandbox(t, websocket.Handler(func(ws *websocket.Conn) {
		for {
			var m string
			if websocket.Message.Receive(ws, &m) != nil || websocket.Message.Send(ws, m) != nil {
				return
			}
		}
	}))
	f := nodeA(t, dataplane.ServerConfig{})
	conn, err := f.cl.Dial(context.Background(), "node-a", f.addr, "sb1", port)
	if err != nil {
		t.Fatal(err)
	}
	cfg, _ := websocket.NewConfig("ws://sb/", "http://sb/")
	ws, err := websocket.NewClient(cfg, conn)
	if err != nil {
		t.Fatal(err)
	}
	defer ws.Close()
	for i := range 5 {
		msg := strings.Repeat("echo "+strconv.Itoa(i), 1000*i+1)
		if err := websocket.Message.Send(ws, msg); err != nil {
			t.Fatal(err)
		}
		var got string
		if err := websocket.Message.Receive(ws, &got); err != nil || got != msg {
			t.Fatalf("message %d: got %d bytes (%v), want %d", i, len(got), err, len(msg))
		}
	}
}

// TestStreamArrivesInPieces: each server-sent event reaches the client
// while the response is still open; the sandbox writes the next only once
// the client has read the previous one.
func TestStreamArrivesInPieces(t *testing.T) {
	next := make(chan struct{})
	port, _ := httpSandbox(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		for i := range 3 {
			fmt.Fprintf(w, "data: %d\n\n", i)
			w.(http.Flusher).Flush()
			select {
			case <-next:
			case <-r.Context().Done():
				return
			}
		}
	}))
	f := nodeA(t, dataplane.ServerConfig{})
	c := &http.Client{Transport: f.transport(port)}
	defer c.CloseIdleConnections()
	resp, err := c.Get("http://sb/events")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	for i := range 3 {
		line, err := br.ReadString('\n')
		if err != nil || line != fmt.Sprintf("data: %d\n", i) {
			t.Fatalf("event %d: %q %v", i, line, err)
		}
		br.ReadString('\n')
		next <- struct{}{} // blocks unless the sandbox is waiting: the body is not over
	}
	if rest, _ := io.ReadAll(br); len(rest) != 0 {
		t.Fatalf("trailing %q", rest)
	}
}

// rawSandbox runs a TCP service: serve gets each connection.
func rawSandbox(t *testing.T, serve func(*net.TCPConn)) int {
	t.Helper()
	addr := testenv.Serve(t, "tcp", "127.0.0.1:0", func(c net.Conn) { serve(c.(*net.TCPConn)) })
	return addr.(*net.TCPAddr).Port
}

// TestHalfClose: the end of one side's sending reaches the other side,
// which can still answer (client → sandbox), and the reverse.
func TestHalfClose(t *testing.T) {
	// The sandbox reads to EOF, then answers.
	countPort := rawSandbox(t, func(c *net.TCPConn) {
		n, _ := io.Copy(io.Discard, c)
		fmt.Fprintf(c, "got %d bytes", n)
	})
	f := nodeA(t, dataplane.ServerConfig{})

	conn, err := f.cl.Dial(context.Background(), "node-a", f.addr, "sb1", countPort)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.Write(bytes.Repeat([]byte("x"), 70000))
	if err := conn.(interface{ CloseWrite() error }).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	if b, err := io.ReadAll(conn); err != nil || string(b) != "got 70000 bytes" {
		t.Fatalf("after the client's half-close: %q %v", b, err)
	}

	// The sandbox speaks first and ends its sending, then reads to EOF.
	got := make(chan string, 1)
	echoBack := rawSandbox(t, func(c *net.TCPConn) {
		io.WriteString(c, "hello")
		c.CloseWrite()
		b, _ := io.ReadAll(c)
		got <- string(b)
	})
	conn2, err := f.cl.Dial(context.Background(), "node-a", f.addr, "sb1", echoBack)
	if err != nil {
		t.Fatal(err)
	}
	defer conn2.Close()
	if b, err := io.ReadAll(conn2); err != nil || string(b) != "hello" {
		t.Fatalf("the sandbox's half-close: %q %v", b, err)
	}
	// The client can still send after the sandbox stopped.
	io.WriteString(conn2, "still here")
	conn2.(interface{ CloseWrite() error }).CloseWrite()
	if s := <-got; s != "still here" {
		t.Fatalf("after the sandbox's half-close it got %q", s)
	}
}

// rawConnect sends a hand-written tunnel request with the control plane's
// identity and returns the node's status and error body.
func rawConnect(t *testing.T, f *fixture, nodeID, target string) (int, map[string]any) {
	t.Helper()
	tc, err := tls.Dial("tcp", f.addr, clusterpki.ControlPlaneClientConfig(f.pki.ControlPlane, f.pki.CA.Cert, nodeID))
	if err != nil {
		t.Fatal(err)
	}
	defer tc.Close()
	fmt.Fprintf(tc, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", target, target)
	resp, err := http.ReadResponse(bufio.NewReader(tc), &http.Request{Method: http.MethodConnect})
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var body map[string]any
	json.NewDecoder(resp.Body).Decode(&body)
	return resp.StatusCode, body
}

// TestOnlyTheSandboxesOwnAddress: a request names a sandbox on this node,
// never an address. A sandbox of another node is unknown here, and a
// request naming an address (the other sandbox's) is refused before any
// dial: the stand-in sandbox never sees a connection.
func TestOnlyTheSandboxesOwnAddress(t *testing.T) {
	port, seen := httpSandbox(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	pki := dataplanetest.NewPKI(t)
	addrA, _ := pki.Serve(t, "node-a", dataplane.ServerConfig{Lookup: sandboxes(map[string]netip.Addr{"sba": netip.MustParseAddr("127.0.0.2")})})
	addrB, _ := pki.Serve(t, "node-b", dataplane.ServerConfig{Lookup: sandboxes(map[string]netip.Addr{"sbb": loopback})})
	f := &fixture{pki: pki, cl: pki.Client(t), addr: addrA}

	_, err := f.cl.Dial(context.Background(), "node-a", addrA, "sbb", port)
	var te *dataplane.TunnelError
	if !errors.Is(err, dataplane.ErrUnknownSandbox) || !errors.As(err, &te) || te.Status != http.StatusNotFound {
		t.Fatalf("node-b's sandbox through node-a: %v", err)
	}
	for _, target := range []string{"127.0.0.1:" + strconv.Itoa(port), "[::1]:" + strconv.Itoa(port), "sbb.127.0.0.1:" + strconv.Itoa(port),
		"sba:0", "sba:65536", "sba:+80", "sba:080", "sba", "/sba"} {
		status, body := rawConnect(t, f, "node-a", target)
		if status != http.StatusBadRequest || body["code"] != float64(400) || body["message"] == "" {
			t.Errorf("target %q: %d %v", target, status, body)
		}
	}
	// A host name is only ever a sandbox ID, looked up among the node's own.
	if status, _ := rawConnect(t, f, "node-a", "localhost:"+strconv.Itoa(port)); status != http.StatusNotFound {
		t.Errorf("localhost: %d", status)
	}
	if n := seen.n.Load(); n != 0 {
		t.Fatalf("the sandbox's service was reached %d times", n)
	}
	// The same request to the node that holds it passes, to its own address.
	conn, err := f.cl.Dial(context.Background(), "node-b", addrB, "sbb", port)
	if err != nil {
		t.Fatal(err)
	}
	conn.Close()
}

// TestUnknownSandbox: 404 with an e2b-shaped body.
func TestUnknownSandbox(t *testing.T) {
	f := nodeA(t, dataplane.ServerConfig{})
	status, body := rawConnect(t, f, "node-a", "nosuchsandbox:49983")
	if status != http.StatusNotFound || body["code"] != float64(404) || body["message"] == "" {
		t.Fatalf("%d %v", status, body)
	}
	if _, err := f.cl.Dial(context.Background(), "node-a", f.addr, "nosuchsandbox", 49983); !errors.Is(err, dataplane.ErrUnknownSandbox) {
		t.Fatalf("Dial: %v", err)
	}
}

// TestClosedPortIsConnRefused: a port nothing listens on comes back as
// ECONNREFUSED, which the proxy reports as a closed port.
func TestClosedPortIsConnRefused(t *testing.T) {
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	f := nodeA(t, dataplane.ServerConfig{})
	_, err := f.cl.Dial(context.Background(), "node-a", f.addr, "sb1", port)
	var te *dataplane.TunnelError
	if !errors.Is(err, syscall.ECONNREFUSED) || !errors.As(err, &te) || te.Status != http.StatusBadGateway {
		t.Fatalf("%v", err)
	}
}

// TestOnlyTheControlPlane: a node's certificate, from the same CA, is
// refused as a client; and the control plane refuses a node that is not
// the one it meant to dial.
func TestOnlyTheControlPlane(t *testing.T) {
	port, seen := httpSandbox(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	f := nodeA(t, dataplane.ServerConfig{})
	peer, err := dataplane.NewClient(f.pki.Node(t, "node-b"), f.pki.CA.Cert, f.pki.Store)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := peer.Dial(context.Background(), "node-a", f.addr, "sb1", port); err == nil {
		t.Fatal("a node's certificate opened a tunnel")
	}
	if _, err := f.cl.Dial(context.Background(), "node-b", f.addr, "sb1", port); !errors.Is(err, clusterpki.ErrIdentity) {
		t.Fatalf("node-a answered as node-b: %v", err)
	}
	other := dataplanetest.NewPKI(t) // another cluster's control plane
	if _, err := other.Client(t).Dial(context.Background(), "node-a", f.addr, "sb1", port); err == nil {
		t.Fatal("another cluster's control plane opened a tunnel")
	}
	if n := seen.n.Load(); n != 0 {
		t.Fatalf("the sandbox's service was reached %d times", n)
	}
}

// TestTunnelLimit: one tunnel over the limit is 503 (ErrBusy); closing one
// frees its slot.
func TestTunnelLimit(t *testing.T) {
	ended := make(chan struct{}, 8)
	port := rawSandbox(t, func(c *net.TCPConn) {
		io.Copy(c, c)
		ended <- struct{}{}
	})
	f := nodeA(t, dataplane.ServerConfig{MaxTunnels: 2})
	var open []net.Conn
	for range 2 {
		c, err := f.cl.Dial(context.Background(), "node-a", f.addr, "sb1", port)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		open = append(open, c)
	}
	_, err := f.cl.Dial(context.Background(), "node-a", f.addr, "sb1", port)
	var te *dataplane.TunnelError
	if !errors.Is(err, dataplane.ErrBusy) || !errors.As(err, &te) || te.Status != http.StatusServiceUnavailable {
		t.Fatalf("third tunnel: %v", err)
	}
	open[0].Close()
	<-ended
	// The slot is released just after the sandbox's side closes: retry a
	// bounded number of times.
	for i := 0; ; i++ {
		c, err := f.cl.Dial(context.Background(), "node-a", f.addr, "sb1", port)
		if err == nil {
			c.Close()
			break
		}
		if !errors.Is(err, dataplane.ErrBusy) || i == 100 {
			t.Fatalf("after a close: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestStalledHandshakeIsDropped: a client that connects and sends nothing
// is disconnected after the handshake deadline.
func TestStalledHandshakeIsDropped(t *testing.T) {
	f := nodeA(t, dataplane.ServerConfig{HandshakeTimeout: 50 * time.Millisecond})
	c, err := net.Dial("tcp", f.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if n, err := io.Copy(io.Discard, c); err != nil || n != 0 {
		t.Fatalf("read %d bytes, %v", n, err)
	}
}

// TestCloseEndsTunnels: Close ends open tunnels and Serve.
func TestCloseEndsTunnels(t *testing.T) {
	port := rawSandbox(t, func(c *net.TCPConn) { io.Copy(c, c) })
	pki := dataplanetest.NewPKI(t)
	addr, srv := pki.Serve(t, "node-a", dataplane.ServerConfig{Lookup: sandboxes(map[string]netip.Addr{"sb1": loopback})})
	c, err := pki.Client(t).Dial(context.Background(), "node-a", addr, "sb1", port)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	srv.Close()
	if _, err := io.Copy(io.Discard, c); err != nil && !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("tunnel after Close: %v", err)
	}
	if _, err := net.Dial("tcp", addr); err == nil {
		t.Fatal("the listener is still open")
	}
}

// TestBadConfig: a server without a lookup or identity is refused.
func TestBadConfig(t *testing.T) {
	pki := dataplanetest.NewPKI(t)
	for name, cfg := range map[string]dataplane.ServerConfig{
		"no lookup":         {Cert: pki.ControlPlane, CA: pki.CA.Cert},
		"no CA":             {Cert: pki.ControlPlane, Lookup: sandboxes(nil)},
		"no certificate":    {CA: pki.CA.Cert, Lookup: sandboxes(nil)},
		"negative limit":    {Cert: pki.ControlPlane, CA: pki.CA.Cert, Lookup: sandboxes(nil), MaxTunnels: -1},
		"negative deadline": {Cert: pki.ControlPlane, CA: pki.CA.Cert, Lookup: sandboxes(nil), HandshakeTimeout: -1},
	} {
		if _, err := dataplane.NewServer(cfg); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if _, err := pki.Client(t).Dial(context.Background(), "node-a", "127.0.0.1:1", "../x", 80); !errors.Is(err, dataplane.ErrBadTarget) {
		t.Errorf("bad sandbox ID: %v", err)
	}
}

// TestFlags: the node's flags fill the config, defaults included, and
// refuse limits below 1.
func TestFlags(t *testing.T) {
	var cfg dataplane.ServerConfig
	fs := pflag.NewFlagSet("node run", pflag.ContinueOnError)
	fs.SetOutput(io.Discard)
	cfg.RegisterFlags(fs)
	if cfg.MaxTunnels != dataplane.DefaultMaxTunnels || cfg.HandshakeTimeout != dataplane.DefaultHandshakeTimeout || cfg.DialTimeout != dataplane.DefaultDialTimeout {
		t.Fatalf("defaults: %+v", cfg)
	}
	if err := fs.Parse([]string{"--data-max-tunnels=7", "--data-handshake-timeout=2s", "--data-dial-timeout=500ms"}); err != nil {
		t.Fatal(err)
	}
	if cfg.MaxTunnels != 7 || cfg.HandshakeTimeout != 2*time.Second || cfg.DialTimeout != 500*time.Millisecond {
		t.Fatalf("parsed: %+v", cfg)
	}
	for _, bad := range []string{"--data-max-tunnels=0", "--data-max-tunnels=-3", "--data-max-tunnels=x", "--data-handshake-timeout=0s", "--data-dial-timeout=-1s"} {
		fs := pflag.NewFlagSet("node run", pflag.ContinueOnError)
		fs.SetOutput(io.Discard)
		var c dataplane.ServerConfig
		c.RegisterFlags(fs)
		if err := fs.Parse([]string{bad}); err == nil {
			t.Errorf("%s accepted", bad)
		}
	}
}

// TestSessionResumption: a second tunnel to a node resumes the first's
// TLS session (no certificate signatures), and still reaches the sandbox.
func TestSessionResumption(t *testing.T) {
	port := rawSandbox(t, func(c *net.TCPConn) { io.WriteString(c, "hi") })
	f := nodeA(t, dataplane.ServerConfig{})
	type tlsState interface{ ConnectionState() tls.ConnectionState }
	for i := range 3 {
		c, err := f.cl.Dial(context.Background(), "node-a", f.addr, "sb1", port)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(c) // reading also takes in the session ticket
		c.Close()
		cs := c.(tlsState).ConnectionState()
		if string(b) != "hi" || cs.DidResume != (i > 0) || len(cs.PeerCertificates) == 0 || cs.PeerCertificates[0].URIs[0].String() != "cubicle://node/node-a" {
			t.Fatalf("tunnel %d: %q resumed=%v", i, b, cs.DidResume)
		}
	}
}

// TestMetrics: opened tunnels, refusals by reason and the open gauge.
func TestMetrics(t *testing.T) {
	port := rawSandbox(t, func(c *net.TCPConn) { io.Copy(c, c) })
	reg := prometheus.NewRegistry()
	f := nodeA(t, dataplane.ServerConfig{Registry: reg})
	c, err := f.cl.Dial(context.Background(), "node-a", f.addr, "sb1", port)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	f.cl.Dial(context.Background(), "node-a", f.addr, "nosuchsandbox", port)
	rawConnect(t, f, "node-a", "127.0.0.1:80")
	want := `
# HELP cubicle_dataplane_tunnels_open Data-plane tunnels open now.
# TYPE cubicle_dataplane_tunnels_open gauge
cubicle_dataplane_tunnels_open 1
# HELP cubicle_dataplane_tunnels_opened_total Data-plane tunnels opened to sandboxes.
# TYPE cubicle_dataplane_tunnels_opened_total counter
cubicle_dataplane_tunnels_opened_total 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "cubicle_dataplane_tunnels_open", "cubicle_dataplane_tunnels_opened_total"); err != nil {
		t.Fatal(err)
	}
	mfs, _ := reg.Gather()
	got := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() == "cubicle_dataplane_tunnels_refused_total" {
			for _, m := range mf.GetMetric() {
				got[m.GetLabel()[0].GetValue()] = m.GetCounter().GetValue()
			}
		}
	}
	if got["unknown_sandbox"] != 1 || got["bad_target"] != 1 {
		t.Fatalf("refusals %v", got)
	}
	if _, err := dataplane.NewServer(dataplane.ServerConfig{Cert: f.pki.Node(t, "node-a"), CA: f.pki.CA.Cert, Lookup: sandboxes(nil), Registry: reg}); err == nil {
		t.Fatal("a second server registered the same metrics")
	}
}

// TestHeadersAreBounded: neither side buffers an endless tunnel request or
// answer: the node drops a request past the limit, and the control plane
// gives up on a (compromised) node's endless answer.
func TestHeadersAreBounded(t *testing.T) {
	f := nodeA(t, dataplane.ServerConfig{})
	tc, err := tls.Dial("tcp", f.addr, clusterpki.ControlPlaneClientConfig(f.pki.ControlPlane, f.pki.CA.Cert, "node-a"))
	if err != nil {
		t.Fatal(err)
	}
	defer tc.Close()
	go func() {
		io.WriteString(tc, "CONNECT sb1:80 HTTP/1.1\r\nX-Long: ")
		io.Copy(tc, stream(1<<30)) // stops when the node closes
	}()
	if resp, err := http.ReadResponse(bufio.NewReader(tc), &http.Request{Method: http.MethodConnect}); err == nil && resp.StatusCode == http.StatusOK {
		t.Fatal("an endless request got a tunnel")
	}

	// A node that answers with an endless header.
	ln, err := tls.Listen("tcp", "127.0.0.1:0", clusterpki.NodeServerConfig(f.pki.Node(t, "node-z"), f.pki.CA.Cert))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		io.WriteString(c, "HTTP/1.1 200 OK\r\nX-Long: ")
		io.Copy(c, stream(1<<30))
	}()
	var ne *dataplane.NodeError
	if _, err := f.cl.Dial(context.Background(), "node-z", ln.Addr().String(), "sb1", 80); !errors.As(err, &ne) {
		t.Fatalf("endless answer: %v", err)
	}
}

// A node forgotten (`cubicle node forget`) is refused by the control
// plane's dial, though its certificate is still within its validity and
// chains to the cluster CA: the tunnel fails with clusterpki.ErrRevoked
// and nothing reaches the sandbox. A certificate issued after the forget
// (the node joined again) is accepted.
func TestForgottenNodeRefusedAtTheDial(t *testing.T) {
	port, seen := httpSandbox(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	f := nodeA(t, dataplane.ServerConfig{})
	conn, err := f.cl.Dial(context.Background(), "node-a", f.addr, "sb1", port)
	if err != nil {
		t.Fatal(err)
	}
	conn.Close()
	// The sandbox's server accepts in its own goroutine: wait for that
	// first connection's count, or it could land after `before` below.
	for deadline := time.Now().Add(10 * time.Second); seen.n.Load() < 1; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the first dial never reached the sandbox")
		}
	}
	ctx := context.Background()
	if err := f.pki.Store.RegisterNode(ctx, &store.Node{ID: "node-a", Address: f.addr}); err != nil {
		t.Fatal(err)
	}
	if err := f.pki.Store.ForgetNode(ctx, "node-a"); err != nil {
		t.Fatal(err)
	}
	before := seen.n.Load()
	_, err = f.cl.Dial(ctx, "node-a", f.addr, "sb1", port)
	var re *clusterpki.RevokedError
	if !errors.Is(err, clusterpki.ErrRevoked) || !errors.As(err, &re) || re.Node != "node-a" {
		t.Fatalf("dial of a forgotten node: %v, want its certificate refused as revoked", err)
	}
	if n := seen.n.Load(); n != before {
		t.Fatalf("the forgotten node reached the sandbox (%d connections)", n-before)
	}

	// Joined again: a certificate that starts at the forget's second.
	at, err := f.pki.Store.NodeRevokedAt(ctx, "node-a")
	if err != nil {
		t.Fatal(err)
	}
	addr, _ := f.pki.ServeAfter(t, "node-a", at, dataplane.ServerConfig{Lookup: sandboxes(map[string]netip.Addr{"sb1": loopback})})
	conn, err = f.cl.Dial(ctx, "node-a", addr, "sb1", port)
	if err != nil {
		t.Fatalf("dial of the re-joined node: %v", err)
	}
	conn.Close()
}
