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
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cubicle-dev/cubicle/internal/agent"
	"github.com/cubicle-dev/cubicle/internal/agent/interp"
	"github.com/cubicle-dev/cubicle/internal/agentapi"
)

func main() {
	port := flag.Int("port", agent.Port, "port to listen on (all interfaces)")
	listen := flag.String("listen", "", "listen address host:port (overrides -port)")
	interpPort := flag.Int("interp-port", interp.Port, "code interpreter port (0: off); served only where a Jupyter kernel can run")
	tokenFile := flag.String("token-file", "", "file holding the access token the agent starts with (required: the agent never serves without one)")
	readyFD := flag.Int("ready-fd", -1, "a pipe inherited from the node: one byte is written there once the agent serves, then it is closed (-1: none)")
	version := flag.Bool("version", false, "print version and exit")
	probe := flag.String(strings.TrimPrefix(agentapi.ProbeHTTPFlag, "-"), "", "probe this URL and exit: 0 for a 200-399 answer within 5s, 1 otherwise (a template's HTTP readiness probe)")
	flag.Parse()
	if *probe != "" {
		os.Exit(probeHTTP(*probe))
	}
	// Before anything is opened or started: the inherited pipe must reach
	// no process the agent starts.
	ready := readyPipe(*readyFD)
	if *version {
		fmt.Printf("cubicle-agent %s (envd %s)\n", agent.Version, agentapi.EnvdVersion)
		return
	}
	token, err := readToken(*tokenFile)
	if err != nil {
		fmt.Fprintln(os.Stderr, "cubicle-agent:", err)
		os.Exit(1)
	}
	if err := run(*listen, *port, *interpPort, token, ready); err != nil {
		fmt.Fprintln(os.Stderr, "cubicle-agent:", err)
		os.Exit(1)
	}
}

// probeHTTP is a Kubernetes-style httpGet probe: redirects are not
// followed (a 3xx is itself success).
func probeHTTP(url string) int {
	c := &http.Client{Timeout: 5 * time.Second, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := c.Get(url)
	if err != nil {
		fmt.Fprintln(os.Stderr, "probe:", err)
		return 1
	}
	resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 399 {
		fmt.Fprintf(os.Stderr, "probe: %s answered %s\n", url, resp.Status)
		return 1
	}
	return 0
}

// readToken reads the token the node bound in before the sandbox started,
// so the agent never serves a request without one.
func readToken(path string) (string, error) {
	if path == "" {
		return "", errors.New("-token-file is required")
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("access token: %w", err)
	}
	tok := strings.TrimSpace(string(b))
	if tok == "" {
		return "", fmt.Errorf("access token: %s is empty", path)
	}
	return tok, nil
}

// readyPipe takes over fd: close-on-exec at once, and only when it is a
// pipe (anything else was not passed by the node: it is left alone).
func readyPipe(fd int) *os.File {
	if fd < 0 {
		return nil
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFIFO {
		return nil
	}
	unix.CloseOnExec(fd)
	return os.NewFile(uintptr(fd), "ready")
}

func run(listen string, port, interpPort int, token string, ready *os.File) error {
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
	// Before anything can fill the sandbox's pids limit: a thread the Go
	// runtime cannot create later would kill the agent. It runs while the
	// agent listens; only /health answers before it is done.
	reserved := make(chan struct{})
	var threads int
	go func() {
		threads = agent.ReserveThreads()
		close(reserved)
	}()
	a := agent.New(agent.Config{ReapAll: reapAll, Logger: log, AccessToken: token})
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	srv := a.Server(addr)
	srv.Handler = agent.UntilReserved(reserved, srv.Handler)

	sigc := make(chan os.Signal, 1)
	signal.Notify(sigc, syscall.SIGTERM, syscall.SIGINT)
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	if ready != nil {
		// Listening: connections queue until Serve takes them, as /health
		// would have shown. A node that stopped reading is no concern.
		_, _ = ready.Write([]byte{1})
		ready.Close()
	}
	<-reserved
	log.Info("cubicle-agent listening", "addr", ln.Addr().String(), "version", agent.Version, "envd", agentapi.EnvdVersion, "pid", os.Getpid(), "threads", threads)
	stopCI := startCodeInterpreter(log, a, interpPort)
	defer stopCI()
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
	stopCI()
	a.Shutdown()
	_ = srv.Shutdown(ctx)
	return nil
}

// startCodeInterpreter listens on port at once, right after envd's
// listener: Sandbox.create returns as soon as envd answers, and the SDKs'
// first runCode follows. Requests wait while the Service discovers the
// kernels (from the filesystem; python is run only where that cannot
// tell); without a python kernel it answers them 404 and frees the port.
// The returned stop closes it and its kernels; it is idempotent.
func startCodeInterpreter(log *slog.Logger, a *agent.Agent, port int) (stop func()) {
	if port <= 0 {
		return func() {}
	}
	addr := net.JoinHostPort("", strconv.Itoa(port))
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		log.Error("code interpreter: listen", "addr", addr, "err", err)
		return func() {}
	}
	cfg := interp.Config{Logger: log}
	// e2b's kernels run as root; an agent that is not root (development)
	// runs them as itself.
	if os.Geteuid() == 0 {
		cfg.User = "root"
	}
	log.Info("code interpreter listening", "addr", ln.Addr().String())
	return interp.Start(a, cfg, ln).Close
}
