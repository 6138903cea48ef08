package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/pflag"

	"github.com/cubicle-dev/cubicle/internal/cacerts"
	"github.com/cubicle-dev/cubicle/internal/control"
	"github.com/cubicle-dev/cubicle/internal/diskstore"
	"github.com/cubicle-dev/cubicle/internal/egress"
	"github.com/cubicle-dev/cubicle/internal/loop"
	"github.com/cubicle-dev/cubicle/internal/network"
	"github.com/cubicle-dev/cubicle/internal/node"
	"github.com/cubicle-dev/cubicle/internal/runtime/oci"
	"github.com/cubicle-dev/cubicle/internal/servecert"
	"github.com/cubicle-dev/cubicle/internal/template"
	"github.com/cubicle-dev/cubicle/internal/volume"
	"github.com/cubicle-dev/cubicle/internal/volume/registry"
)

// nodeHostOptions are the flags of the machine sandboxes run on, the same
// for `cubicle serve` (its in-process node) and `cubicle node run`.
type nodeHostOptions struct {
	// dataDir is registered by each command (their defaults differ).
	dataDir                                        string
	imagesDir, runtime, agentBin, userns           string
	pool, bridge, netnsDir, nftTable, cgroupParent string
	hostFirewall                                   string
	dns                                            []string
	egressProxyAllow                               []string
	nodeConfig, volumeBaseDir                      string
	lxcfsBin                                       string
	lxcfs                                          bool
	lxcfsCPUs                                      float64
	sandboxMaxFlows, sandboxNewFlows               int
	maxBoots                                       int
	diskStore                                      string
	diskMode                                       diskstore.Mode
	accel                                          accelOptions
	caCertsFile                                    string
	caCerts                                        *cacerts.Set
}

// flags registers the node flags; serve and node run both call it.
func (o *nodeHostOptions) flags(f *pflag.FlagSet) {
	f.StringVar(&o.imagesDir, "images-dir", "", "image directory holding <name>/rootfs (default <data-dir>/images)")
	f.StringVar(&o.runtime, "runtime", "runc", "OCI runtime: runc or runsc (gVisor)")
	f.StringVar(&o.userns, "userns", "auto", "user namespace per sandbox, from its own unprivileged 65536-uid host range (runc/crun: root inside; runsc: gVisor's sentry and gofer): on, off, or auto (= on)")
	f.StringVar(&o.agentBin, "agent-bin", "", "path of the static cubicle-agent binary (default: next to this binary)")
	f.StringSliceVar(&o.dns, "dns", nil, "DNS servers for sandboxes (IPv4, comma-separated; default: the host's non-loopback resolvers); the egress proxy resolves allowed domains through them too")
	f.StringVar(&o.pool, "pool", "10.211.0.0/16", "sandbox address pool")
	f.StringVar(&o.bridge, "bridge", "cubicle0", "bridge interface name")
	f.StringVar(&o.netnsDir, "netns-dir", "", "where sandbox netns are bind-mounted (default /run/cubicle/<bridge>/netns)")
	f.StringSliceVar(&o.egressProxyAllow, "egress-proxy-allow", nil, "CIDRs in private or internal ranges where a sandbox's SOCKS5 network.egressProxy may be (default: only public addresses; loopback, link-local, the host's own addresses and the sandbox pool never)")
	f.StringVar(&o.hostFirewall, "host-firewall", "auto", "auto: when the host's iptables FORWARD chain drops (Docker, ufw, firewalld), add accept rules for the bridge (in DOCKER-USER if it exists) and remove them on exit; off: never touch iptables")
	f.StringVar(&o.nftTable, "nft-table", "", "nftables table (inet family) owned by this server (default cubicle, or cubicle_<bridge>)")
	f.StringVar(&o.cgroupParent, "cgroup-parent", "cubicle", "cgroup parent of sandbox cgroups")
	f.IntVar(&o.sandboxMaxFlows, "sandbox-max-flows", 2048, "connections (conntrack entries, TCP TIME_WAIT excluded) one sandbox may hold at once; new flows past it are dropped (0: no cap)")
	f.IntVar(&o.sandboxNewFlows, "sandbox-new-flows", 100, "new connections one sandbox may start per second, in bursts of twice that; past it they are dropped (0: no cap). The host's conntrack table is shared by all")
	f.StringVar(&o.nodeConfig, "node-config", "", "node TOML with the volume_plugins list and volume_plugin_base_dir (default: the built-in local plugin)")
	f.BoolVar(&o.lxcfs, "lxcfs", true, "give runc sandboxes lxcfs's /proc/meminfo, cpuinfo, stat, uptime... so free and friends show their limits; false: they see the host's (logged)")
	f.StringVar(&o.lxcfsBin, "lxcfs-bin", "lxcfs", "lxcfs binary (Debian package lxcfs; scripts/install installs it)")
	f.Float64Var(&o.lxcfsCPUs, "lxcfs-cpus", 1, "CPU quota of lxcfs, which serves every runc sandbox's /proc reads outside their own CPU limits, in its own cgroup <cgroup-parent>-lxcfs (0: unbounded)")
	f.StringVar(&o.volumeBaseDir, "volume-base-dir", "", "volume_plugin_base_dir override (default: the node config's, else <data-dir>/volume-mounts)")
	f.IntVar(&o.maxBoots, "max-concurrent-boots", 0, "sandboxes this node boots at once (runtime create and agent init; image pulls and volume attaches wait outside); later creates wait their turn in order (0: its CPUs, at least 2)")
	f.StringVar(&o.diskStore, "disk-store", "auto", "how sandbox disks are made: reflink (each a clone of one formatted blank per size, on the data dir's filesystem when it clones files, else on an XFS image made once at <data-dir>/disk-store.img and mounted on <data-dir>/disk-store), images (each formatted at create: any filesystem with loop devices), or auto (reflink where the host can, images otherwise; the choice is logged)")
	f.StringVar(&o.caCertsFile, "ca-certificates", "", "PEM file of extra CA certificates to trust in every sandbox and template build (a TLS-intercepting proxy's CA); default none")
	o.accel.flags(f)
}

// prepare fills the defaults that depend on other flags and checks what
// can be checked before anything touches the host. requireBase: the base
// image must be in the images dir (serve's embedded node boots from it;
// `node run` pulls built-ins it lacks from the control plane).
func (o *nodeHostOptions) prepare(requireBase bool) (userns bool, pool netip.Prefix, err error) {
	if err := checkAccelBackend(o.accel.backend, o.runtime); err != nil {
		return false, pool, err
	}
	if o.maxBoots < 0 {
		return false, pool, fmt.Errorf("--max-concurrent-boots must be 0 (the CPUs) or positive")
	}
	if o.diskMode, err = diskstore.ParseMode(o.diskStore); err != nil {
		return false, pool, fmt.Errorf("--disk-store: %w", err)
	}
	if o.imagesDir == "" {
		o.imagesDir = filepath.Join(o.dataDir, "images")
	}
	if o.agentBin == "" {
		exe, err := os.Executable()
		if err != nil {
			return false, pool, err
		}
		o.agentBin = filepath.Join(filepath.Dir(exe), "cubicle-agent")
	}
	if o.netnsDir == "" {
		o.netnsDir = filepath.Join("/run/cubicle", o.bridge, "netns")
	}
	if o.nftTable == "" {
		o.nftTable = "cubicle"
		if o.bridge != "cubicle0" {
			o.nftTable = "cubicle_" + o.bridge
		}
	}
	if userns, err = usernsMode(o.userns, o.runtime); err != nil {
		return false, pool, err
	}
	if pool, err = netip.ParsePrefix(o.pool); err != nil {
		return false, pool, fmt.Errorf("--pool: %w", err)
	}
	if _, err := os.Stat(filepath.Join(o.imagesDir, template.BaseTemplate, "rootfs")); requireBase && err != nil {
		return false, pool, fmt.Errorf("base image missing at %s (build it with scripts/build-rootfs): %w",
			filepath.Join(o.imagesDir, template.BaseTemplate, "rootfs"), err)
	}
	if o.caCertsFile != "" {
		if o.caCerts, err = cacerts.Load(o.caCertsFile); err != nil {
			return false, pool, fmt.Errorf("--ca-certificates: %w", err)
		}
	}
	return userns, pool, nil
}

// nodeHostConfig is what a node host needs beyond its flags.
type nodeHostConfig struct {
	ID      string
	Volumes volume.NodeConfig
	// Secrets resolves a secret for a sandbox's egress rule: serve reads
	// its store, a node agent asks the control plane.
	Secrets       egress.SecretFunc
	Registry      *prometheus.Registry
	VolumeMetrics *control.VolumeMetrics
	Logger        *slog.Logger
	// Images resolves image references (a node agent pulls from the
	// control plane's registry); nil: the embedded node, which is given
	// layer paths on its own host.
	Images node.ImageSource
}

// nodeHost is everything a node runs sandboxes with: the runtime, lxcfs,
// the network and its egress proxy, accelerators, the node's volume
// plugins, and the node.Local over them.
type nodeHost struct {
	node    *node.Local
	drv     *oci.Driver
	netm    *network.Linux
	plugins *registry.Registry
	userns  bool
	o       *nodeHostOptions
	log     *slog.Logger
	closers []func()
}

// startNodeHost builds the node host. o must have been prepared. On error
// what was built is undone.
func startNodeHost(ctx context.Context, o *nodeHostOptions, userns bool, pool netip.Prefix, cfg nodeHostConfig) (_ *nodeHost, err error) {
	log := cfg.Logger
	h := &nodeHost{o: o, log: log, userns: userns}
	defer func() {
		if err != nil {
			h.Close()
		}
	}()
	if h.plugins, err = registry.Open(cfg.Volumes.Plugins); err != nil {
		return nil, fmt.Errorf("node volume plugins: %w", err)
	}
	plugins := h.plugins
	h.closers = append(h.closers, func() { plugins.Close() })
	// Not listable, even when it existed before (make run's mkdir -p):
	// sandbox filesystems and volumes live below it, in root-only dirs;
	// traversable, so runc in a sandbox's user namespace reaches its rootfs
	// (docs/security.md).
	if err := os.Chmod(o.dataDir, 0o711); err != nil {
		return nil, fmt.Errorf("data dir: %w", err)
	}
	// Root only: template images are built from untrusted recipes, and a
	// set-ID binary in one must not be runnable by the host's other users.
	if err := os.Chmod(o.imagesDir, 0o700); err != nil {
		return nil, fmt.Errorf("images dir: %w", err)
	}
	sandboxDir := filepath.Join(o.dataDir, "sandboxes")
	disks, err := diskstore.Open(ctx, diskstore.Config{
		Dir: filepath.Join(o.dataDir, "disk-store"), Image: filepath.Join(o.dataDir, "disk-store.img"), Mode: o.diskMode,
	})
	if err != nil {
		return nil, fmt.Errorf("--disk-store %s: %w", o.diskMode, err)
	}
	defer func() {
		if err != nil {
			if rerr := disks.Release(); rerr != nil {
				log.Warn("disk store left mounted after a failed start", "err", rerr)
			}
		}
	}()
	if disks.Kind() == diskstore.Reflink {
		log.Info("sandbox disks: reflink clones of a formatted blank", "dir", disks.Dir())
	} else {
		log.Info("sandbox disks: formatted at each create", "reason", disks.Reason())
	}
	h.drv, err = oci.New(oci.Config{
		Disks:        disks,
		Runtime:      o.runtime,
		UserNS:       userns,
		StateDir:     filepath.Join(o.dataDir, "run", o.runtime),
		SandboxDir:   sandboxDir,
		CgroupParent: o.cgroupParent,
	})
	if err != nil {
		return nil, fmt.Errorf("runtime %s: %w", o.runtime, err)
	}
	lx, err := startLxcfs(ctx, o, log)
	if err != nil {
		return nil, err
	}
	drv := h.drv
	h.closers = append(h.closers, func() { stopLxcfs(lx, drv, log) })
	resolv := filepath.Join(o.dataDir, "resolv.conf")
	resolvers, err := sandboxResolvers(o.dns, resolv)
	if err != nil {
		return nil, err
	}
	egressLn, err := egress.ListenFreebind(netip.AddrPortFrom(network.GatewayOf(pool), 0))
	if err != nil {
		return nil, fmt.Errorf("egress proxy: %w", err)
	}
	h.closers = append(h.closers, func() { egressLn.Close() })
	egressPort := uint16(egressLn.Addr().(*net.TCPAddr).Port)
	// The same port over UDP answers the DNS of sandboxes with an
	// egressProxy, which is never forwarded.
	egressDNS, err := egress.ListenPacketFreebind(netip.AddrPortFrom(network.GatewayOf(pool), egressPort))
	if err != nil {
		return nil, fmt.Errorf("egress proxy DNS: %w", err)
	}
	h.closers = append(h.closers, func() { egressDNS.Close() })
	var upstreamAllow []netip.Prefix
	for _, c := range o.egressProxyAllow {
		p, err := network.ParsePrefix(c)
		if err != nil {
			return nil, fmt.Errorf("--egress-proxy-allow: %w", err)
		}
		upstreamAllow = append(upstreamAllow, p)
	}
	// The interception CA: sandboxes whose policy has rules trust it, so
	// the egress proxy can apply them to their HTTPS (docs/network.md,
	// trust model).
	egressCA, err := servecert.LoadOrCreateCA(filepath.Join(o.dataDir, "egress-ca"), "Cubicle egress CA "+hostname())
	if err != nil {
		return nil, fmt.Errorf("egress CA: %w", err)
	}
	egressTrust, err := cacerts.Parse(egressCA.PEM())
	if err != nil {
		return nil, fmt.Errorf("egress CA: %w", err)
	}
	upstreamRoots, err := trustRoots(o.caCerts)
	if err != nil {
		return nil, err
	}
	netm, err := network.NewLinux(network.Config{Bridge: o.bridge, Pool: pool, NetnsDir: o.netnsDir, Table: o.nftTable, Resolvers: resolvers,
		HostFirewall: o.hostFirewall, EgressPort: egressPort, UpstreamAllow: upstreamAllow,
		MaxFlows: o.sandboxMaxFlows, NewFlowRate: o.sandboxNewFlows})
	if err != nil {
		return nil, fmt.Errorf("network: %w", err)
	}
	h.netm = netm
	h.closers = append(h.closers, func() {
		if err := netm.Close(); err != nil {
			log.Error("removing the bridge's host firewall rules", "err", err)
		}
	})
	if ch := netm.HostFirewallChain(); ch != "" {
		log.Info("host firewall drops forwarded traffic: accept rules for the bridge added", "chain", ch, "bridge", o.bridge)
	}
	egressProxy := egress.New(egressLn, netm, log, cfg.Registry, egress.WithDNS(egressDNS), egress.WithInterception(egressCA, upstreamRoots, cfg.Secrets))
	go func() {
		if err := egressProxy.Serve(); err != nil {
			log.Error("egress proxy stopped", "err", err)
		}
	}()
	h.closers = append(h.closers, func() { egressProxy.Close() })
	am, err := newAccelManager(o.accel, cfg.ID, o.dataDir, log, cfg.Registry)
	if err != nil {
		return nil, err
	}
	h.node, err = node.NewLocal(node.LocalConfig{
		Accel: am, MaxConcurrentBoots: o.maxBoots,
		ID: cfg.ID, Runtime: h.drv, Network: sandboxNetworks{netm}, AgentBin: o.agentBin, SandboxDir: sandboxDir, ResolvConf: resolv,
		VolumeDir: filepath.Join(o.dataDir, "node", "volumes"), VolumeBaseDir: cfg.Volumes.BaseDir,
		VolumePlugin:  func(d string) (volume.Node, error) { return plugins.Get(d) },
		VolumeDrivers: plugins.Names(), VolumeMetrics: cfg.VolumeMetrics, Logger: log,
		Lxcfs: lx.Mountpoint(), LxcfsFiles: lx.Files(), CACerts: o.caCerts, EgressCA: egressTrust,
		SnapshotDir: filepath.Join(o.dataDir, "snapshots"),
		TokenDir:    filepath.Join(o.dataDir, "node", "tokens"),
		HoldInit:    holdInitFromEnv(),
		Images:      cfg.Images,
	})
	if err != nil {
		return nil, err
	}
	return h, nil
}

// startAccelerators reconciles devices against the host and the live
// sandboxes; done before any capacity is advertised.
func (h *nodeHost) startAccelerators(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if err := h.node.StartAccelerators(ctx); err != nil {
		return fmt.Errorf("accelerators: %w", err)
	}
	return nil
}

// runAccelReconciler repairs accelerator drift until ctx ends: the node's
// own loop, unleased, since every node repairs its devices.
func (h *nodeHost) runAccelReconciler(ctx context.Context) {
	loop.New(nil, h.log).Run(ctx, loop.Spec{Name: "accel-reconcile", Every: h.o.accel.reconcileT}, h.node.ReconcileAccelerators)
}

// Close undoes startNodeHost in reverse order. Sandboxes keep running:
// the next serve or node run re-adopts them.
func (h *nodeHost) Close() {
	for i := len(h.closers) - 1; i >= 0; i-- {
		h.closers[i]()
	}
	h.closers = nil
}

// nodeVolumeConfig reads --node-config (or the built-in local plugin) and
// applies --volume-base-dir.
func nodeVolumeConfig(o *nodeHostOptions) (volume.NodeConfig, error) {
	local := volume.PluginConfig{Name: "local", Type: volume.TypeLocal, Root: filepath.Join(o.dataDir, "volumes", "local")}
	nc := volume.NodeConfig{BaseDir: filepath.Join(o.dataDir, "volume-mounts"), Plugins: []volume.PluginConfig{local}}
	if o.nodeConfig != "" {
		b, err := os.ReadFile(o.nodeConfig)
		if err != nil {
			return nc, fmt.Errorf("--node-config: %w", err)
		}
		if nc, err = volume.ParseNodeConfig(b); err != nil {
			return nc, fmt.Errorf("--node-config %s: %w", o.nodeConfig, err)
		}
	}
	if o.volumeBaseDir != "" {
		nc.BaseDir = o.volumeBaseDir
	}
	for i := range nc.Plugins {
		if nc.Plugins[i].Type == volume.TypeLocal && nc.Plugins[i].Root == "" {
			nc.Plugins[i].Root = local.Root
		}
	}
	return nc, nil
}

// noteMovedDir tells the operator that a directory older releases kept in
// the images dir (a node's pulled images, serve's unpacked image refs) is
// no longer read: that state now lives in the data dir, and the old copy
// is only disk to reclaim. It is not removed here: the images dir may be
// shared with other servers.
func noteMovedDir(log *slog.Logger, old, now string) {
	if fi, err := os.Stat(old); err == nil && fi.IsDir() {
		log.Warn("directory no longer used: its contents moved to the data dir and can be removed", "old", old, "now", now)
	}
}
