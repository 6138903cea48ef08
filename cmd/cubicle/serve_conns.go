package main

import (
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/pflag"
	"golang.org/x/sys/unix"

	"github.com/cubicle-dev/cubicle/internal/connlimit"
	"github.com/cubicle-dev/cubicle/internal/proxy"
)

// connOptions bound the connections serve holds, so that the API, the store
// and the create path keep descriptors whatever clients and sandboxes do.
type connOptions struct {
	maxConns, maxConnsPerClient            int
	proxyMaxConns, proxyPerSandbox         int
	proxyPerClient                         int
	responseStart, readHeaderTimeout, idle time.Duration
}

func (c *connOptions) flags(f *pflag.FlagSet) {
	f.IntVar(&c.maxConns, "max-conns", 0, "client connections open at once, API and proxy together; past it new ones are closed at accept (0: half the descriptor limit)")
	f.IntVar(&c.maxConnsPerClient, "max-conns-per-client", 2048, "client connections open at once from one address (an IPv6 /64); past it new ones are closed at accept (0: no per-address cap, for a server behind a reverse proxy)")
	f.IntVar(&c.proxyMaxConns, "proxy-max-conns", 0, "requests in flight to sandboxes, each holding an upstream connection; past it 503 (0: a quarter of the descriptor limit)")
	f.IntVar(&c.proxyPerSandbox, "proxy-max-conns-per-sandbox", 1024, "requests in flight to one sandbox; past it 503 (0: no per-sandbox cap)")
	f.IntVar(&c.proxyPerClient, "proxy-max-conns-per-client", 1024, "requests in flight to sandboxes from one client address (an IPv6 /64); past it 429 (0: no per-address cap)")
	f.DurationVar(&c.responseStart, "proxy-response-start-timeout", 2*time.Minute, "how long a sandbox's own port may take to start its response once the request is sent; past it 504 (envd's and the code interpreter's streams are exempt; 0: no limit)")
	f.DurationVar(&c.readHeaderTimeout, "read-header-timeout", 15*time.Second, "how long a client may take to send a request's headers")
	f.DurationVar(&c.idle, "idle-timeout", 60*time.Second, "how long a client's keep-alive connection may sit idle between requests")
}

// connBudget is what the descriptor limit leaves to connections.
type connBudget struct {
	nofile                  uint64 // RLIMIT_NOFILE, soft, after raising
	maxConns, proxyMaxConns int
	idleConns               int // the proxy's upstream keep-alive pool
}

// budget raises RLIMIT_NOFILE's soft limit to the hard one and shares it:
// client connections, upstream connections and the upstream keep-alive
// pool together get at most 90% (81% by default), the rest stays for the
// API's own files, the store and the create path (runc, netns, logs).
func (c *connOptions) budget() (connBudget, error) {
	nofile, err := raiseNoFile()
	if err != nil {
		return connBudget{}, err
	}
	b := connBudget{nofile: nofile, maxConns: c.maxConns, proxyMaxConns: c.proxyMaxConns,
		idleConns: int(min(1024, nofile/16))}
	for _, v := range []struct {
		name string
		n    int
	}{{"--max-conns", c.maxConns}, {"--max-conns-per-client", c.maxConnsPerClient}, {"--proxy-max-conns", c.proxyMaxConns},
		{"--proxy-max-conns-per-sandbox", c.proxyPerSandbox}, {"--proxy-max-conns-per-client", c.proxyPerClient}} {
		if v.n < 0 {
			return connBudget{}, fmt.Errorf("%s must not be negative", v.name)
		}
	}
	for _, v := range []struct {
		name string
		d    time.Duration
	}{{"--proxy-response-start-timeout", c.responseStart}, {"--read-header-timeout", c.readHeaderTimeout}, {"--idle-timeout", c.idle}} {
		if v.d < 0 {
			return connBudget{}, fmt.Errorf("%s must not be negative", v.name)
		}
	}
	if c.readHeaderTimeout == 0 || c.idle == 0 {
		// Either one unbounded lets a client hold a descriptor forever
		// without sending anything.
		return connBudget{}, fmt.Errorf("--read-header-timeout and --idle-timeout must be positive")
	}
	if b.maxConns == 0 {
		b.maxConns = int(nofile / 2)
	}
	if b.proxyMaxConns == 0 {
		b.proxyMaxConns = int(nofile / 4)
	}
	if used := uint64(b.maxConns + b.proxyMaxConns + b.idleConns); used > nofile*9/10 {
		return connBudget{}, fmt.Errorf("--max-conns %d + --proxy-max-conns %d + %d pooled upstream connections = %d descriptors, more than 90%% of the descriptor limit %d (RLIMIT_NOFILE): lower them, or raise the limit (LimitNOFILE= in the unit)",
			b.maxConns, b.proxyMaxConns, b.idleConns, used, nofile)
	}
	return b, nil
}

// raiseNoFile raises the soft descriptor limit to the hard one where it is
// lower and returns the soft limit in force. Go's runtime raises it at start
// on Linux already (and restores the original for the processes serve
// starts); this keeps the budget from resting on that.
func raiseNoFile() (uint64, error) {
	var lim unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &lim); err != nil {
		return 0, fmt.Errorf("RLIMIT_NOFILE: %w", err)
	}
	if lim.Cur < lim.Max {
		want := lim
		want.Cur = lim.Max
		if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &want); err == nil {
			lim = want
		}
	}
	return lim.Cur, nil
}

// proxyLimits are the sandbox proxy's caps from the options and budget.
func (c *connOptions) proxyLimits(b connBudget) proxy.Limits {
	return proxy.Limits{PerSandbox: c.proxyPerSandbox, PerClient: c.proxyPerClient, Total: b.proxyMaxConns,
		ResponseStart: c.responseStart, IdleConns: b.idleConns}
}

// listeners wraps serve's listeners so that they share one count of client
// connections, reported in reg.
func (c *connOptions) listeners(b connBudget, reg prometheus.Registerer, lns ...*net.Listener) {
	conns := connlimit.NewCounter(c.maxConnsPerClient, b.maxConns)
	reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "cubicle_client_connections_open", Help: "Client connections open, API and proxy together."},
			func() float64 { return float64(conns.Len()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "cubicle_client_connections_refused_total", Help: "Client connections closed at accept, past --max-conns or --max-conns-per-client."},
			func() float64 { return float64(conns.Refused()) }))
	for _, ln := range lns {
		if *ln != nil {
			*ln = connlimit.NewListener(*ln, conns)
		}
	}
}

// server applies the client-side timeouts.
func (c *connOptions) server(h http.Handler) *http.Server {
	return &http.Server{Handler: h, ReadHeaderTimeout: c.readHeaderTimeout, IdleTimeout: c.idle}
}
