package interp

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/cubicle-dev/cubicle/internal/agent/cors"
)

// NoKernelMessage is the 404 a Service answers in a sandbox where no python
// kernel can run.
const NoKernelMessage = "no code interpreter in this sandbox: its image has no python3 with ipykernel (create the sandbox from code-interpreter-v1 or a template built from it)"

// Service is the code interpreter as the agent runs it. It serves its
// listener from the agent's start, while the kernels are discovered and
// the python default context's kernel starts: the SDKs send their first
// runCode as soon as Sandbox.create returns, and that request is held, not
// refused.
//
//   - Until discovery ends a request waits for it (at most
//     Config.DiscoveryWait, then 503); GET /health answers 503 at once.
//   - When discovery found python, requests go to the Server, whose
//     default python context is started at once (Warm), and GET /health
//     is 200 only once that kernel is ready.
//   - When it found none, the listener is closed first, freeing the port
//     for the sandbox's own programs, and then the waiting requests get
//     404 NoKernelMessage.
type Service struct {
	cfg    Config
	ln     net.Listener
	http   *http.Server
	cancel context.CancelFunc

	// found is closed once discovery ended; server and off are set before.
	found   chan struct{}
	server  *Server      // nil when there is no interpreter
	handler http.Handler // server's
	off     string       // why there is none: the message of offCode
	offCode int

	mu     sync.Mutex // guards closed, and server against Close
	closed bool
}

// Start serves the code interpreter on ln and discovers the kernels (see
// Discover) in the background. ln belongs to the Service from then on.
func Start(host Host, cfg Config, ln net.Listener) *Service {
	cfg = cfg.withDefaults()
	ctx, cancel := context.WithCancel(context.Background())
	v := &Service{cfg: cfg, ln: ln, cancel: cancel, found: make(chan struct{})}
	v.http = &http.Server{Handler: cors.Handler(http.HandlerFunc(v.serve), ""), ReadHeaderTimeout: 30 * time.Second, IdleTimeout: 10 * time.Minute}
	go func() {
		if err := v.http.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) && !errors.Is(err, net.ErrClosed) {
			cfg.Logger.Error("code interpreter: serve", "err", err)
		}
	}()
	go v.discover(ctx, host)
	return v
}

func (v *Service) discover(ctx context.Context, host Host) {
	log := v.cfg.Logger
	start := time.Now()
	dctx, cancel := context.WithTimeout(ctx, time.Minute)
	cat, err := Discover(dctx, host, v.cfg)
	cancel()
	took := time.Since(start).Round(100 * time.Microsecond)

	v.mu.Lock()
	switch {
	case v.closed:
		v.off, v.offCode = "the code interpreter is shutting down", http.StatusServiceUnavailable
	case err != nil:
		v.off, v.offCode = NoKernelMessage, http.StatusNotFound
		if !errors.Is(err, ErrNoKernels) {
			v.off = "no code interpreter in this sandbox: " + strings.TrimPrefix(err.Error(), "interp: ")
		}
		log.Info("code interpreter off", "reason", err, "took", took)
		// Closed before anyone is answered: a client told "no code
		// interpreter" finds the port free.
		_ = v.ln.Close()
	default:
		v.server = New(host, cat, v.cfg)
		v.handler = v.server.Handler()
		log.Info("code interpreter: kernels discovered", "languages", cat.Languages(), "took", took)
	}
	close(v.found)
	server := v.server
	v.mu.Unlock()

	if server == nil {
		// Lets the waiting requests finish, then drops idle connections.
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := v.http.Shutdown(sctx); err != nil {
			_ = v.http.Close()
		}
		return
	}
	if err := server.Warm(ctx); err != nil {
		if ctx.Err() == nil {
			log.Warn("code interpreter: default python context", "err", err)
		}
		return
	}
	log.Info("code interpreter: default python kernel ready", "took", time.Since(start).Round(time.Millisecond))
}

func (v *Service) serve(w http.ResponseWriter, r *http.Request) {
	health := r.Method == http.MethodGet && r.URL.Path == "/health"
	if !health {
		t := time.NewTimer(v.cfg.DiscoveryWait)
		defer t.Stop()
		select {
		case <-v.found:
		case <-t.C:
		case <-r.Context().Done():
			return
		}
	}
	select {
	case <-v.found:
	default:
		if health {
			writeJSONError(w, http.StatusServiceUnavailable, "the default kernel is starting")
		} else {
			writeJSONError(w, http.StatusServiceUnavailable, fmt.Sprintf("the code interpreter is still starting: kernel discovery has not finished after %s", v.cfg.DiscoveryWait))
		}
		return
	}
	if v.handler == nil {
		w.Header().Set("Connection", "close")
		writeJSONError(w, v.offCode, v.off)
		return
	}
	v.handler.ServeHTTP(w, r)
}

// Close closes the listener and its connections and stops the kernels; it
// is idempotent.
func (v *Service) Close() {
	v.mu.Lock()
	if v.closed {
		v.mu.Unlock()
		return
	}
	v.closed = true
	server := v.server
	v.mu.Unlock()
	v.cancel()
	_ = v.http.Close()
	if server != nil {
		server.Close()
	}
}
