// Package egress is the node's transparent egress proxy. nftables redirects
// the TCP connections of sandboxes whose policy names domains (ports 80 and
// 443, and the ports their rules name) to it; it reads the TLS
// ClientHello's server name or the HTTP Host
// header, judges the name against the sandbox's allowOut/denyOut domains
// (allow wins, as in e2b), falls back to the address rules for everything
// else, and splices the allowed connections to their destination.
//
// A name allowed by a domain entry is dialled as the name, resolved through
// the sandboxes' own resolvers, never as the address the sandbox connected
// to: otherwise a sandbox could send "SNI: pypi.org" to any address. Such a
// name may only resolve into the internal ranges (cloud metadata, private
// networks) when an allowOut CIDR opens them.
//
// Two more things happen here when the policy asks for them. TLS to a host
// with transform rules is terminated with a certificate from the node's
// interception CA and its requests are rewritten (intercept.go). A sandbox
// with an upstream SOCKS5 proxy has all of its TCP redirected here, and
// every allowed connection is dialled through that proxy (upstream.go).
package egress

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/semaphore"

	"github.com/cubicle-dev/cubicle/internal/network"
)

// Policies is what the proxy reads from the network manager, live, per
// connection (network.Linux implements it).
type Policies interface {
	SandboxPolicy(addr netip.Addr) (id string, p network.Policy, ok bool)
	// Judge is the one egress judgement (the nft chain's too): every dial
	// the proxy makes for a sandbox is judged by it first.
	Judge(p network.Policy, ip netip.Addr, r network.Route) network.Verdict
	Resolvers() []netip.Addr
	// ResolveUpstream returns where an egress proxy address may be dialled.
	ResolveUpstream(ctx context.Context, address string) ([]netip.AddrPort, error)
}

// Option configures a Proxy.
type Option func(*Proxy)

// Limits on what one connection may cost before it is judged.
const (
	peekTimeout = 10 * time.Second
	dialTimeout = 10 * time.Second
	// idleTimeout ends a spliced connection on which nothing moved either
	// way for this long, so abandoned connections do not hold the caps.
	idleTimeout   = 15 * time.Minute
	maxHeaderSize = 64 << 10
	maxConns      = 8192
	// maxPerSandbox keeps one sandbox from using up maxConns for all.
	maxPerSandbox = 1024
)

// Verdicts, as counted.
const (
	verdictAllowName = "allowed_name"
	verdictAllowIP   = "allowed_ip"
	verdictBlocked   = "blocked"
	verdictError     = "error"
)

// Proxy serves one listener.
type Proxy struct {
	ln       net.Listener
	pol      Policies
	log      *slog.Logger
	resolver *net.Resolver
	dialer   net.Dialer
	sem      chan struct{}
	bytes    *semaphore.Weighted // proxyBudget
	conns    *prometheus.CounterVec
	icpt     *interception  // nil: rules are not applied (and are refused upstream)
	dnsConn  net.PacketConn // nil: no DNS for tunnelled sandboxes (WithDNS)
	fake     fakeDNS

	mu     sync.Mutex
	active map[net.Conn]struct{}
	per    map[string]*budget // by sandbox ID
	closed bool
	wg     sync.WaitGroup
}

// New makes a proxy for ln (on the bridge's gateway address). reg may be
// nil.
func New(ln net.Listener, pol Policies, log *slog.Logger, reg prometheus.Registerer, opts ...Option) *Proxy {
	if log == nil {
		log = slog.Default()
	}
	p := &Proxy{ln: ln, pol: pol, log: log, sem: make(chan struct{}, maxConns), active: map[net.Conn]struct{}{}, per: map[string]*budget{},
		bytes:  semaphore.NewWeighted(proxyBudget),
		dialer: net.Dialer{Timeout: dialTimeout, KeepAlive: 30 * time.Second},
		conns: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "cubicle_egress_connections_total",
			Help: "Sandbox connections the egress proxy judged, by verdict."}, []string{"verdict"})}
	if reg != nil {
		reg.MustRegister(p.conns)
	}
	if rs := pol.Resolvers(); len(rs) > 0 {
		p.resolver = &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, nw, _ string) (net.Conn, error) {
			var last error
			for _, r := range rs {
				c, err := p.dialer.DialContext(ctx, nw, netip.AddrPortFrom(r, 53).String())
				if err == nil {
					return c, nil
				}
				last = err
			}
			return nil, last
		}}
	} else {
		p.resolver = net.DefaultResolver
	}
	for _, o := range opts {
		o(p)
	}
	return p
}

// Serve accepts until Close. Connections are served concurrently.
func (p *Proxy) Serve() error {
	if p.dnsConn != nil {
		p.wg.Add(1)
		go func() { defer p.wg.Done(); p.serveDNS(p.dnsConn) }()
	}
	for {
		c, err := p.ln.Accept()
		if err != nil {
			p.mu.Lock()
			closed := p.closed
			p.mu.Unlock()
			if closed {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return err
		}
		select {
		case p.sem <- struct{}{}:
		default:
			c.Close() // over the limit: fail closed
			continue
		}
		if !p.track(c, true) {
			c.Close()
			<-p.sem
			continue
		}
		p.wg.Add(1)
		go func() {
			defer func() { p.track(c, false); c.Close(); <-p.sem; p.wg.Done() }()
			p.handle(c)
		}()
	}
}

func (p *Proxy) track(c net.Conn, add bool) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if add {
		if p.closed {
			return false
		}
		p.active[c] = struct{}{}
	} else {
		delete(p.active, c)
	}
	return true
}

// Close stops accepting and ends every connection.
func (p *Proxy) Close() error {
	p.mu.Lock()
	p.closed = true
	for c := range p.active {
		c.Close()
	}
	p.mu.Unlock()
	err := p.ln.Close()
	if p.dnsConn != nil {
		_ = p.dnsConn.Close()
	}
	p.wg.Wait()
	return err
}

// hold counts a connection of sandbox id and returns its budget; nil when
// the sandbox is at its connection limit.
func (p *Proxy) hold(id string) *budget {
	p.mu.Lock()
	defer p.mu.Unlock()
	b := p.per[id]
	if b == nil {
		b = &budget{bytes: semaphore.NewWeighted(sandboxBudget)}
		p.per[id] = b
	}
	if b.conns >= maxPerSandbox {
		return nil
	}
	b.conns++
	return b
}

func (p *Proxy) unhold(id string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if b := p.per[id]; b != nil {
		if b.conns--; b.conns <= 0 {
			delete(p.per, id)
		}
	}
}

func (p *Proxy) count(v string) { p.conns.WithLabelValues(v).Inc() }

func (p *Proxy) handle(c net.Conn) {
	src, err := netip.ParseAddrPort(c.RemoteAddr().String())
	if err != nil {
		return
	}
	id, pol, ok := p.pol.SandboxPolicy(src.Addr())
	if !ok {
		p.count(verdictBlocked)
		return
	}
	b := p.hold(id)
	if b == nil {
		p.count(verdictBlocked)
		return
	}
	defer p.unhold(id)
	dst, err := originalDst(c)
	if err != nil || dst.String() == c.LocalAddr().String() {
		// Not redirected: a sandbox connecting to the proxy itself.
		p.count(verdictBlocked)
		return
	}
	log := p.log.With("sandbox", id, "dst", dst.String())
	br := bufio.NewReaderSize(c, readBuf)
	var mapped string // the name a tunnelled sandbox resolved to dst (dns.go)
	if pol.Tunnels() {
		if dst.Port() == 53 {
			// Its DNS is answered here, never forwarded.
			p.serveDNSTCP(c, br, src.Addr(), b)
			return
		}
		if fakeNet.Contains(dst.Addr()) {
			mapped = p.fakeName(id, dst.Addr())
		}
	}
	if !pol.Intercepts(dst.Port()) {
		// Tunnelled TCP on ports no rule names: judged by address, no
		// peeking (the server may be the one to speak first).
		up := p.dialFor(log, pol, "", mapped, dst)
		if up == nil {
			return
		}
		defer up.Close()
		splice(c, br, up)
		return
	}
	_ = c.SetReadDeadline(time.Now().Add(peekTimeout))
	first, err := br.Peek(1)
	if err != nil {
		return
	}
	cost := int64(headCost)
	if first[0] == 0x16 {
		cost = maxHelloSize
	}
	release := p.reserve(b, cost)
	if release == nil {
		log.Info("egress: the memory budget for reading requests is spent; connection closed")
		p.count(verdictBlocked)
		return
	}
	if first[0] != 0x16 {
		p.serveHTTP(log, c, br, b, release, id, src.Addr(), pol, mapped, dst)
		return
	}
	// A TLS handshake record.
	var seen bytes.Buffer
	name := serverName(io.TeeReader(&limited{r: br, n: maxHelloSize}, &seen))
	_ = c.SetReadDeadline(time.Time{})
	rules, _ := network.RulesFor(pol.Rules, name)
	if tlsRules := network.ForPort(rules, false, dst.Port()); len(tlsRules) > 0 && p.icpt != nil && !isIP(name) {
		p.intercept(log, c, io.MultiReader(&seen, br), release, id, src.Addr(), pol, name, tlsRules, dst)
		return
	}
	p.relaySeen(log, c, br, release, pol, name, mapped, dst, &seen)
}

// relaySeen dials name (or dst, when name is "") as pol allows, replays the
// bytes already read, gives their budget back (release, once) and splices
// the rest of the connection.
func (p *Proxy) relaySeen(log *slog.Logger, c net.Conn, br *bufio.Reader, release func(), pol network.Policy, name, mapped string, dst netip.AddrPort, seen *bytes.Buffer) {
	released := false
	free := func() {
		if !released {
			released = true
			release()
		}
	}
	defer free()
	up := p.dialFor(log, pol, name, mapped, dst)
	if up == nil {
		return
	}
	defer up.Close()
	if _, err := up.Write(seen.Bytes()); err != nil {
		return
	}
	*seen = bytes.Buffer{}
	free()
	splice(c, br, up)
}

func isIP(s string) bool {
	_, err := netip.ParseAddr(s)
	return err == nil
}

// serveHTTP judges each request on a plain connection by its Host (a later
// request on a kept-alive connection must name the same host, or the
// connection is closed) and relays it; an upgrade or CONNECT switches to a
// byte splice after the request. Bytes that are not HTTP are judged by the
// destination address. Every head is read within maxHeaderSize and the
// budget (release returns the first one's reservation); bodies are
// streamed, never buffered.
//
// Rules that apply to plain HTTP (network.Rule.Plain) on the connection's
// port set their headers on each request to their host, as the intercepted
// HTTPS path does (intercept.go).
func (p *Proxy) serveHTTP(log *slog.Logger, c net.Conn, br *bufio.Reader, b *budget, release func(), id string, src netip.Addr, pol network.Policy, mapped string, dst netip.AddrPort) {
	var seen bytes.Buffer
	req, err := http.ReadRequest(bufio.NewReaderSize(io.TeeReader(&limited{r: br, n: maxHeaderSize}, &seen), readBuf))
	deadline(c, false)
	if err != nil {
		// Not HTTP (or headers over the limit): the address rules decide.
		p.relaySeen(log, c, br, release, pol, "", mapped, dst, &seen)
		return
	}
	host := hostOf(req.Host)
	up := p.dialFor(log, pol, host, mapped, dst)
	if up == nil {
		release()
		return
	}
	defer up.Close()
	done := make(chan struct{})
	var answering atomic.Bool // a refusal is to follow the upstream's responses
	go func() {
		_, _ = io.Copy(c, up)
		if !answering.Load() {
			closeWrite(c)
		}
		close(done)
	}()
	// The first request was parsed from a copy: it is read again from what
	// was seen plus the rest of the stream, so nothing is lost to read-ahead.
	lim := &limited{r: io.MultiReader(&seen, br), n: maxHeaderSize}
	cr := bufio.NewReaderSize(lim, readBuf)
	var refuse *http.Response // answered to the sandbox once the earlier responses are through
	for first := true; ; first = false {
		if !first {
			// Wait for the next head holding no reservation, then read it
			// whole within the limit, the budget and peekTimeout.
			if _, err := cr.Peek(1); err != nil {
				break
			}
			if release = p.reserve(b, headCost); release == nil {
				log.Info("egress: the memory budget for reading requests is spent; connection closed")
				break
			}
			deadline(c, true)
			lim.n = maxHeaderSize
		}
		req, err := http.ReadRequest(cr)
		lim.n = -1
		deadline(c, false)
		release()
		if err != nil {
			if errors.Is(err, errHeadTooLarge) {
				log.Debug("egress: request head over the limit; connection closed", "limit", maxHeaderSize)
			}
			break
		}
		if hostOf(req.Host) != host {
			log.Debug("egress: another host on a kept-alive connection", "first", host, "now", req.Host)
			break
		}
		if len(req.Header.Values("User-Agent")) == 0 {
			req.Header["User-Agent"] = []string{""} // Write would add Go's
		}
		if refuse = p.transformPlain(log, req, id, src, host, dst.Port()); refuse != nil {
			answering.Store(true)
			break
		}
		if err := req.Write(up); err != nil {
			break
		}
		if req.Method == http.MethodConnect || req.Header.Get("Upgrade") != "" {
			_, _ = io.Copy(up, cr)
			break
		}
	}
	closeWrite(up)
	<-done
	if refuse != nil {
		_ = refuse.Write(c)
		closeWrite(c)
	}
}

// transformPlain sets the headers of the host's plain-HTTP rules on req,
// read from the sandbox's live policy, or returns the response that refuses
// it: TRACE, TRACK and CONNECT are not forwarded to a host with rules (TRACE
// would echo the values back), and a secret that cannot be read sends
// nothing.
func (p *Proxy) transformPlain(log *slog.Logger, req *http.Request, id string, src netip.Addr, host string, port uint16) *http.Response {
	liveID, live, ok := p.pol.SandboxPolicy(src)
	if !ok || liveID != id {
		return nil
	}
	rules, _ := network.RulesFor(live.Rules, host)
	set := network.ForPort(rules, true, port)
	if len(set) == 0 {
		return nil
	}
	switch req.Method {
	case "TRACE", "TRACK", http.MethodConnect:
		return plainError(http.StatusMethodNotAllowed, req.Method+" is not forwarded to a host with transform rules")
	}
	headers, err := p.ruleHeaders(req.Context(), id, set)
	if err != nil {
		log.Info("egress: transform not applied", "host", host, "err", err)
		return plainError(http.StatusBadGateway, err.Error())
	}
	// A header the sandbox listed in Connection would be dropped as
	// hop-by-hop on the way; the rule's must arrive.
	if conn := req.Header.Values("Connection"); len(conn) > 0 {
		var keep []string
		for _, v := range conn {
			for _, tok := range strings.Split(v, ",") {
				if tok = strings.TrimSpace(tok); tok != "" && headers.Get(tok) == "" {
					keep = append(keep, tok)
				}
			}
		}
		req.Header.Del("Connection")
		if len(keep) > 0 {
			req.Header.Set("Connection", strings.Join(keep, ", "))
		}
	}
	for k, v := range headers {
		req.Header[k] = v
	}
	return nil
}

func plainError(status int, msg string) *http.Response {
	body := "cubicle egress proxy: " + msg + "\n"
	return &http.Response{StatusCode: status, ProtoMajor: 1, ProtoMinor: 1, Close: true, ContentLength: int64(len(body)),
		Header: http.Header{"Content-Type": {"text/plain; charset=utf-8"}}, Body: io.NopCloser(strings.NewReader(body))}
}

// dialFor applies the policy to one connection and dials its upstream, or
// returns nil when it is blocked. name is the one the connection carries
// (Host, SNI); mapped the one a tunnelled sandbox resolved dst from.
func (p *Proxy) dialFor(log *slog.Logger, pol network.Policy, name, mapped string, dst netip.AddrPort) net.Conn {
	allow, deny := pol.Domains()
	if name != "" {
		if _, err := netip.ParseAddr(name); err == nil {
			name = "" // an IP literal: the address rules decide
		}
	}
	// A stand-in address means nothing outside: the name it stands for is
	// dialled, through the upstream.
	fake := pol.Tunnels() && fakeNet.Contains(dst.Addr())
	if name == "" && fake {
		name = mapped
	}
	ctx, cancel := context.WithTimeout(context.Background(), dialTimeout)
	defer cancel()
	switch {
	case name != "" && matchAny(allow, name) && pol.Upstream != nil:
		// The upstream resolves the name in its own network (SOCKS5
		// remote DNS), where the host's internal ranges mean nothing.
		up, err := p.dialUpstream(ctx, pol.Upstream, net.JoinHostPort(name, strconv.Itoa(int(dst.Port()))))
		if err != nil {
			log.Info("egress: via the egress proxy", "name", name, "err", err)
			p.count(verdictError)
			return nil
		}
		p.count(verdictAllowName)
		return up
	case name != "" && matchAny(allow, name):
		ips, err := p.resolver.LookupNetIP(ctx, "ip4", name)
		if err != nil {
			log.Debug("egress: allowed name does not resolve", "name", name, "err", err)
			p.count(verdictError)
			return nil
		}
		for _, ip := range ips {
			if v := p.pol.Judge(pol, ip, network.ByName); v != network.Allowed {
				log.Info("egress: allowed name resolves to an address the policy does not open; refused", "name", name, "ip", ip, "verdict", v)
				continue
			}
			up, err := p.dialer.DialContext(ctx, "tcp", netip.AddrPortFrom(ip.Unmap(), dst.Port()).String())
			if err == nil {
				p.count(verdictAllowName)
				return up
			}
			log.Debug("egress: dial", "name", name, "ip", ip, "err", err)
		}
		p.count(verdictError)
		return nil
	case name != "" && matchAny(deny, name):
		log.Debug("egress: name denied", "name", name)
		p.count(verdictBlocked)
		return nil
	case fake:
		// Resolved by the upstream in its own network: only what the policy
		// says of every address applies (network.Remote).
		if name == "" || p.pol.Judge(pol, netip.Addr{}, network.Remote) != network.Allowed {
			log.Debug("egress: blocked", "name", name)
			p.count(verdictBlocked)
			return nil
		}
		up, err := p.dialUpstream(ctx, pol.Upstream, net.JoinHostPort(name, strconv.Itoa(int(dst.Port()))))
		if err != nil {
			log.Info("egress: via the egress proxy", "name", name, "err", err)
			p.count(verdictError)
			return nil
		}
		p.count(verdictAllowName)
		return up
	case p.pol.Judge(pol, dst.Addr(), route(dst)) == network.Allowed:
		var up net.Conn
		var err error
		if pol.Upstream != nil {
			up, err = p.dialUpstream(ctx, pol.Upstream, dst.String())
		} else {
			up, err = p.dialer.DialContext(ctx, "tcp", dst.String())
		}
		if err != nil {
			log.Debug("egress: dial", "err", err)
			p.count(verdictError)
			return nil
		}
		p.count(verdictAllowIP)
		return up
	default:
		log.Debug("egress: blocked", "name", name)
		p.count(verdictBlocked)
		return nil
	}
}

// route is how the chain would judge a connection to dst.
func route(dst netip.AddrPort) network.Route {
	if dst.Port() == 53 {
		return network.ToDNS
	}
	return network.ByAddress
}

func matchAny(patterns []string, host string) bool {
	for _, d := range patterns {
		if network.MatchDomain(d, host) {
			return true
		}
	}
	return false
}

// hostOf is the name in a Host header or CONNECT target, without port or
// IPv6 brackets, lower-cased.
func hostOf(h string) string {
	if host, _, err := net.SplitHostPort(h); err == nil {
		h = host
	}
	return strings.ToLower(strings.TrimSuffix(strings.Trim(h, "[]"), "."))
}

// errGotHello ends the handshake once the ClientHello has been read.
var errGotHello = errors.New("egress: client hello read")

// serverName reads a TLS ClientHello from r and returns its SNI ("" when it
// has none or is not a ClientHello). crypto/tls does the parsing; nothing is
// ever written back.
func serverName(r io.Reader) string {
	var name string
	conn := tls.Server(readOnly{r}, &tls.Config{GetConfigForClient: func(h *tls.ClientHelloInfo) (*tls.Config, error) {
		name = h.ServerName
		return nil, errGotHello
	}})
	_ = conn.Handshake()
	return strings.ToLower(name)
}

// readOnly is a net.Conn that reads from r and drops writes (the alert
// crypto/tls sends when the handshake is abandoned).
type readOnly struct{ r io.Reader }

func (c readOnly) Read(b []byte) (int, error)     { return c.r.Read(b) }
func (readOnly) Write(b []byte) (int, error)      { return len(b), nil }
func (readOnly) Close() error                     { return nil }
func (readOnly) LocalAddr() net.Addr              { return &net.TCPAddr{} }
func (readOnly) RemoteAddr() net.Addr             { return &net.TCPAddr{} }
func (readOnly) SetDeadline(time.Time) error      { return nil }
func (readOnly) SetReadDeadline(time.Time) error  { return nil }
func (readOnly) SetWriteDeadline(time.Time) error { return nil }

// splice copies both ways (the client's side from br, which may hold
// buffered bytes) until both are done, half-closing as each ends.
func splice(c net.Conn, br io.Reader, up net.Conn) {
	var last atomic.Int64
	last.Store(time.Now().UnixNano())
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		// Idle watchdog: a read deadline per Read would cost a syscall per
		// chunk; a coarse tick does not.
		t := time.NewTicker(idleTimeout / 15)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				if time.Since(time.Unix(0, last.Load())) > idleTimeout {
					c.Close()
					up.Close()
					return
				}
			}
		}
	}()
	done := make(chan struct{})
	go func() {
		_, _ = io.Copy(activity{c, &last}, up)
		closeWrite(c)
		close(done)
	}()
	_, _ = io.Copy(activity{up, &last}, br)
	closeWrite(up)
	<-done
}

// activity is a writer that notes when it was last written to.
type activity struct {
	w    io.Writer
	last *atomic.Int64
}

func (a activity) Write(b []byte) (int, error) {
	a.last.Store(time.Now().UnixNano())
	return a.w.Write(b)
}

func closeWrite(c net.Conn) {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
		return
	}
	_ = c.Close()
}
