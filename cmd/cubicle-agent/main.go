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
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cubicle-dev/cubicle/internal/agent"
)

func main() {
	port := flag.Int("port", agent.Port, "port to listen on (all interfaces)")
	listen := flag.String("listen", "", "listen address host:port (overrides -port)")
	version := flag.Bool("version", false, "print version and exit")
	flag.Parse()
	if *version {
		fmt.Printf("cubicle-agent %s (envd %s)\n", agent.Version, agent.EnvdVersion)
		return
	}
	if err := run(*listen, *port); err != nil {
		fmt.Fprintln(os.Stderr, "cubicle-agent:", err)
		os.Exit(1)
	}
}

func run(listen string, port int) error {
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
	a.Shutdown()
	_ = srv.Shutdown(ctx)
	return nil
}
