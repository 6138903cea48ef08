package main

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"time"

	"github.com/cubicle-dev/cubicle/internal/lxcfs"
	"github.com/cubicle-dev/cubicle/internal/runtime"
)

// startLxcfs starts (or adopts) the server's own lxcfs at
// <data-dir>/lxcfs/mnt for runc sandboxes; nil when none is wanted. A
// missing or failing lxcfs stops serve: sandboxes would silently see the
// host's memory and CPUs.
func startLxcfs(ctx context.Context, o *nodeHostOptions, log *slog.Logger) (*lxcfs.Daemon, error) {
	if o.runtime == "runsc" {
		log.Info("lxcfs not used: gVisor's /proc shows each sandbox's own memory and CPUs")
		return nil, nil
	}
	if !o.lxcfs {
		log.Warn("--lxcfs=false: sandboxes see the host's /proc/meminfo, cpuinfo, stat and uptime, so free, top, nproc-like tools and runtimes that size themselves from them see the host, not the sandbox's limits")
		return nil, nil
	}
	lx, err := lxcfs.Start(ctx, lxcfs.Config{
		Binary: o.lxcfsBin, Dir: filepath.Join(o.dataDir, "lxcfs"), Logger: log,
		CPUs: o.lxcfsCPUs, Cgroup: strings.Trim(o.cgroupParent, "/") + "-lxcfs",
	})
	if err != nil {
		return nil, fmt.Errorf("%w (sandboxes' /proc/meminfo would show the host's memory; --lxcfs=false runs without it)", err)
	}
	return lx, nil
}

// stopLxcfs stops lxcfs when serve stops with no sandbox left, and leaves
// it running for the next serve otherwise (the sandboxes' /proc files are
// views of its mount).
func stopLxcfs(lx *lxcfs.Daemon, drv runtime.Driver, log *slog.Logger) {
	if lx == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if infos, err := drv.List(ctx); err != nil || len(infos) > 0 {
		lx.Release()
		return
	}
	if err := lx.Close(); err != nil {
		log.Warn("lxcfs stop", "err", err)
	}
}
