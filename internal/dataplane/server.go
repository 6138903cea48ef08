package dataplane

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/cubicle-dev/cubicle/internal/clusterpki"
	"github.com/cubicle-dev/cubicle/internal/errdefs"
)

// Lookup resolves a sandbox among the node's own: its address on the
// node's bridge, or an error matching errdefs.ErrNotFound when the node
// holds no live sandbox with that ID.
type Lookup func(ctx context.Context, sandboxID string) (netip.Addr, error)

// Defaults for ServerConfig's zero values.
const (
	// DefaultMaxTunnels bounds open tunnels per node. The control plane
	// keeps one tunnel per pooled upstream connection (at most 1024 idle
	// across all sandboxes, plus those in use), so 4096 leaves room for
	// two replicas under load while bounding the node's file descriptors.
	DefaultMaxTunnels = 4096
	// DefaultHandshakeTimeout bounds the TLS handshake and the CONNECT
	// request together: only the control plane gets past them, and it
	// needs a few milliseconds.
	DefaultHandshakeTimeout = 10 * time.Second
	// DefaultDialTimeout bounds the dial to the sandbox (the proxy's own
	// direct dial uses 3s).
	DefaultDialTimeout = 3 * time.Second
	// maxPending bounds connections still in their handshake, so clients
	// that connect and stall hold at most this many goroutines.
	maxPending = 256
	// maxHeader bounds a tunnel request or answer, both a line or two:
	// neither side may make the other buffer without end.
	maxHeader = 16 << 10
)

// ServerConfig configures a node's data-plane server.
type ServerConfig struct {
	// Cert is the node's certificate (node.crt, with its key), CA the
	// cluster CA: only the control plane's identity is accepted.
	Cert tls.Certificate
	CA   *x509.Certificate
	// GetCertificate, when set, is asked for the certificate at each
	// handshake instead of Cert, so a renewed node certificate is served
	// without a restart.
	GetCertificate func() *tls.Certificate
	// Lookup finds the node's sandboxes; required.
	Lookup Lookup
	// Volumes, when set, serves the volume-content target (CONNECT
	// /volumes) from the node's own content attachments; nil refuses it.
	Volumes VolumeDirs
	// Builder, when set, connects to this node's template builder
	// (buildkitd): the BuilderTarget tunnel. Nil on a node that is not a
	// builder, where that target is refused with ErrNotBuilder.
	Builder func(ctx context.Context) (net.Conn, error)
	// MaxTunnels bounds open tunnels (0: DefaultMaxTunnels); one more is
	// answered 503.
	MaxTunnels int
	// MaxVolumeTunnels bounds the volume-content tunnels among them (0: a
	// quarter of MaxTunnels, at least 1): they serve API requests any team
	// with a volume token makes, so they must not take the slots of every
	// team's traffic to its sandboxes on this node. One more is 503.
	MaxVolumeTunnels int
	// HandshakeTimeout bounds TLS handshake plus CONNECT request (0:
	// DefaultHandshakeTimeout).
	HandshakeTimeout time.Duration
	// DialTimeout bounds the dial to the sandbox (0: DefaultDialTimeout).
	DialTimeout time.Duration
	Logger      *slog.Logger
	// Registry, when set, gets the server's metrics.
	Registry prometheus.Registerer
}

// Server is a node's data-plane endpoint. Make it with NewServer, run it
// with Serve on a TCP listener (the node's --data-listen), stop it with
// Close.
type Server struct {
	cfg     ServerConfig
	tls     *tls.Config
	log     *slog.Logger
	tunnels chan struct{}
	// volumes holds a slot per volume-content tunnel, besides its slot
	// in tunnels (MaxVolumeTunnels).
	volumes chan struct{}
	pending chan struct{}
	// refused counts tunnel requests answered with an error, by reason
	// (handshake: the TLS handshake or the request failed).
	refused *prometheus.CounterVec
	opened  prometheus.Counter

	// vsrv serves the volume-content tunnels handed to vln (started at
	// the first one).
	vsrv     *http.Server
	vln      *connListener
	vstarted sync.Once

	mu     sync.Mutex
	closed bool
	lns    map[net.Listener]struct{}
	conns  map[net.Conn]struct{}
	wg     sync.WaitGroup
}

// NewServer checks cfg and makes a server. The TLS configuration is
// clusterpki.NodeServerConfig: a client must present the control plane's
// certificate from cfg.CA; another node's certificate is refused.
func NewServer(cfg ServerConfig) (*Server, error) {
	switch {
	case cfg.Lookup == nil:
		return nil, errors.New("dataplane: ServerConfig.Lookup is required")
	case cfg.CA == nil:
		return nil, errors.New("dataplane: ServerConfig.CA is required")
	case len(cfg.Cert.Certificate) == 0 && cfg.GetCertificate == nil:
		return nil, errors.New("dataplane: ServerConfig.Cert or GetCertificate is required")
	case cfg.MaxTunnels < 0:
		return nil, fmt.Errorf("dataplane: MaxTunnels %d is negative", cfg.MaxTunnels)
	case cfg.MaxVolumeTunnels < 0:
		return nil, fmt.Errorf("dataplane: MaxVolumeTunnels %d is negative", cfg.MaxVolumeTunnels)
	case cfg.HandshakeTimeout < 0 || cfg.DialTimeout < 0:
		return nil, errors.New("dataplane: timeouts must not be negative")
	}
	if cfg.MaxTunnels == 0 {
		cfg.MaxTunnels = DefaultMaxTunnels
	}
	if cfg.MaxVolumeTunnels == 0 {
		cfg.MaxVolumeTunnels = max(1, cfg.MaxTunnels/4)
	}
	if cfg.MaxVolumeTunnels > cfg.MaxTunnels {
		return nil, fmt.Errorf("dataplane: MaxVolumeTunnels %d is over MaxTunnels %d", cfg.MaxVolumeTunnels, cfg.MaxTunnels)
	}
	if cfg.HandshakeTimeout == 0 {
		cfg.HandshakeTimeout = DefaultHandshakeTimeout
	}
	if cfg.DialTimeout == 0 {
		cfg.DialTimeout = DefaultDialTimeout
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	s := &Server{
		cfg: cfg, tls: clusterpki.NodeServerConfig(cfg.Cert, cfg.CA), log: cfg.Logger,
		tunnels: make(chan struct{}, cfg.MaxTunnels), volumes: make(chan struct{}, cfg.MaxVolumeTunnels), pending: make(chan struct{}, maxPending),
		lns: map[net.Listener]struct{}{}, conns: map[net.Conn]struct{}{},
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "cubicle_dataplane_tunnels_refused_total",
			Help: "Data-plane connections that got no tunnel, by reason (handshake, shed, bad_target, unknown_sandbox, too_many_tunnels, connection_refused, dial_failed, lookup_failed).",
		}, []string{"reason"}),
		opened: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "cubicle_dataplane_tunnels_opened_total", Help: "Data-plane tunnels opened to sandboxes.",
		}),
	}
	if cfg.Registry != nil {
		if err := cfg.Registry.Register(s.refused); err != nil {
			return nil, fmt.Errorf("dataplane: metrics: %w", err)
		}
		if err := cfg.Registry.Register(s.opened); err != nil {
			return nil, fmt.Errorf("dataplane: metrics: %w", err)
		}
		if err := cfg.Registry.Register(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "cubicle_dataplane_tunnels_open", Help: "Data-plane tunnels open now.",
		}, func() float64 { return float64(len(s.tunnels)) })); err != nil {
			return nil, fmt.Errorf("dataplane: metrics: %w", err)
		}
	}
	if cfg.Volumes != nil {
		s.vln = newConnListener()
		s.vsrv = &http.Server{
			Handler: volumeHandler(cfg.Volumes, cfg.Logger),
			// No read or write timeout: a 100 MB file streams through.
			ReadHeaderTimeout: 30 * time.Second,
			IdleTimeout:       volumeIdle,
			ErrorLog:          slog.NewLogLogger(cfg.Logger.Handler(), slog.LevelWarn),
		}
	}
	if get := cfg.GetCertificate; get != nil {
		s.tls.Certificates = nil
		s.tls.GetCertificate = func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return get(), nil }
	}
	return s, nil
}

// Serve accepts tunnels on ln (a plain TCP listener: Serve does the TLS)
// until Close, then returns ErrServerClosed. It closes ln.
func (s *Server) Serve(ln net.Listener) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		ln.Close()
		return ErrServerClosed
	}
	s.lns[ln] = struct{}{}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.lns, ln)
		s.mu.Unlock()
		ln.Close()
	}()
	var backoff time.Duration
	for {
		c, err := ln.Accept()
		if err != nil {
			s.mu.Lock()
			closed := s.closed
			s.mu.Unlock()
			if closed {
				return ErrServerClosed
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() || errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE) {
				// Out of descriptors: wait as net/http does, without a busy loop.
				backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
				time.Sleep(backoff)
				continue
			}
			return err
		}
		backoff = 0
		select {
		case s.pending <- struct{}{}:
		default:
			c.Close() // too many stalled handshakes: shed before any work
			s.refused.WithLabelValues("shed").Inc()
			continue
		}
		if !s.track(c) {
			<-s.pending
			c.Close()
			return ErrServerClosed
		}
		go s.handle(c)
	}
}

// track registers c for Close; false once closed.
func (s *Server) track(c net.Conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	s.conns[c] = struct{}{}
	s.wg.Add(1)
	return true
}

func (s *Server) untrack(c net.Conn) {
	s.mu.Lock()
	delete(s.conns, c)
	s.mu.Unlock()
	s.wg.Done()
}

// Close stops every listener, closes every open tunnel and waits for their
// goroutines.
func (s *Server) Close() error {
	s.mu.Lock()
	s.closed = true
	for ln := range s.lns {
		ln.Close()
	}
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	if s.vsrv != nil {
		s.vln.Close()
		s.vsrv.Close()
	}
	s.wg.Wait()
	return nil
}

// handle runs one connection: handshake and request under one deadline,
// checks, dial, then the splice.
func (s *Server) handle(raw net.Conn) {
	defer s.untrack(raw)
	defer raw.Close()
	inHandshake := true
	defer func() {
		if inHandshake {
			<-s.pending
		}
	}()
	raw.SetDeadline(time.Now().Add(s.cfg.HandshakeTimeout))
	tc := tls.Server(raw, s.tls)
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.HandshakeTimeout)
	defer cancel()
	if err := tc.HandshakeContext(ctx); err != nil {
		s.refused.WithLabelValues("handshake").Inc()
		s.log.Debug("dataplane handshake refused", "remote", raw.RemoteAddr().String(), "err", err)
		return
	}
	// The request is read through a limit (only the first bytes go
	// through br: bufConn reads the connection itself once br is empty).
	br := bufio.NewReader(io.LimitReader(tc, maxHeader))
	req, err := http.ReadRequest(br)
	if err != nil {
		s.refused.WithLabelValues("handshake").Inc()
		var ne net.Error
		if !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) && !(errors.As(err, &ne) && ne.Timeout()) {
			s.refuse(tc, http.StatusBadRequest, reasonBadTarget, "malformed tunnel request: "+err.Error())
		}
		return
	}
	inHandshake = false
	<-s.pending

	if req.Method != http.MethodConnect {
		s.refuse(tc, http.StatusMethodNotAllowed, reasonBadTarget, "the data plane takes CONNECT <sandboxID>:<port> only")
		return
	}
	if req.RequestURI == volumesTarget {
		s.serveVolumes(raw, tc, br)
		return
	}
	var up net.Conn
	if req.RequestURI == BuilderTarget {
		up = s.dialBuilder(ctx, tc)
	} else {
		up = s.dialSandbox(ctx, tc, req.RequestURI)
	}
	if up == nil {
		return // refused
	}
	defer func() { <-s.tunnels }()
	defer up.Close()
	s.opened.Inc() // before the 200: a caller that reads it sees the count
	if _, err := tc.Write([]byte("HTTP/1.1 200 Connection established\r\n\r\n")); err != nil {
		return
	}
	raw.SetDeadline(time.Time{})
	splice(&bufConn{Conn: tc, r: br}, up)
}

// dialSandbox opens the connection to a sandbox's port named by the
// CONNECT authority, or answers the refusal and returns nil.
func (s *Server) dialSandbox(ctx context.Context, tc *tls.Conn, authority string) net.Conn {
	id, port, err := parseTarget(authority)
	if err != nil {
		s.refuse(tc, http.StatusBadRequest, reasonBadTarget, err.Error())
		return nil
	}
	addr, err := s.cfg.Lookup(ctx, id)
	if err != nil {
		if errors.Is(err, errdefs.ErrNotFound) {
			s.refuse(tc, http.StatusNotFound, reasonUnknownSandbox, "no sandbox "+id+" on this node")
			return nil
		}
		s.refuse(tc, http.StatusInternalServerError, reasonLookup, "looking up sandbox "+id+": "+err.Error())
		return nil
	}
	if !s.acquire(tc) {
		return nil
	}
	// The sandbox's own address, whatever the caller sent: never an
	// address from the request.
	d := net.Dialer{Timeout: s.cfg.DialTimeout, KeepAlive: 30 * time.Second}
	up, err := d.DialContext(ctx, "tcp", netip.AddrPortFrom(addr, uint16(port)).String())
	if err != nil {
		<-s.tunnels
		if errors.Is(err, syscall.ECONNREFUSED) {
			s.refuse(tc, http.StatusBadGateway, reasonRefused, "sandbox "+id+" refused port "+strconv.Itoa(port))
			return nil
		}
		s.refuse(tc, http.StatusBadGateway, reasonDial, "dialling sandbox "+id+" port "+strconv.Itoa(port)+": "+err.Error())
		return nil
	}
	return up
}

// dialBuilder opens the connection to this node's buildkitd, or answers
// the refusal (not a builder, or buildkitd not answering) and returns nil.
// Only the control plane gets this far: the handshake refused every other
// identity.
func (s *Server) dialBuilder(ctx context.Context, tc *tls.Conn) net.Conn {
	if s.cfg.Builder == nil {
		s.refuse(tc, http.StatusNotFound, reasonNotBuilder, ErrNotBuilder.Error())
		return nil
	}
	if !s.acquire(tc) {
		return nil
	}
	dctx, cancel := context.WithTimeout(ctx, s.cfg.DialTimeout)
	defer cancel()
	up, err := s.cfg.Builder(dctx)
	if err != nil {
		<-s.tunnels
		s.refuse(tc, http.StatusBadGateway, reasonDial, "connecting to the node's buildkitd: "+err.Error())
		return nil
	}
	return up
}

// acquire takes a tunnel slot (released by the caller once the tunnel
// ends), or answers 503 and returns false at the limit.
func (s *Server) acquire(tc *tls.Conn) bool {
	select {
	case s.tunnels <- struct{}{}:
		return true
	default:
		s.refuse(tc, http.StatusServiceUnavailable, reasonBusy,
			"the node has "+strconv.Itoa(s.cfg.MaxTunnels)+" tunnels open, its limit")
		return false
	}
}

// refuse answers a tunnel request with an e2b-shaped error and closes.
func (s *Server) refuse(c *tls.Conn, status int, reason, msg string) {
	s.refused.WithLabelValues(reason).Inc()
	b, _ := json.Marshal(errorBody{Code: status, Message: msg, Reason: reason})
	fmt.Fprintf(c, "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s",
		status, http.StatusText(status), len(b), b)
	c.Close()
}

// serveVolumes hands a volume-content tunnel to the node's HTTP server and
// waits until that server is done with it, so the tunnel keeps its slot
// and Close still reaches it.
func (s *Server) serveVolumes(raw net.Conn, tc *tls.Conn, br *bufio.Reader) {
	if s.vsrv == nil {
		s.refuse(tc, http.StatusNotFound, reasonBadTarget, "this node serves no volume content")
		return
	}
	select {
	case s.volumes <- struct{}{}:
	default:
		s.refuse(tc, http.StatusServiceUnavailable, reasonBusy,
			"the node has "+strconv.Itoa(s.cfg.MaxVolumeTunnels)+" volume-content tunnels open, their share of its limit")
		return
	}
	defer func() { <-s.volumes }()
	if !s.acquire(tc) {
		return
	}
	defer func() { <-s.tunnels }()
	s.vstarted.Do(func() { go s.vsrv.Serve(s.vln) })
	s.opened.Inc()
	if _, err := tc.Write([]byte("HTTP/1.1 200 Connection established\r\n\r\n")); err != nil {
		return
	}
	raw.SetDeadline(time.Time{})
	c := &servedConn{Conn: &bufConn{Conn: tc, r: br}, done: make(chan struct{})}
	if !s.vln.hand(c) {
		return
	}
	<-c.done
}
