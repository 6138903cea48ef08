package egress

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"sync"
	"time"

	"github.com/cubicle-dev/cubicle/internal/network"
	"github.com/cubicle-dev/cubicle/internal/servecert"
)

// TLS interception, for hosts with transform rules only.
//
// Trust model: the node's interception CA (its key never leaves the host)
// is in every sandbox's trust store, so the proxy can present a
// certificate for any name to the sandbox; the host can already read and
// change everything a sandbox does, so this hands nobody new power. The
// proxy verifies the real server against the host's trust store plus the
// operator's --ca-certificates, exactly as the sandbox would have, so a
// secret is only ever sent to a server that proves it is the rule's host.
// Connections to hosts without rules are never decrypted.

// SecretFunc returns the value of the named secret of the sandbox's team.
type SecretFunc func(ctx context.Context, sandboxID, name string) (string, error)

// ErrSecret: a rule's secret placeholder could not be filled (the secret
// is gone or unreadable); the request is answered 502 and not forwarded.
var ErrSecret = errors.New("egress: secret placeholder")

const (
	leafValidity  = 7 * 24 * time.Hour
	leafRenew     = 24 * time.Hour
	maxLeaves     = 1024
	readHeaderTTL = 30 * time.Second
	keepAliveIdle = 2 * time.Minute
)

type interception struct {
	ca      *servecert.CA
	roots   *x509.CertPool
	secrets SecretFunc

	mu     sync.Mutex
	leaves map[string]*tls.Certificate
}

// WithInterception lets the proxy apply network.rules: ca issues the
// certificates sandboxes see, roots verifies the real servers (nil: the
// host's trust store), secrets fills ${e2b.secrets.<name>}.
func WithInterception(ca *servecert.CA, roots *x509.CertPool, secrets SecretFunc) Option {
	return func(p *Proxy) {
		p.icpt = &interception{ca: ca, roots: roots, secrets: secrets, leaves: map[string]*tls.Certificate{}}
	}
}

// Intercepts reports whether the proxy applies transform rules.
func (p *Proxy) Intercepts() bool { return p.icpt != nil }

// leaf returns a certificate for name, issued once and cached.
func (ic *interception) leaf(name string) (*tls.Certificate, error) {
	ic.mu.Lock()
	c := ic.leaves[name]
	ic.mu.Unlock()
	if c != nil && time.Until(c.Leaf.NotAfter) > leafRenew {
		return c, nil
	}
	// Issued outside the lock: one sandbox's new names do not hold up
	// everyone's handshakes.
	c, err := ic.ca.Issue([]string{name}, leafValidity)
	if err != nil {
		return nil, err
	}
	ic.mu.Lock()
	defer ic.mu.Unlock()
	if len(ic.leaves) >= maxLeaves {
		// Evict one arbitrary entry rather than the whole cache.
		for k := range ic.leaves {
			delete(ic.leaves, k)
			break
		}
	}
	ic.leaves[name] = c
	return c, nil
}

// intercept terminates the sandbox's TLS for name (its ClientHello is in
// hello, followed by the rest of the stream) and relays its HTTP/1.1
// requests to the real server, each with the rules' headers set. The
// connection is judged, and the first upstream dialled, before the
// sandbox's handshake completes, so a blocked name sees what it would
// without rules: a closed connection.
func (p *Proxy) intercept(log *slog.Logger, c net.Conn, hello io.Reader, release func(), id string, src netip.Addr, pol network.Policy, name string, rules []network.Rule, dst netip.AddrPort) {
	defer func() { release() }()
	first := &handoff{c: p.dialFor(log, pol, name, "", dst)}
	if first.c == nil {
		return
	}
	defer first.close()
	dial := func(ctx context.Context) (net.Conn, error) {
		raw := first.take()
		if raw == nil {
			// A later connection of this keep-alive session: judged anew
			// against the live policy.
			liveID, live, ok := p.pol.SandboxPolicy(src)
			if !ok || liveID != id {
				return nil, errors.New("sandbox gone")
			}
			if raw = p.dialFor(log, live, name, "", dst); raw == nil {
				return nil, fmt.Errorf("%s is not allowed by the egress policy now", name)
			}
		}
		tc := tls.Client(raw, &tls.Config{ServerName: name, RootCAs: p.icpt.roots, NextProtos: []string{"http/1.1"}, MinVersion: tls.VersionTLS12})
		hctx, cancel := context.WithTimeout(ctx, dialTimeout)
		defer cancel()
		if err := tc.HandshakeContext(hctx); err != nil {
			raw.Close()
			return nil, err
		}
		return tc, nil
	}
	tr := &http.Transport{
		DialTLSContext:        func(ctx context.Context, _, _ string) (net.Conn, error) { return dial(ctx) },
		DisableCompression:    true, // forward Accept-Encoding as the sandbox sent it
		MaxIdleConnsPerHost:   1,
		IdleConnTimeout:       keepAliveIdle,
		TLSHandshakeTimeout:   dialTimeout,
		ResponseHeaderTimeout: 0, // long polls are the server's business
	}
	defer tr.CloseIdleConnections()
	rp := &httputil.ReverseProxy{
		Transport: tr,
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme = "https"
			pr.Out.URL.Host = name
			pr.Out.Host = name
			// Set after ReverseProxy dropped the hop-by-hop headers, so a
			// "Connection: Authorization" from the sandbox cannot strip them.
			if set, ok := pr.In.Context().Value(headersKey{}).(http.Header); ok {
				for k, v := range set {
					pr.Out.Header[k] = v
				}
			}
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			log.Info("egress: intercepted request failed", "host", name, "err", err)
			http.Error(w, "cubicle egress proxy: "+name+": "+err.Error(), http.StatusBadGateway)
		},
	}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.Method {
		case "TRACE", "TRACK", http.MethodConnect:
			// TRACE echoes the request, injected secrets included, back
			// into the sandbox; CONNECT would tunnel past the transforms.
			http.Error(w, "cubicle egress proxy: "+r.Method+" is not forwarded to a host with transform rules", http.StatusMethodNotAllowed)
			return
		}
		if hostOf(r.Host) != name {
			// The rules (and any secret) were chosen for the SNI's host.
			http.Error(w, "cubicle egress proxy: the Host header does not match the TLS server name", http.StatusMisdirectedRequest)
			return
		}
		set := rules
		if liveID, live, ok := p.pol.SandboxPolicy(src); ok && liveID == id {
			set, _ = network.RulesFor(live.Rules, name) // updateNetwork applies per request
			set = network.ForPort(set, false, dst.Port())
		}
		headers, err := p.ruleHeaders(r.Context(), id, set)
		if err != nil {
			log.Info("egress: transform not applied", "host", name, "err", err)
			http.Error(w, "cubicle egress proxy: "+err.Error(), http.StatusBadGateway)
			return
		}
		rp.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), headersKey{}, headers)))
	})
	sc := tls.Server(prefixed{Conn: c, r: hello}, &tls.Config{
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return p.icpt.leaf(name) },
		NextProtos:     []string{"http/1.1"}, // HTTP/2 clients fall back
		MinVersion:     tls.VersionTLS12,
	})
	_ = sc.SetDeadline(time.Now().Add(peekTimeout))
	if err := sc.Handshake(); err != nil {
		log.Debug("egress: sandbox TLS handshake", "host", name, "err", err)
		return
	}
	_ = sc.SetDeadline(time.Time{})
	release() // the ClientHello has been consumed
	release = func() {}
	ln := newOneConnListener(sc)
	// A hijacked connection (a WebSocket upgrade) lives on in its handler
	// after Serve returns; the caller closes c when this returns.
	var inflight sync.WaitGroup
	srv := &http.Server{ReadHeaderTimeout: readHeaderTTL, IdleTimeout: keepAliveIdle, MaxHeaderBytes: maxHeaderSize,
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			inflight.Add(1)
			defer inflight.Done()
			h(w, r)
		}),
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelDebug),
		ConnState: func(_ net.Conn, st http.ConnState) {
			if st == http.StateClosed || st == http.StateHijacked {
				ln.done()
			}
		}}
	_ = srv.Serve(ln) // returns once the connection is closed or hijacked
	inflight.Wait()
}

// ruleHeaders is the headers set's rules put on a request of sandbox id, in
// order (a later rule wins), each ${e2b.secrets.<name>} filled with the
// current value of that secret of the sandbox's team.
func (p *Proxy) ruleHeaders(ctx context.Context, id string, set []network.Rule) (http.Header, error) {
	headers := http.Header{}
	for _, rule := range set {
		for k, v := range rule.Headers {
			val, err := network.ExpandSecrets(v, func(secret string) (string, error) {
				if p.icpt == nil || p.icpt.secrets == nil {
					return "", fmt.Errorf("%w: no secret store", ErrSecret)
				}
				val, err := p.icpt.secrets(ctx, id, secret)
				if err != nil {
					return "", fmt.Errorf("%w: secret %q: %v", ErrSecret, secret, err)
				}
				return val, nil
			})
			if err != nil {
				return nil, fmt.Errorf("header %s: %w", k, err)
			}
			headers.Set(k, val)
		}
	}
	return headers, nil
}

// headersKey carries a request's transformed headers to Rewrite.
type headersKey struct{}

// handoff holds the connection dialled to judge the name until the
// transport takes it for its first request.
type handoff struct {
	mu sync.Mutex
	c  net.Conn
}

func (h *handoff) take() net.Conn {
	h.mu.Lock()
	defer h.mu.Unlock()
	c := h.c
	h.c = nil
	return c
}

func (h *handoff) close() {
	if c := h.take(); c != nil {
		c.Close()
	}
}

// prefixed reads r (bytes already consumed from Conn, then the rest of it)
// and writes to Conn.
type prefixed struct {
	net.Conn
	r io.Reader
}

func (c prefixed) Read(b []byte) (int, error) { return c.r.Read(b) }

// oneConnListener hands out one connection, then blocks Accept until that
// connection is done, so http.Server.Serve returns when it ends.
type oneConnListener struct {
	c      net.Conn
	once   sync.Once
	closed chan struct{}
	taken  bool
	mu     sync.Mutex
}

func newOneConnListener(c net.Conn) *oneConnListener {
	return &oneConnListener{c: c, closed: make(chan struct{})}
}

func (l *oneConnListener) Accept() (net.Conn, error) {
	l.mu.Lock()
	if !l.taken {
		l.taken = true
		l.mu.Unlock()
		return l.c, nil
	}
	l.mu.Unlock()
	<-l.closed
	return nil, net.ErrClosed
}

func (l *oneConnListener) done()          { l.once.Do(func() { close(l.closed) }) }
func (l *oneConnListener) Close() error   { l.done(); return nil }
func (l *oneConnListener) Addr() net.Addr { return l.c.LocalAddr() }
