package main

// The fixture's SOCKS5 upstream: RFC 1928 CONNECT (IPv4 and domain-name
// targets) with RFC 1929 username/password auth when --socks-user or
// --socks-pass is given, no auth otherwise. It listens in the fixture's netns
// and dials from there, so a tunnelled request reaches the echo servers from
// the fixture's own address. Domain targets are resolved with the fixture's
// DNS records, not by a DNS query. Each CONNECT is logged (GET
// http://<addr>:8081/socks-log), and `socks stop` / `socks start` on stdin
// close and reopen the listener, cutting the tunnels on stop.
//
// It is hand-written rather than a library's: the fixture needs its own
// resolver, dialing inside the netns, stop/start that also cuts established
// tunnels, and a log of what was asked, which would all be wrappers around a
// library's server.

import (
	"bufio"
	"context"
	"crypto/subtle"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/cubicle-dev/cubicle/internal/network"
)

const (
	socksPort        = 1080
	socksLogPort     = 8081
	socksHandshake   = 10 * time.Second // greeting, auth and request together
	socksDialTimeout = 10 * time.Second
	socksMaxConns    = 256 // concurrent client connections; more are closed at once
	socksLogMax      = 1000
)

// SOCKS5 reply codes (RFC 1928 section 6).
const (
	repSucceeded        = 0x00
	repGeneralFailure   = 0x01
	repNetUnreachable   = 0x03
	repHostUnreachable  = 0x04
	repConnRefused      = 0x05
	repCmdNotSupported  = 0x07
	repAddrNotSupported = 0x08
)

// socksEntry is one CONNECT request, as /socks-log reports it.
type socksEntry struct {
	Time   time.Time `json:"time"`
	Client string    `json:"client"`         // the client's address, as the fixture saw it
	User   string    `json:"user"`           // "" without auth
	Target string    `json:"target"`         // host:port as asked (a name or an IPv4 literal)
	Addr   string    `json:"addr,omitempty"` // what it resolved to, when it did
	Error  string    `json:"error,omitempty"`
}

type socksServer struct {
	nsPath     string
	listenAddr string
	user, pass string
	auth       bool
	lookup     func(name string) (string, bool)
	sem        chan struct{}

	mu  sync.Mutex // guards run
	run *socksRun  // nil while stopped

	logMu sync.Mutex
	log   []socksEntry
}

// socksRun is one start..stop of the listener and everything it accepted.
type socksRun struct {
	ln     net.Listener
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
}

func newSocksServer(nsPath string, addr netip.Addr, user, pass string, lookup func(string) (string, bool)) (*socksServer, error) {
	if len(user) > 255 || len(pass) > 255 {
		return nil, errors.New("--socks-user and --socks-pass are at most 255 bytes")
	}
	return &socksServer{
		nsPath:     nsPath,
		listenAddr: net.JoinHostPort(addr.String(), strconv.Itoa(socksPort)),
		user:       user, pass: pass, auth: user != "" || pass != "",
		lookup: lookup,
		sem:    make(chan struct{}, socksMaxConns),
	}, nil
}

func listenInNetns(nsPath, addr string) (l net.Listener, err error) {
	err = network.RunInNetns(nsPath, func() error {
		l, err = net.Listen("tcp", addr)
		return err
	})
	return l, err
}

// start opens the listener; it is a no-op while it is open.
func (s *socksServer) start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.run != nil {
		return nil
	}
	ln, err := listenInNetns(s.nsPath, s.listenAddr)
	if err != nil {
		return err
	}
	r := &socksRun{ln: ln, conns: map[net.Conn]struct{}{}}
	r.ctx, r.cancel = context.WithCancel(context.Background())
	s.run = r
	r.wg.Add(1)
	go s.serve(r)
	return nil
}

// stop closes the listener and every connection it accepted (both ends of
// each tunnel) and returns once their goroutines are done; a no-op while
// stopped.
func (s *socksServer) stop() {
	s.mu.Lock()
	r := s.run
	s.run = nil
	s.mu.Unlock()
	if r == nil {
		return
	}
	r.cancel()
	r.ln.Close()
	r.mu.Lock()
	r.closed = true
	for c := range r.conns {
		c.Close()
	}
	r.mu.Unlock()
	r.wg.Wait()
}

// track registers c to be closed by stop; false (and c closed) if stop came first.
func (r *socksRun) track(c net.Conn) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		c.Close()
		return false
	}
	r.conns[c] = struct{}{}
	return true
}

func (r *socksRun) untrack(c net.Conn) {
	r.mu.Lock()
	delete(r.conns, c)
	r.mu.Unlock()
	c.Close()
}

func (s *socksServer) serve(r *socksRun) {
	defer r.wg.Done()
	for {
		c, err := r.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			time.Sleep(10 * time.Millisecond) // e.g. EMFILE; don't spin
			continue
		}
		select {
		case s.sem <- struct{}{}:
		default:
			c.Close()
			continue
		}
		if !r.track(c) {
			<-s.sem
			continue
		}
		r.wg.Add(1)
		go func() {
			defer r.wg.Done()
			defer func() { <-s.sem }()
			defer r.untrack(c)
			s.handle(r, c)
		}()
	}
}

// handle serves one client connection until the tunnel ends.
func (s *socksServer) handle(r *socksRun, c net.Conn) {
	_ = c.SetDeadline(time.Now().Add(socksHandshake))
	br := bufio.NewReader(c)
	user, ok := s.negotiate(br, c)
	if !ok {
		return
	}
	// Request: VER CMD RSV ATYP DST.ADDR DST.PORT.
	var h [4]byte
	if _, err := io.ReadFull(br, h[:]); err != nil || h[0] != 5 {
		return
	}
	var host string
	switch h[3] {
	case 1:
		var a [4]byte
		if _, err := io.ReadFull(br, a[:]); err != nil {
			return
		}
		host = netip.AddrFrom4(a).String()
	case 3:
		n, err := br.ReadByte()
		if err != nil {
			return
		}
		b := make([]byte, n)
		if _, err := io.ReadFull(br, b); err != nil {
			return
		}
		host = string(b)
	default: // IPv6 and anything else
		reply(c, repAddrNotSupported, nil)
		return
	}
	var p [2]byte
	if _, err := io.ReadFull(br, p[:]); err != nil {
		return
	}
	port := binary.BigEndian.Uint16(p[:])
	e := socksEntry{Time: time.Now().UTC(), Client: c.RemoteAddr().String(), User: user,
		Target: net.JoinHostPort(host, strconv.Itoa(int(port)))}
	if h[1] != 1 {
		e.Error = fmt.Sprintf("command %d not supported", h[1])
		s.record(e)
		reply(c, repCmdNotSupported, nil)
		return
	}
	ip, err := s.resolve(host)
	if err != nil {
		e.Error = err.Error()
		s.record(e)
		reply(c, repHostUnreachable, nil)
		return
	}
	e.Addr = net.JoinHostPort(ip.String(), strconv.Itoa(int(port)))
	up, err := s.dial(r.ctx, e.Addr)
	if err != nil {
		e.Error = err.Error()
		s.record(e)
		reply(c, dialReply(err), nil)
		return
	}
	s.record(e)
	if !r.track(up) {
		return
	}
	defer r.untrack(up)
	if err := reply(c, repSucceeded, up.LocalAddr()); err != nil {
		return
	}
	_ = c.SetDeadline(time.Time{})
	// Bytes the client sent after its request (pipelined) are in br.
	pipe(c, br, up)
}

// negotiate does the method selection and, when auth is on, RFC 1929; it
// returns the user name that authenticated ("" without auth).
func (s *socksServer) negotiate(br *bufio.Reader, c net.Conn) (string, bool) {
	var h [2]byte
	if _, err := io.ReadFull(br, h[:]); err != nil || h[0] != 5 {
		return "", false
	}
	methods := make([]byte, h[1])
	if _, err := io.ReadFull(br, methods); err != nil {
		return "", false
	}
	want := byte(0x00)
	if s.auth {
		want = 0x02
	}
	offered := false
	for _, m := range methods {
		offered = offered || m == want
	}
	if !offered {
		_, _ = c.Write([]byte{5, 0xff})
		return "", false
	}
	if _, err := c.Write([]byte{5, want}); err != nil {
		return "", false
	}
	if !s.auth {
		return "", true
	}
	// VER(1) ULEN UNAME PLEN PASSWD.
	v, err := br.ReadByte()
	if err != nil || v != 1 {
		return "", false
	}
	field := func() ([]byte, error) {
		n, err := br.ReadByte()
		if err != nil {
			return nil, err
		}
		b := make([]byte, n)
		_, err = io.ReadFull(br, b)
		return b, err
	}
	u, err := field()
	if err != nil {
		return "", false
	}
	pw, err := field()
	if err != nil {
		return "", false
	}
	uok := subtle.ConstantTimeCompare(u, []byte(s.user))
	pok := subtle.ConstantTimeCompare(pw, []byte(s.pass))
	if uok&pok != 1 {
		_, _ = c.Write([]byte{1, 1})
		return "", false
	}
	if _, err := c.Write([]byte{1, 0}); err != nil {
		return "", false
	}
	return string(u), true
}

// resolve answers as the fixture's DNS does; an IPv4 literal is itself.
func (s *socksServer) resolve(host string) (netip.Addr, error) {
	if a, err := netip.ParseAddr(host); err == nil {
		return a, nil
	}
	ip, ok := s.lookup(host)
	if !ok {
		return netip.Addr{}, fmt.Errorf("%s: no such name", host)
	}
	return netip.ParseAddr(ip)
}

// dial connects from inside the netns, so the fixture's address is the source.
func (s *socksServer) dial(ctx context.Context, addr string) (c net.Conn, err error) {
	ctx, cancel := context.WithTimeout(ctx, socksDialTimeout)
	defer cancel()
	err = network.RunInNetns(s.nsPath, func() error {
		var d net.Dialer
		c, err = d.DialContext(ctx, "tcp", addr)
		return err
	})
	return c, err
}

func dialReply(err error) byte {
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		return repConnRefused
	case errors.Is(err, syscall.ENETUNREACH):
		return repNetUnreachable
	case errors.Is(err, syscall.EHOSTUNREACH), errors.Is(err, context.DeadlineExceeded):
		return repHostUnreachable
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return repHostUnreachable
	}
	return repGeneralFailure
}

// reply writes VER REP RSV ATYP(IPv4) BND.ADDR BND.PORT.
func reply(c net.Conn, rep byte, bound net.Addr) error {
	b := []byte{5, rep, 0, 1, 0, 0, 0, 0, 0, 0}
	if ta, ok := bound.(*net.TCPAddr); ok {
		if ip4 := ta.IP.To4(); ip4 != nil {
			copy(b[4:8], ip4)
			binary.BigEndian.PutUint16(b[8:], uint16(ta.Port))
		}
	}
	_, err := c.Write(b)
	return err
}

// pipe copies both ways, passing on half-closes, until both directions end.
func pipe(c net.Conn, cr io.Reader, up net.Conn) {
	done := make(chan struct{})
	go func() {
		_, _ = io.Copy(up, cr)
		closeWrite(up)
		close(done)
	}()
	_, _ = io.Copy(c, up)
	closeWrite(c)
	<-done
}

func closeWrite(c net.Conn) {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
	} else {
		c.Close()
	}
}

func (s *socksServer) record(e socksEntry) {
	s.logMu.Lock()
	defer s.logMu.Unlock()
	s.log = append(s.log, e)
	if len(s.log) > socksLogMax {
		s.log = append(s.log[:0:0], s.log[len(s.log)-socksLogMax:]...)
	}
}

// serveLog answers GET /socks-log with the CONNECT log as a JSON array,
// oldest first.
func (s *socksServer) serveLog(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/socks-log" {
		http.NotFound(w, r)
		return
	}
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		http.Error(w, "GET only", http.StatusMethodNotAllowed)
		return
	}
	s.logMu.Lock()
	entries := append([]socksEntry{}, s.log...)
	s.logMu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(entries)
}

// control runs one line of the stdin protocol and returns the answer line.
func (s *socksServer) control(line string) string {
	switch strings.Join(strings.Fields(line), " ") {
	case "socks stop":
		s.stop()
		return "ok"
	case "socks start":
		if err := s.start(); err != nil {
			return "error: " + strings.ReplaceAll(err.Error(), "\n", " ")
		}
		return "ok"
	}
	return "error: unknown command"
}
