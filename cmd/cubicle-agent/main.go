// Command cubicle-agent is the envd-compatible agent that runs as PID 1 inside
// every Cubicle sandbox.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cubicle-dev/cubicle/internal/agent"
	"github.com/cubicle-dev/cubicle/internal/agent/interp"
)

func main() {
	port := flag.Int("port", agent.Port, "port to listen on (all interfaces)")
	listen := flag.String("listen", "", "listen address host:port (overrides -port)")
	interpPort := flag.Int("interp-port", interp.Port, "code interpreter port (0: off); served only where a Jupyter kernel can run")
	version := flag.Bool("version", false, "print version and exit")
	flag.Parse()
	if *version {
		fmt.Printf("cubicle-agent %s (envd %s)\n", agent.Version, agent.EnvdVersion)
		return
	}
	if err := run(*listen, *port, *interpPort); err != nil {
		fmt.Fprintln(os.Stderr, "cubicle-agent:", err)
		os.Exit(1)
	}
}

func run(listen string, port, interpPort int) error {
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	addr := listen
	if addr == "" {
		addr = net.JoinHostPort("", strconv.Itoa(port))
	}
	// As PID 1 orphans are reparented to us; elsewhere become a subreaper so
	// they still are. Either way the agent reaps everything with wait4(-1).
	reapAll := os.Getpid() == 1
	if !reapAll {
		if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err == nil {
			reapAll = true
		}
	}
	a := agent.New(agent.Config{ReapAll: reapAll, Logger: log})
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	srv := a.Server(addr)
	log.Info("cubicle-agent listening", "addr", ln.Addr().String(), "version", agent.Version, "envd", agent.EnvdVersion, "pid", os.Getpid())

	sigc := make(chan os.Signal, 1)
	signal.Notify(sigc, syscall.SIGTERM, syscall.SIGINT)
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	ci := startCodeInterpreter(log, a, interpPort)
	defer ci.stop()
	select {
	case err := <-errc:
		if !errors.Is(err, http.ErrServerClosed) {
			return err
		}
		return nil
	case sig := <-sigc:
		log.Info("shutting down", "signal", sig.String())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// Processes first: their streams end, so Shutdown need not wait them out.
	ci.stop()
	a.Shutdown()
	_ = srv.Shutdown(ctx)
	return nil
}

// codeInterpreter is the e2b code interpreter server, once it is serving.
type codeInterpreter struct {
	mu      sync.Mutex
	srv     *http.Server
	ci      *interp.Server
	stopped bool
}

// startCodeInterpreter serves the code interpreter on port when the image can
// run a Jupyter kernel (python3 with ipykernel, or a kernelspec). Discovery
// runs python, so it happens in the background: envd's listener is already
// up and is never delayed by it. Without a kernel the port stays closed and
// the proxy reports the refused connection.
func startCodeInterpreter(log *slog.Logger, a *agent.Agent, port int) *codeInterpreter {
	c := &codeInterpreter{}
	if port <= 0 {
		return c
	}
	cfg := interp.Config{Logger: log}
	// e2b's kernels run as root; an agent that is not root (development)
	// runs them as itself.
	if os.Geteuid() == 0 {
		cfg.User = "root"
	}
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		cat, err := interp.Discover(ctx, a, cfg)
		if err != nil {
			log.Info("code interpreter off", "reason", err)
			return
		}
		addr := net.JoinHostPort("", strconv.Itoa(port))
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			log.Error("code interpreter: listen", "addr", addr, "err", err)
			return
		}
		ci := interp.New(a, cat, cfg)
		srv := &http.Server{Handler: ci.Handler(), ReadHeaderTimeout: 30 * time.Second, IdleTimeout: 10 * time.Minute}
		c.mu.Lock()
		if c.stopped { // shutting down while discovery ran
			c.mu.Unlock()
			ln.Close()
			return
		}
		c.srv, c.ci = srv, ci
		c.mu.Unlock()
		log.Info("code interpreter listening", "addr", ln.Addr().String(), "languages", cat.Languages())
		go func() {
			if err := ci.Warm(context.Background()); err != nil {
				log.Warn("code interpreter: default python context", "err", err)
			}
		}()
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("code interpreter: serve", "err", err)
		}
	}()
	return c
}

// stop closes the listener and kills the kernels; it is idempotent.
func (c *codeInterpreter) stop() {
	c.mu.Lock()
	srv, ci := c.srv, c.ci
	c.srv, c.ci, c.stopped = nil, nil, true
	c.mu.Unlock()
	if srv != nil {
		_ = srv.Close()
		ci.Close()
	}
}
