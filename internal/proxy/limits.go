package proxy

import (
	"errors"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/cubicle-dev/cubicle/internal/connlimit"
	"github.com/cubicle-dev/cubicle/internal/node"
)

// Limits bound what proxied requests may hold. Each request in flight holds
// an upstream connection (a descriptor) besides the client's, for as long
// as the sandbox takes to answer, so a sandbox port that accepts and never
// answers would otherwise collect descriptors until the process has none
// left for its API and store. A cap of 0 is no cap.
type Limits struct {
	// PerSandbox: requests in flight to one sandbox's own ports, and
	// apart from those to its envd and code interpreter, so that a flood of
	// a public port does not lock the owner out of envd; past it 503.
	PerSandbox int
	// PerClient: requests in flight from one client address (an IPv6 /64);
	// past it 429.
	PerClient int
	// Total: requests in flight through the proxy; past it 503.
	Total int
	// ResponseStart is how long a user port may take, once the request is
	// written, to start its response; past it 504. envd's port and the code
	// interpreter's are exempt: their streams (a command's output, a cell's
	// results) legitimately wait, and the caps above bound what they hold.
	// 0: no limit.
	ResponseStart time.Duration
	// IdleConns is the upstream keep-alive pool, in all (0: 1024).
	IdleConns int
}

// limiter counts proxied requests in flight.
type limiter struct {
	clients   *connlimit.Counter // per client, and the total
	sandboxes *connlimit.Counter
	refusals  *prometheus.CounterVec // by cap: client, sandbox, total
	timeouts  prometheus.Counter     // response-start timeouts

	mu      sync.Mutex
	refused int
	lastLog time.Time
}

func newLimiter(l Limits, reg prometheus.Registerer) *limiter {
	lim := &limiter{clients: connlimit.NewCounter(l.PerClient, l.Total), sandboxes: connlimit.NewCounter(l.PerSandbox, 0),
		refusals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "cubicle_proxy_requests_refused_total", Help: "Sandbox requests refused past a cap (client: 429; sandbox, total: 503).",
		}, []string{"cap"}),
		timeouts: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "cubicle_proxy_response_start_timeouts_total", Help: "Requests to a sandbox's own port answered 504: no response started in time.",
		}),
	}
	if reg != nil {
		reg.MustRegister(lim.refusals, lim.timeouts, prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "cubicle_proxy_requests_in_flight", Help: "Requests being proxied to sandboxes.",
		}, func() float64 { return float64(lim.clients.Len()) }))
	}
	return lim
}

// acquire counts a request from client to port of sandbox sb, or answers
// the refusal itself and returns nil.
func (p *Proxy) acquire(w http.ResponseWriter, r *http.Request, sb string, port int) (release func()) {
	client := connlimit.ClientKey(r.RemoteAddr)
	sbKey, what := sb, "sandbox "+sb+"'s own ports"
	if exemptPort(port) {
		sbKey, what = sb+"/agent", "sandbox "+sb+"'s envd and code interpreter"
	}
	l := p.lim
	var status int
	var msg, which string
	switch l.clients.Acquire(client) {
	case connlimit.KeyFull:
		status, which, msg = http.StatusTooManyRequests, "client", "too many requests in flight from "+client+" (at most "+strconv.Itoa(p.cfg.Limits.PerClient)+" per client address)"
	case connlimit.TotalFull:
		status, which, msg = http.StatusServiceUnavailable, "total", "the sandbox proxy is at its connection limit ("+strconv.Itoa(p.cfg.Limits.Total)+" requests in flight)"
	default:
		if l.sandboxes.Acquire(sbKey) == connlimit.Granted {
			return func() { l.sandboxes.Release(sbKey); l.clients.Release(client) }
		}
		l.clients.Release(client)
		status, which, msg = http.StatusServiceUnavailable, "sandbox", "too many requests in flight to "+what+" (at most "+strconv.Itoa(p.cfg.Limits.PerSandbox)+")"
	}
	l.refusals.WithLabelValues(which).Inc()
	p.logRefusal(msg)
	// The client holding too much should let go of this connection too.
	w.Header().Set("Connection", "close")
	w.Header().Set("Retry-After", "1")
	writeSandboxError(w, sandboxError{Code: status, SandboxID: sb, Message: msg})
	return nil
}

// logRefusal logs refusals at most every 10 s, with how many there were,
// so that a flood does not become a flood of log lines.
func (p *Proxy) logRefusal(msg string) {
	l := p.lim
	l.mu.Lock()
	l.refused++
	n := l.refused
	if time.Since(l.lastLog) < 10*time.Second {
		l.mu.Unlock()
		return
	}
	l.lastLog, l.refused = time.Now(), 0
	l.mu.Unlock()
	p.log.Warn("proxy refused requests past its limits", "refused", n, "last", msg)
}

// portTransport sends envd's and the code interpreter's traffic through
// agent, which has no response-start timeout, and the user's ports through
// user, which has one.
type portTransport struct{ agent, user http.RoundTripper }

func (t portTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if exemptPort(int(r.Context().Value(targetKey{}).(target).addr.Port())) {
		return t.agent.RoundTrip(r)
	}
	return t.user.RoundTrip(r)
}

func exemptPort(port int) bool { return port == node.AgentPort || port == codeInterpreterPort }

// responseStartTimeout reports whether err is the transport's timeout for a
// response that did not start, as opposed to a dial that failed or a
// connection that broke (a *net.OpError, ETIMEDOUT from keep-alives among
// them).
func responseStartTimeout(err error) bool {
	var op *net.OpError
	if errors.As(err, &op) {
		return false
	}
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
