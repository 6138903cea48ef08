// Package proxy is the data plane: it routes requests for
// <port>-<sandboxID>.<domain> hosts, or for the shared sandbox URL carrying
// E2b-Sandbox-Id / E2b-Sandbox-Port headers, to the sandbox's agent or to any
// port a process in the sandbox listens on.
package proxy

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/net/http/httpguts"
	"golang.org/x/time/rate"

	"github.com/cubicle-dev/cubicle/internal/agentapi"
	"github.com/cubicle-dev/cubicle/internal/clientrate"
	"github.com/cubicle-dev/cubicle/internal/clusterpki"
	"github.com/cubicle-dev/cubicle/internal/control"
	"github.com/cubicle-dev/cubicle/internal/node"
	"github.com/cubicle-dev/cubicle/internal/store"
	"github.com/cubicle-dev/cubicle/internal/template"
)

const (
	headerSandboxID    = "E2b-Sandbox-Id"
	headerSandboxPort  = "E2b-Sandbox-Port"
	headerTrafficToken = "E2b-Traffic-Access-Token"
	headerAPIKey       = "X-API-Key"
	headerAccessToken  = "X-Access-Token"

	// codeInterpreterPort is where the code interpreter SDKs send /execute
	// (e2b's JUPYTER_PORT).
	codeInterpreterPort = 49999
)

// Config configures the proxy.
type Config struct {
	// Domain, when set, is the suffix of <port>-<id>.<domain> hosts.
	Domain string
	Logger *slog.Logger
	// Limits bound the requests in flight and how long a sandbox may take
	// to answer; the zero value bounds nothing.
	Limits Limits
	// Registry, when set, gets the proxy's metrics.
	Registry prometheus.Registerer
	// SignedLookupRate and SignedLookupBurst bound, per client address,
	// the signed /files requests that name no sandbox (each is matched
	// against every running sandbox's token); 0 means 10/s, bursts of 20.
	SignedLookupRate  float64
	SignedLookupBurst int
	// Nodes, when set, routes sandboxes held by other nodes through their
	// data plane; nil (embedded mode) dials every sandbox directly.
	Nodes *NodeRoutes
}

// Defaults for the signed-URL lookup limit. A lookup hashes the URL once
// per running sandbox; 10 a second (bursts of 20) per client address is
// far above what a browser fetching signed URLs does and bounds what one
// address can make the server compute.
const (
	defaultLookupRate  = 10
	defaultLookupBurst = 20
)

// Proxy routes sandbox traffic and hands everything else to the API.
type Proxy struct {
	cfg Config
	mgr *control.Manager
	st  store.Store
	api http.Handler
	rp  *httputil.ReverseProxy
	lim *limiter
	log *slog.Logger
	// lookups limits bySignature per client address.
	lookups *clientrate.Limiter
}

type targetKey struct{}

type target struct {
	sb   *store.Sandbox
	addr netip.AddrPort
	// pool is the URL host: node.SandboxHost, so that every sandbox has its
	// own keep-alive pool rather than inheriting the connections to a dead
	// sandbox that had the same address.
	pool string
}

// New wraps api: requests that name a sandbox are proxied, the rest served by api.
// It panics on a cfg.Nodes without DataAddress or Dialer: that is a wiring
// mistake, not an input.
func New(cfg Config, mgr *control.Manager, st store.Store, api http.Handler) *Proxy {
	if cfg.Nodes != nil && (cfg.Nodes.DataAddress == nil || cfg.Nodes.Dialer == nil) {
		panic("proxy: Config.Nodes needs DataAddress and Dialer")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.SignedLookupRate <= 0 {
		cfg.SignedLookupRate = defaultLookupRate
	}
	if cfg.SignedLookupBurst <= 0 {
		cfg.SignedLookupBurst = defaultLookupBurst
	}
	p := &Proxy{cfg: cfg, mgr: mgr, st: st, api: api, log: cfg.Logger, lim: newLimiter(cfg.Limits, cfg.Registry),
		lookups: clientrate.New(rate.Limit(cfg.SignedLookupRate), cfg.SignedLookupBurst, clientrate.MaxClients)}
	idle := cfg.Limits.IdleConns
	if idle <= 0 {
		idle = 1024
	}
	newTransport := func(responseStart time.Duration, idle int) *http.Transport {
		return &http.Transport{
			DialContext:         p.dial(node.DialSandbox(&net.Dialer{Timeout: 3 * time.Second, KeepAlive: 30 * time.Second})),
			MaxIdleConns:        max(idle, 1),
			MaxIdleConnsPerHost: min(64, max(idle, 1)),
			IdleConnTimeout:     60 * time.Second,
			// Once the request is written: 0 for envd's streams, which
			// may wait arbitrarily long for a command's output.
			ResponseHeaderTimeout: responseStart,
			DisableCompression:    true,
			// Only httpsPorts are dialled with TLS. Their certificates are not
			// verified (e2b's contract: self-signed ones work): the hop is the
			// node's own bridge to a sandbox it just resolved by ID, so there
			// is no third party to authenticate against.
			TLSClientConfig:     &tls.Config{InsecureSkipVerify: true}, //nolint:gosec // see above
			TLSHandshakeTimeout: 10 * time.Second,
		}
	}
	tr := portTransport{agent: newTransport(0, idle/2), user: newTransport(cfg.Limits.ResponseStart, idle-idle/2)}
	p.rp = &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			t := pr.In.Context().Value(targetKey{}).(target)
			pr.Out.URL.Scheme = "http"
			port := int(t.addr.Port())
			if servesTLS(t.sb, port) {
				pr.Out.URL.Scheme = "https"
			}
			pr.Out.URL.Host = t.pool // the Host header stays the inbound one...
			if h := maskedHost(t.sb, port); h != "" {
				pr.Out.Host = h // ...unless the sandbox asked for a mask
			}
			pr.Out.Header.Del(headerTrafficToken)
			// Cubicle's API key never reaches a sandbox (CubeSandbox's SDK
			// sends it on data-plane requests too): code there is hostile.
			pr.Out.Header.Del(headerAPIKey)
			pr.SetXForwarded()
		},
		Transport:  tr,
		BufferPool: newBufferPool(),
		ModifyResponse: func(res *http.Response) error {
			t := res.Request.Context().Value(targetKey{}).(target)
			if int(t.addr.Port()) == node.AgentPort && connectStreaming(res) {
				res.Body = &endStream{body: res.Body, msg: "the connection to sandbox " + t.sb.ID + " ended before the stream completed"}
			}
			return nil
		},
		FlushInterval: -1, // flush every write: Connect streams and SSE must not be buffered
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			if errors.Is(err, context.Canceled) {
				return
			}
			t := r.Context().Value(targetKey{}).(target)
			if p.remote(t.sb.Node) && remoteUnreachable(w, t.sb, err) {
				return
			}
			if errors.Is(err, syscall.ECONNREFUSED) {
				// The sandbox answered, so this is not the timeout the SDKs
				// read a bare 502 as.
				portClosed(w, t.sb, int(t.addr.Port()))
				return
			}
			if port := int(t.addr.Port()); p.cfg.Limits.ResponseStart > 0 && !exemptPort(port) && responseStartTimeout(err) {
				p.lim.timeouts.Inc()
				writeSandboxError(w, sandboxError{Code: http.StatusGatewayTimeout, SandboxID: t.sb.ID, Port: port,
					Message: "the sandbox's port " + strconv.Itoa(port) + " did not start its response in time (at most " + p.cfg.Limits.ResponseStart.String() + " once the request is sent)"})
				return
			}
			p.log.Warn("proxy upstream error", "host", r.Host, "path", r.URL.Path, "err", err)
			writeError(w, http.StatusBadGateway, "sandbox is not reachable: "+err.Error())
		},
	}
	return p
}

// sandboxError is the body of e2b's proxy errors about one sandbox
// (packages/shared/pkg/proxy/template: sandboxId, message, code, and the port
// when it is closed).
type sandboxError struct {
	Code      int    `json:"code"`
	Message   string `json:"message"`
	SandboxID string `json:"sandboxId"`
	Port      int    `json:"port,omitempty"`
}

func writeSandboxError(w http.ResponseWriter, e sandboxError) {
	b, _ := json.Marshal(e)
	writeBody(w, e.Code, b)
}

// portClosed answers a request whose dial to port was refused: the sandbox is
// live but nothing listens there.
func portClosed(w http.ResponseWriter, sb *store.Sandbox, port int) {
	if port == codeInterpreterPort {
		// 404: the SDKs show its body as a NotFoundError; a 502 they would
		// blame on the sandbox timing out.
		tpl := sb.TemplateID
		if sb.Alias != "" && sb.Alias != sb.TemplateID {
			tpl = sb.Alias + " (" + sb.TemplateID + ")"
		}
		msg := "no code interpreter is running in sandbox " + sb.ID + " (nothing listens on port " + strconv.Itoa(port) + "): "
		if sb.TemplateID == template.CodeInterpreterTemplate {
			msg += "the interpreter found no kernel it could start, or the agent has exited (the sandbox image may have been changed)"
		} else {
			msg += "its template " + tpl + " has no python3 with ipykernel; create the sandbox from " +
				template.CodeInterpreterTemplate + " or a template built from it"
		}
		writeSandboxError(w, sandboxError{Code: http.StatusNotFound, SandboxID: sb.ID, Port: port, Message: msg})
		return
	}
	// e2b's text (template/port_closed.go); the port is in its own field.
	writeSandboxError(w, sandboxError{Code: http.StatusBadGateway, SandboxID: sb.ID, Port: port,
		Message: "The sandbox is running but port is not open"})
}

func writeError(w http.ResponseWriter, status int, msg string) {
	b, _ := json.Marshal(map[string]any{"code": status, "message": msg})
	writeBody(w, status, b)
}

func writeBody(w http.ResponseWriter, status int, b []byte) {
	w.Header().Set("Content-Type", "application/json")
	// A sized body is complete once flushed, so a client still sending its
	// request body can read the error while forward drains that body.
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(status)
	w.Write(b)
}

// route extracts the sandbox ID and port a request is for; ok is false for
// API requests.
func (p *Proxy) route(r *http.Request) (id string, port int, ok bool, err error) {
	if hid := r.Header.Get(headerSandboxID); hid != "" || r.Header.Get(headerSandboxPort) != "" {
		port = node.AgentPort
		if hp := r.Header.Get(headerSandboxPort); hp != "" {
			if port, err = strconv.Atoi(hp); err != nil || port < 1 || port > 65535 {
				return "", 0, true, errors.New("invalid " + headerSandboxPort + " header")
			}
		}
		if hid == "" {
			return "", 0, true, errors.New(headerSandboxID + " header is required with " + headerSandboxPort)
		}
		return hid, port, true, nil
	}
	host := r.Host
	if h, _, e := net.SplitHostPort(host); e == nil {
		host = h
	}
	label, rest, found := strings.Cut(host, ".")
	if !found {
		return "", 0, false, nil
	}
	if p.cfg.Domain != "" && rest != p.cfg.Domain {
		return "", 0, false, nil
	}
	ps, sid, found := strings.Cut(label, "-")
	if !found {
		return "", 0, false, nil
	}
	port, e := strconv.Atoi(ps)
	if e != nil || port < 1 || port > 65535 {
		return "", 0, false, nil
	}
	return sid, port, true, nil
}

func validID(id string) bool {
	if id == "" || len(id) > 64 {
		return false
	}
	for _, c := range id {
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') {
			return false
		}
	}
	return true
}

// ServeHTTP implements http.Handler.
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	id, port, ok, err := p.route(r)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	if !ok {
		// Signed upload/download URLs reach the shared URL (E2B_SANDBOX_URL)
		// without headers; find the sandbox whose token produced the
		// signature. The SDKs' <port>-<id>.<domain> URLs name the sandbox
		// and never get here. Each lookup hashes once per running sandbox
		// and needs no credential, so they are limited per client address.
		if r.URL.Path == "/files" && r.URL.Query().Get("signature") != "" {
			if ok, retry := p.lookups.Allow(clientrate.RemoteAddr(r), time.Now()); !ok {
				w.Header().Set("Retry-After", strconv.Itoa(int(retry/time.Second)+1))
				writeError(w, http.StatusTooManyRequests, "too many signed /files requests without a sandbox from this address; "+
					"use the URL's <port>-<sandboxID>.<domain> host, or send "+headerSandboxID+", to skip the lookup")
				return
			}
			if sb := p.bySignature(r); sb != nil {
				p.forward(w, r, sb, node.AgentPort)
				return
			}
			// No running sandbox's token made it: to the caller this is what
			// envd answers for a wrong signature.
			writeError(w, http.StatusUnauthorized, agentapi.ErrInvalidSignature.Error())
			return
		}
		p.api.ServeHTTP(w, r)
		return
	}
	if !validID(id) {
		writeError(w, http.StatusBadRequest, "invalid sandbox ID "+strconv.Quote(id))
		return
	}
	sb, err := p.st.GetSandbox(r.Context(), id)
	if err != nil || !sb.State.Live() {
		// e2b's client-proxy answer (shared/pkg/proxy/template/
		// sandbox_not_found.go); 502 is what the SDKs read as "sandbox not
		// running". A caller that holds the sandbox's token learns how and
		// when it ended.
		msg := "The sandbox was not found"
		if err == nil && holdsToken(r, sb) {
			if how := control.EndedReason(sb); how != "" {
				msg += ": " + how
			}
		}
		writeSandboxError(w, sandboxError{Code: http.StatusBadGateway, SandboxID: id, Message: msg})
		return
	}
	if port == node.AgentPort && r.URL.Path == "/init" {
		// /init hands the agent its token; only the control plane may call it.
		writeError(w, http.StatusForbidden, "/init is internal")
		return
	}
	if port != node.AgentPort && !sb.Network.AllowPublicTraffic {
		got := r.Header.Get(headerTrafficToken)
		if subtle.ConstantTimeCompare([]byte(got), []byte(sb.TrafficToken)) != 1 {
			writeError(w, http.StatusForbidden, "this sandbox requires the "+headerTrafficToken+" header")
			return
		}
	}
	if sb.State != store.StateRunning {
		// A lost sandbox with a pause package was paused: Connect resumes
		// it on another node.
		if (sb.State == store.StatePaused || (sb.State == store.StateLost && sb.PausePackage != nil)) && sb.AutoResume {
			if sb, _, err = p.mgr.Connect(r.Context(), id, 0, false); err != nil {
				writeSandboxError(w, sandboxError{Code: http.StatusBadGateway, SandboxID: id, Message: "auto-resume failed: " + err.Error()})
				return
			}
		} else {
			writeSandboxError(w, sandboxError{Code: http.StatusBadGateway, SandboxID: id, Message: "The sandbox " + id + " is " + string(sb.State)})
			return
		}
	}
	if port == codeInterpreterPort && sb.EnvdToken != "" && r.Header.Get(headerAccessToken) == "" && p.ownerKey(r, sb) {
		// CubeSandbox's SDK authenticates its run_code with the team's API
		// key, not the sandbox's access token: the key proves the caller
		// owns the sandbox, so the interpreter gets the token it checks.
		r.Header.Set(headerAccessToken, sb.EnvdToken)
	}
	p.forward(w, r, sb, port)
}

// ownerKey reports whether r carries an API key of sb's team.
func (p *Proxy) ownerKey(r *http.Request, sb *store.Sandbox) bool {
	key := r.Header.Get(headerAPIKey)
	if key == "" {
		return false
	}
	k, err := p.st.APIKeyByHash(r.Context(), hashKey(key))
	return err == nil && k.TeamID != store.SystemTeamID && k.TeamID == sb.TeamID
}

// hashKey is how API keys are stored (api.HashKey; the proxy sits below the
// API and does not import it).
func hashKey(key string) string {
	h := sha256.Sum256([]byte(key))
	return hex.EncodeToString(h[:])
}

func (p *Proxy) forward(w http.ResponseWriter, r *http.Request, sb *store.Sandbox, port int) {
	addr, err := netip.ParseAddr(sb.Addr)
	if err != nil {
		writeError(w, http.StatusBadGateway, "sandbox "+sb.ID+" has no address")
		return
	}
	ap := netip.AddrPortFrom(addr, uint16(port))
	pool := node.SandboxHost(sb.ID, ap)
	if p.remote(sb.Node) {
		// Node IDs are DNS labels (clusterpki.ValidateNodeID), which is
		// what lets the pool host carry one.
		if err := clusterpki.ValidateNodeID(sb.Node); err != nil {
			writeSandboxError(w, sandboxError{Code: http.StatusBadGateway, SandboxID: sb.ID, Message: "The sandbox's node is not valid: " + err.Error()})
			return
		}
		pool = remoteHost(sb.Node, sb.ID, ap)
	}
	release := p.acquire(w, r, sb.ID, port)
	if release == nil {
		return
	}
	// Held until the response (or an upgraded connection) is done.
	defer release()
	// The upstream may answer (and we flush) before the transport has read
	// the request body to EOF; without full duplex the HTTP/1 server then
	// closes the body under the transport, which kills the upstream
	// connection mid-stream. HTTP/2 is always full duplex.
	if r.ProtoMajor == 1 {
		if http.NewResponseController(w).EnableFullDuplex() == nil {
			// With full duplex, an unread body (the dial failed, or the
			// upstream answered without reading it) is drained by the server
			// after the handler returns, after it has stopped its background
			// read; reaching EOF there starts a new background read that races
			// the next request's read and panics with "invalid concurrent
			// Body.Read call" (golang/go#68560). Draining here, before
			// returning, lets the server stop that read. Close waits for a
			// transport read still in flight and bounds what it reads itself
			// (256 KiB, then the connection is not reused); the flush first
			// sends the response, a 502 say, that the client may read before
			// it sends the rest of its body.
			//
			// An upgrade request (a WebSocket) has no body to wait for, and
			// once its 101 is sent the connection is hijacked: the flush
			// would panic in net/http (its writer is gone).
			upgrade := httpguts.HeaderValuesContainsToken(r.Header["Connection"], "Upgrade") && r.Header.Get("Upgrade") != ""
			defer func() {
				if r.Context().Err() == nil && !upgrade {
					_ = http.NewResponseController(w).Flush()
				}
				r.Body.Close()
			}()
		}
	}
	ctx := context.WithValue(r.Context(), targetKey{}, target{sb: sb, addr: ap, pool: pool})
	p.rp.ServeHTTP(w, r.WithContext(ctx))
}

// servesTLS reports whether the sandbox listed port in network.httpsPorts.
// envd's port never is (creates refuse it).
func servesTLS(sb *store.Sandbox, port int) bool {
	if port == node.AgentPort {
		return false
	}
	for _, p := range sb.Network.HTTPSPorts {
		if p == port {
			return true
		}
	}
	return false
}

// maskedHost is the Host header a sandbox's service sees under
// network.maskRequestHost ("${PORT}" becomes the port), or "" to keep the
// inbound one. envd and the code interpreter keep theirs: the mask is for
// the user's own services.
func maskedHost(sb *store.Sandbox, port int) string {
	if sb.Network.MaskRequestHost == "" || port == node.AgentPort || port == codeInterpreterPort {
		return ""
	}
	return strings.ReplaceAll(sb.Network.MaskRequestHost, "${PORT}", strconv.Itoa(port))
}

// holdsToken reports whether r carries sb's envd access token or its
// traffic token.
func holdsToken(r *http.Request, sb *store.Sandbox) bool {
	match := func(got, want string) bool {
		return got != "" && want != "" && subtle.ConstantTimeCompare([]byte(got), []byte(want)) == 1
	}
	return match(r.Header.Get("X-Access-Token"), sb.EnvdToken) || match(r.Header.Get(headerTrafficToken), sb.TrafficToken)
}

func (p *Proxy) bySignature(r *http.Request) *store.Sandbox {
	q := r.URL.Query()
	op := "read"
	if r.Method == http.MethodPost {
		op = "write"
	}
	var exp int64
	if v := q.Get("signature_expiration"); v != "" {
		exp, _ = strconv.ParseInt(v, 10, 64)
	}
	rows, err := p.st.ListSandboxes(r.Context(), store.SandboxFilter{States: []store.SandboxState{store.StateRunning}})
	if err != nil {
		return nil
	}
	sig := []byte(q.Get("signature"))
	for _, sb := range rows {
		if subtle.ConstantTimeCompare(sig, []byte(agentapi.Signature(q.Get("path"), op, q.Get("username"), sb.EnvdToken, exp))) == 1 {
			return sb
		}
	}
	return nil
}
