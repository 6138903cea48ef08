package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/pflag"

	"github.com/cubicle-dev/cubicle/internal/accel"
)

// accelOptions configure accelerator discovery and backends. The roots are
// flags so a fake device tree (tests, dry runs) can stand in for the host's.
type accelOptions struct {
	backend                    string
	sysfs, dev, proc, smi      string
	libDirs, binDirs           []string
	vfioRebind                 bool
	releaseTimeout, reconcileT time.Duration
}

func (o *accelOptions) flags(f *pflag.FlagSet) {
	f.StringVar(&o.backend, "accel-backend", "passthrough", "accelerator backend for discovered devices: passthrough (OCI runtimes), vfio (microVM runtimes) or none")
	f.StringVar(&o.sysfs, "accel-sysfs", "/sys", "sysfs root accelerators are discovered under")
	f.StringVar(&o.dev, "accel-dev", "/dev", "device-node root for accelerator passthrough")
	f.StringVar(&o.proc, "accel-proc", "/proc", "procfs root with driver/nvidia/gpus (holder scans always use /proc)")
	f.StringVar(&o.smi, "nvidia-smi", "", "nvidia-smi binary (default: looked up in PATH; absent is fine)")
	f.StringSliceVar(&o.libDirs, "accel-lib-dir", nil, "directories holding driver libraries to pass through (default /usr/lib/x86_64-linux-gnu,/usr/lib64,/usr/lib)")
	f.StringSliceVar(&o.binDirs, "accel-bin-dir", nil, "directories holding driver tools (nvidia-smi) to pass through (default /usr/bin,/usr/local/bin)")
	f.BoolVar(&o.vfioRebind, "accel-vfio-rebind", false, "allow the vfio backend to rebind devices to vfio-pci")
	f.DurationVar(&o.releaseTimeout, "accel-release-timeout", 30*time.Second, "how long a released device may stay held by a process before it is quarantined")
	f.DurationVar(&o.reconcileT, "accel-reconcile-interval", 10*time.Second, "how often accelerator state is reconciled with the host")
}

// errVFIONeedsVM: the vfio backend binds a device to vfio-pci for a microVM
// to take; no runtime here is a VM (runc and runsc are OCI runtimes), so the
// device would never reach the sandbox.
var errVFIONeedsVM = errors.New("--accel-backend vfio needs a microVM runtime")

// checkAccelBackend refuses backend/runtime pairs that cannot deliver a
// device, before serve touches the host.
func checkAccelBackend(backend, runtime string) error {
	if accel.BackendType(backend) == accel.BackendVFIO {
		return fmt.Errorf("%w, and --runtime %s is an OCI runtime where a vfio-bound device never reaches the sandbox; use --accel-backend passthrough (or none)", errVFIONeedsVM, runtime)
	}
	return nil
}

// newAccelManager builds the node's accelerator manager (nil for "none").
func newAccelManager(o accelOptions, nodeID, dataDir string, log *slog.Logger, reg prometheus.Registerer) (*accel.Manager, error) {
	if o.backend == "none" {
		return nil, nil
	}
	bt := accel.BackendType(o.backend)
	if bt != accel.BackendPassthrough && bt != accel.BackendVFIO {
		return nil, fmt.Errorf("--accel-backend %q: want passthrough, vfio or none", o.backend)
	}
	dc := accel.DiscoverConfig{SysfsRoot: o.sysfs, ProcRoot: o.proc, DevRoot: o.dev, NvidiaSMI: o.smi}
	backends := map[accel.BackendType]accel.Backend{
		accel.BackendPassthrough: accel.NewPassthrough(accel.PassthroughConfig{SysfsRoot: o.sysfs, DevRoot: o.dev, ProcRoot: "/proc", LibDirs: o.libDirs, BinDirs: o.binDirs}),
		accel.BackendVFIO:        accel.NewVFIO(accel.VFIOConfig{SysfsRoot: o.sysfs, DevRoot: o.dev, ProcRoot: "/proc", AllowRebind: o.vfioRebind}),
	}
	return accel.NewManager(accel.ManagerConfig{
		NodeID: nodeID, StateDir: filepath.Join(dataDir, "node", "accel"),
		Discover:       func(ctx context.Context) ([]accel.Device, error) { return accel.Discover(ctx, dc) },
		Backends:       backends,
		DefaultBackend: bt,
		ReleaseTimeout: o.releaseTimeout,
		Logger:         log,
		Registerer:     reg,
	})
}
