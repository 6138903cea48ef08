package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/signal"
	"path/filepath"
	goruntime "runtime"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/spf13/cobra"

	"github.com/cubicle-dev/cubicle/internal/api"
	"github.com/cubicle-dev/cubicle/internal/cacerts"
	"github.com/cubicle-dev/cubicle/internal/control"
	"github.com/cubicle-dev/cubicle/internal/diskbudget"
	"github.com/cubicle-dev/cubicle/internal/lease"
	"github.com/cubicle-dev/cubicle/internal/network"
	"github.com/cubicle-dev/cubicle/internal/node"
	"github.com/cubicle-dev/cubicle/internal/proxy"
	"github.com/cubicle-dev/cubicle/internal/runtime/oci"
	"github.com/cubicle-dev/cubicle/internal/scheduler"
	"github.com/cubicle-dev/cubicle/internal/secret"
	"github.com/cubicle-dev/cubicle/internal/servecert"
	"github.com/cubicle-dev/cubicle/internal/snapstore"
	"github.com/cubicle-dev/cubicle/internal/template/catalog"
	"github.com/cubicle-dev/cubicle/internal/volume"
	"github.com/cubicle-dev/cubicle/internal/volume/local"
	"github.com/cubicle-dev/cubicle/internal/volume/registry"
)

type serveOptions struct {
	// nodeHostOptions are the in-process node's flags (shared with node run).
	nodeHostOptions
	listen, domain                               string
	tlsCert, tlsKey                              string
	tlsSelfSigned                                bool
	secretsKey                                   string
	listenTLS                                    string
	metricsListen                                string
	cpuCount, memoryMB, diskSizeMB, maxSandboxes int
	codeInterpreterMemoryMB                      int
	hostMountPrefixes, hostMountTeams            []string
	maxSnapshots                                 int
	maxCreates, poolMemoryMB                     int
	maxTimeout, createWait                       time.Duration
	volumeConfig                                 string
	contentIdle                                  time.Duration
	registryListen, buildkitd                    string
	readyTimeout                                 time.Duration
	warmPools                                    []string
	conns                                        connOptions
	maxCPU, maxMemoryMB, maxDiskMB               int
	volumeSizeMB, maxVolumeSizeMB                int
	schedule                                     string
	cpuOvercommit                                float64
	diskReserve                                  string
	maxImageBytes                                int64

	// store is --store: a PostgreSQL URL, or "" for SQLite in dataDir.
	store   string
	replica replicaOptions
	// nodeID names the in-process node; embeddedNode false is a pure
	// control plane (remote nodes only).
	nodeID          string
	embeddedNode    bool
	reserveCapacity bool
	// snapshotStore is --snapshot-store: s3://… for restores on other
	// nodes, or "" (snapshots stay on their node).
	snapshotStore string
	// imageStore is --image-store: s3://… shared by every replica, or ""
	// (images live in this replica's data dir only).
	imageStore string
	// sharedImages is --image-store's bucket once parsed (nil: none).
	sharedImages *snapstore.Store
	// publishBuiltins publishes the built-in images of --images-dir to
	// the image store, for nodes that lack them (builtinimage).
	publishBuiltins bool
}

func serveCmd() *cobra.Command {
	var o serveOptions
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run the API, control plane, proxy and node agent in one process",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return serve(cmd.Context(), o)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.dataDir, "data-dir", defaultDataDir, "state directory (database, sandboxes, runtime state)")
	addStoreFlag(f, &o.store)
	addReplicaFlags(f, &o.replica)
	f.StringVar(&o.secretsKey, "secrets-key", "", "key file sealing secret values (default <data-dir>/secrets.key, created 0600 on first start; a backup of the data dir then holds the key with the database: set this outside the data dir if backups copy it; losing it makes every secret unreadable; see docs/secrets.md)")
	f.StringVar(&o.listen, "listen", "127.0.0.1:3000", "address for the API and the sandbox proxy")
	f.StringVar(&o.metricsListen, "metrics-listen", defaultMetricsListen, "address of the Prometheus /metrics listener, kept off --listen because it names every team's pooled templates and live counts and has no authentication: keep it on loopback or a private interface; off disables it")
	f.StringVar(&o.domain, "domain", "", "sandbox domain returned to SDKs; hosts <port>-<id>.<domain> are proxied")
	f.StringVar(&o.tlsCert, "tls-cert", "", "PEM certificate for *.<domain> (with --tls-key): the listener speaks TLS, API at api.<domain> and sandboxes at <port>-<id>.<domain> on the same port")
	f.StringVar(&o.tlsKey, "tls-key", "", "PEM private key of --tls-cert")
	f.StringVar(&o.listenTLS, "listen-tls", "", "with --tls-cert or --tls-self-signed: serve TLS on this address (e.g. 0.0.0.0:443) and keep --listen plain HTTP; default: --listen itself speaks TLS")
	f.BoolVar(&o.tlsSelfSigned, "tls-self-signed", false, "serve TLS for *.<domain> with a certificate from a local CA made once in <data-dir>/tls (prints how to trust it)")
	f.IntVar(&o.cpuCount, "cpu-count", 2, "CPUs per sandbox")
	f.IntVar(&o.memoryMB, "memory-mb", 512, "memory per sandbox in MiB")
	f.IntVar(&o.codeInterpreterMemoryMB, "code-interpreter-memory-mb", 0, "memory in MiB of the built-in code-interpreter-v1 template when it is first seeded (default 2048, e2b's size for it, or --max-sandbox-memory-mb when lower)")
	f.IntVar(&o.diskSizeMB, "disk-size-mb", 1024, "disk size reported per sandbox in MiB")
	f.IntVar(&o.maxSandboxes, "max-sandboxes", 0, "maximum live sandboxes (0 = unlimited); beyond it creates get 429")
	f.StringVar(&o.schedule, "schedule", string(scheduler.Spread), "placement strategy across nodes: spread (the node with the most room left) or binpack (the fullest node that fits); cached template images, warm standbys and placement policies score on top (docs/cluster.md)")
	f.Float64Var(&o.cpuOvercommit, "cpu-overcommit", 1, "with capacity reservations (remote nodes, or --reserve-capacity): a node admits sandboxes asking up to this many times its CPUs (1-100; memory is never overcommitted)")
	f.IntVar(&o.maxSnapshots, "max-snapshots-per-team", 100, "snapshots one team may keep (0 = unlimited); beyond it snapshots get 429")
	f.DurationVar(&o.maxTimeout, "max-timeout", 24*time.Hour, "maximum sandbox timeout")
	f.IntVar(&o.maxCreates, "max-concurrent-creates", 32, "sandboxes that may be starting at once")
	f.IntVar(&o.poolMemoryMB, "pool-memory-mb", -1, "memory warm-pool standbys may hold beyond the pools' set sizes, in MiB: a pool grows to the most creates of its template within 10 s over the last 10 minutes while the standbys fit (-1: a quarter of this machine's memory; 0: pools keep their set sizes)")
	f.DurationVar(&o.createWait, "create-queue-wait", 30*time.Second, "how long a create waits for a start slot before 503")
	f.StringVar(&o.volumeConfig, "volume-config", "", "control-plane YAML with a volume_plugins: list (default: the built-in local plugin)")
	f.StringVar(&o.registryListen, "registry-listen", "127.0.0.1:0", "loopback address of the local OCI registry BuildKit pulls from and pushes to")
	f.StringVar(&o.buildkitd, "buildkitd", "", "buildkitd binary for template builds (default: next to this binary; off disables builds with steps). A pure control plane (--embedded-node=false) takes only off: it builds on nodes labelled builder=true")
	f.DurationVar(&o.readyTimeout, "ready-timeout", 120*time.Second, "how long a template's ready command may take at sandbox create")
	f.DurationVar(&o.contentIdle, "volume-content-idle", 30*time.Second, "how long the volume-content API keeps a volume attached after its last request")
	f.StringArrayVar(&o.hostMountPrefixes, "host-mount-prefix", nil, "host directory under which CubeSandbox's host mounts (create metadata \"host-mount\") may name a hostPath (repeatable; none: host mounts are refused). Only admin keys and --host-mount-team teams may use them")
	f.StringArrayVar(&o.hostMountTeams, "host-mount-team", nil, "team (ID or name, existing now or later) whose keys may ask for host mounts besides admin keys (repeatable)")
	f.StringArrayVar(&o.warmPools, "warm-pool", nil, "TEMPLATE=N: keep N idle standbys of the template (repeatable; stored, like `cubicle pool set`)")
	f.IntVar(&o.maxCPU, "max-sandbox-cpu", 0, "most CPUs a template or sandbox may ask for (default: the host's CPU count); above it 400")
	f.IntVar(&o.maxMemoryMB, "max-sandbox-memory-mb", 0, "most memory in MiB a template or sandbox may ask for (default: the host's memory); above it 400")
	f.IntVar(&o.maxDiskMB, "max-sandbox-disk-mb", 0, "largest diskSizeMB a template or sandbox may ask for (default: the size of the data dir's filesystem); above it 400")
	f.IntVar(&o.volumeSizeMB, "volume-size-mb", 1024, "size in MiB of a volume created without one, on a driver that enforces sizes (the local plugin)")
	f.IntVar(&o.maxVolumeSizeMB, "max-volume-size-mb", 0, "largest volume size in MiB a create may ask for (default: the size of the data dir's filesystem); above it 400")
	f.StringVar(&o.diskReserve, "disk-reserve", "5%", "free space kept on the data dir's filesystem, as N% of its size or a size in MiB/GiB (2048, 2GiB): a sandbox or volume create that would promise sparse images more than free space minus this is refused with 507, so the store and the server's own files still have room when every image fills")
	f.Int64Var(&o.maxImageBytes, "max-image-bytes", api.DefaultMaxImageBytes, "largest image body POST /images accepts; above it 413")
	f.StringVar(&o.nodeID, "node-id", "local", "ID of the in-process node (a DNS label; sandbox, snapshot and volume rows record it)")
	f.StringVar(&o.imageStore, "image-store", "", "s3://BUCKET?endpoint=URL&region=R[&prefix=P/][&pathStyle=true]: keep template images there too, shared by every control-plane replica (needed for two or more); credentials from "+envImageAccessKey+"/"+envImageSecretKey+" (or AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY); nodes never see them. Default: images live in this replica's data dir only")
	f.BoolVar(&o.embeddedNode, "embedded-node", true, "run a node in this process; false: a pure control plane driving only remote nodes (`cubicle node run`), which needs TLS")
	f.BoolVar(&o.reserveCapacity, "reserve-capacity", false, "reserve each sandbox's CPUs and memory on its node in the store's capacity ledger, refusing creates (429) past the node's size, even with only the in-process node (always on while remote nodes are registered)")
	f.StringVar(&o.snapshotStore, "snapshot-store", "", "s3://BUCKET?endpoint=URL&region=R[&prefix=P/][&pathStyle=true]: upload snapshots there so a sandbox from one (or a rollback) can start on another node; credentials from "+envSnapAccessKey+"/"+envSnapSecretKey+" (or AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY); nodes only get presigned URLs. Default: snapshots restore on their own node only")
	f.BoolVar(&o.publishBuiltins, "publish-builtins", false, "publish the built-in images in --images-dir (base, mini, code-interpreter-v1) to this server's image store as builtin/<name>:<recipe hash>, in the background, so joined nodes without them pull them by digest (needs TLS for joins)")
	o.nodeHostOptions.flags(f)
	o.conns.flags(f)
	return cmd
}

func serve(ctx context.Context, o serveOptions) error {
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	slog.SetDefault(log)
	sched, err := scheduler.New(scheduler.Config{Strategy: scheduler.Strategy(o.schedule), CPUOvercommit: o.cpuOvercommit, LeaseTTL: o.replica.nodeLostAfter})
	if err != nil {
		return fmt.Errorf("--schedule/--cpu-overcommit: %w", err)
	}
	// Before anything touches the host: a bad store URL or missing
	// credentials stop serve at once.
	snaps, err := snapshotStore(o.snapshotStore, os.Getenv)
	if err != nil {
		return err
	}
	if o.sharedImages, err = imageStore(o.imageStore, os.Getenv); err != nil {
		return err
	}
	if err := clusterFlags(&o); err != nil {
		return err
	}
	userns, pool, err := o.nodeHostOptions.prepare(o.embeddedNode)
	if err != nil {
		return err
	}
	warmPools, err := parseWarmPools(o.warmPools)
	if err != nil {
		return err
	}
	if err := o.replica.validate(); err != nil {
		return err
	}
	if o.accel.reconcileT <= 0 {
		return errors.New("--accel-reconcile-interval must be positive")
	}
	if err := sandboxMaxima(&o); err != nil {
		return err
	}
	if o.volumeSizeMB <= 0 {
		return fmt.Errorf("--volume-size-mb must be positive")
	}
	if o.poolMemoryMB < -1 {
		return fmt.Errorf("--pool-memory-mb must be -1 (a quarter of the memory), 0 (off) or a size in MiB")
	}
	diskReserve, err := diskbudget.ParseReserve(o.diskReserve)
	if err != nil {
		return fmt.Errorf("--disk-reserve: %w", err)
	}
	budget, err := o.conns.budget()
	if err != nil {
		return err
	}
	// Bound before the slow setup below (BuildKit, recovery): the port is
	// held from here, and a taken port fails before anything touches the
	// host. Connections made meanwhile wait in the backlog.
	tlsConfig, err := serveTLS(&o, log)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", o.listen)
	if err != nil {
		return err
	}
	defer ln.Close()
	var lnTLS net.Listener // nil: ln speaks TLS when tlsConfig is set
	if o.listenTLS != "" {
		if tlsConfig == nil {
			return errors.New("--listen-tls needs --tls-cert/--tls-key or --tls-self-signed")
		}
		if lnTLS, err = net.Listen("tcp", o.listenTLS); err != nil {
			return err
		}
		defer lnTLS.Close()
	}
	metricsLn, err := listenMetrics(o.metricsListen, log)
	if err != nil {
		return err
	}
	if metricsLn != nil {
		defer metricsLn.Close()
	}
	// Configuration errors first, before anything touches the host.
	vc, err := loadVolumeConfig(o)
	if err != nil {
		return err
	}
	ctrlPlugins, err := registry.Open(vc.controller)
	if err != nil {
		return fmt.Errorf("control-plane volume plugins: %w", err)
	}
	defer ctrlPlugins.Close()

	st, err := openStore(ctx, o.dataDir, o.store)
	if err != nil {
		return err
	}
	defer st.Close()
	leaser, locks, closeLocks, err := replicaCoordination(ctx, o.store, o.replica, log)
	if err != nil {
		return err
	}
	defer closeLocks()
	if o.store == "" && o.embeddedNode {
		// SQLite has no lease server; the same one-process-per-node-ID
		// rule, and the forget guard, through a file lock in the data dir.
		release, err := lease.ClaimFile(nodeClaimFile(o.dataDir, o.nodeID), nodeClaim(o.nodeID))
		if errors.Is(err, lease.ErrHeld) {
			return fmt.Errorf("--node-id %s: another `cubicle serve` on data dir %s runs the node of that ID (%w)", o.nodeID, o.dataDir, err)
		}
		if err != nil {
			return fmt.Errorf("--node-id %s: %w", o.nodeID, err)
		}
		defer release()
	}
	if pl, ok := leaser.(*lease.Postgres); ok && o.embeddedNode {
		// One process per node ID: two embedded replicas on one database
		// with the same --node-id would each drive the other's sandboxes
		// as their own (the leased reconcile on one kills the other's).
		// Taken before anything touches the host; released by PostgreSQL
		// when this process ends, however it ends, so a restart finds it
		// free.
		claim, err := pl.Claim(ctx, nodeClaim(o.nodeID))
		if errors.Is(err, lease.ErrHeld) {
			return fmt.Errorf("--node-id %s: another embedded `cubicle serve` on this database runs the node of that ID (%w): give each embedded replica its own --node-id, or run cluster replicas with --embedded-node=false", o.nodeID, err)
		}
		if err != nil {
			return fmt.Errorf("--node-id %s: %w", o.nodeID, err)
		}
		defer claim.Close()
		var cancel context.CancelFunc
		ctx, cancel = context.WithCancel(ctx)
		defer cancel()
		go func() {
			select {
			case <-claim.Lost():
				log.Error("node ID taken by another embedded serve while this one's database connection was down; stopping", "node_id", o.nodeID)
				cancel()
			case <-ctx.Done():
			}
		}()
	}
	if o.secretsKey == "" {
		o.secretsKey = filepath.Join(o.dataDir, "secrets.key")
	}
	// Created only on a fresh install: a missing key with secrets in the
	// store is a lost key, and a new one would make them all unreadable.
	secretsKey, err := secret.LoadOrCreateKeyFor(ctx, o.secretsKey, st)
	if err != nil {
		return fmt.Errorf("secrets key: %w", err)
	}
	secrets, err := secret.New(st, secretsKey)
	clear(secretsKey)
	if err != nil {
		return fmt.Errorf("secrets key: %w", err)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	volMetrics := control.NewVolumeMetrics(reg)
	// A pure control plane (--embedded-node=false) builds no node: no
	// bridge, nftables, runtime or lxcfs on this host.
	var (
		host *nodeHost
		nd   node.Node
		netm *network.Linux
	)
	if o.embeddedNode {
		host, err = startNodeHost(ctx, &o.nodeHostOptions, userns, pool, nodeHostConfig{
			ID: o.nodeID, Volumes: vc.node, Registry: reg, VolumeMetrics: volMetrics, Logger: log,
			// Embedded, the egress proxy reads the secret from the store.
			Secrets: func(ctx context.Context, sandboxID, name string) (string, error) {
				sb, err := st.GetSandbox(ctx, sandboxID)
				if err != nil {
					return "", err
				}
				return secrets.Resolve(ctx, sb.TeamID, name)
			},
		})
		if err != nil {
			return err
		}
		defer host.Close()
		nd, netm = host.node, host.netm
	}
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	tpls, err := setupTemplates(ctx, o, st, netm, reg, log)
	if err != nil {
		return err
	}
	defer tpls.Close()
	var diskSrcs []diskbudget.Source
	if host != nil {
		diskSrcs = diskSources(host.drv, vc.node.Plugins)
	}
	disk := diskbudget.New(diskbudget.Config{Dir: o.dataDir, Reserve: diskReserve, Sources: diskSrcs})
	ds, err := disk.Status()
	if err != nil {
		return fmt.Errorf("data filesystem: %w", err)
	}
	log.Info("data filesystem", "free_mib", ds.FreeBytes>>20, "promised_to_images_mib", ds.PromisedBytes>>20, "reserve_mib", ds.ReserveBytes>>20)
	join, cp, err := serveJoin(ctx, st, secrets, tlsConfig, log)
	if err != nil {
		return fmt.Errorf("cluster CA: %w", err)
	}
	builtins, err := publishBuiltins(ctx, o, join, tpls.images, log)
	if err != nil {
		return err
	}
	// Before the catalog starts (it may resume a build).
	if err := tpls.setClusterBuilds(cp); err != nil {
		return err
	}
	hostPrefixes, err := hostMountPrefixes(o.hostMountPrefixes)
	if err != nil {
		return err
	}
	if len(hostPrefixes) > 0 {
		log.Info("host mounts allowed", "prefixes", hostPrefixes, "teams", o.hostMountTeams, "admin keys", true)
	} else if len(o.hostMountTeams) > 0 {
		return fmt.Errorf("--host-mount-team needs --host-mount-prefix: without a prefix no host mount is allowed")
	}
	poolMemory := o.poolMemoryMB
	if poolMemory < 0 {
		poolMemory = hostResources(o.dataDir).memoryMB / 4
	}
	mgr := control.New(control.Config{Nodes: nodeSet(st, o.nodeID, nd, cp), Reserve: o.reserveCapacity, Disk: disk, DefaultVolumeMB: o.volumeSizeMB, MaxVolumeMB: o.maxVolumeSizeMB, Sealer: secrets, MaxSandboxes: o.maxSandboxes, MaxSnapshotsPerTeam: o.maxSnapshots, MaxTimeout: o.maxTimeout, MaxConcurrentCreates: o.maxCreates, PoolMemoryMB: poolMemory,
		CreateQueueWait: o.createWait, Logger: log, Registry: reg, Volumes: ctrlPlugins, VolumeMetrics: volMetrics, ContentIdle: o.contentIdle,
		ReadyTimeout: o.readyTimeout, MaxSandboxCPU: o.maxCPU, MaxSandboxMemoryMB: o.maxMemoryMB, MaxSandboxDiskMB: o.maxDiskMB, Scheduler: sched,
		Leaser: leaser, Locks: locks, NodeLostAfter: o.replica.nodeLostAfter, NodeLostGrace: o.replica.nodeLostGrace,
		ImageDigest: tpls.imageDigest, BuiltinImage: builtins, SnapshotStore: snaps, HostMountPrefixes: hostPrefixes}, st, nil, tpls.catalog)
	// Registered (its heartbeat renewed) before anything places a sandbox:
	// after a long stop the old heartbeat would read as a lost node.
	if err := mgr.RegisterNode(ctx); err != nil {
		return err
	}
	tpls.catalog.SetProber(mgr)
	tpls.catalog.OnReady(mgr.PoolTrigger)
	if err := tpls.catalog.Start(ctx); err != nil {
		return fmt.Errorf("template catalog: %w", err)
	}
	for name, n := range warmPools {
		if _, err := tpls.catalog.SetPoolSize(ctx, catalog.System(), name, n); err != nil {
			return fmt.Errorf("--warm-pool %s=%d: %w", name, n, err)
		}
	}
	// Devices are reconciled against the host and the live sandboxes before
	// any capacity is advertised (and before recovery releases dead ones).
	if host != nil {
		if err := host.startAccelerators(ctx); err != nil {
			return err
		}
	}
	rctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	if err := mgr.Recover(rctx); err != nil {
		cancel()
		return fmt.Errorf("recover: %w", err)
	}
	cancel()
	go mgr.Run(ctx)
	if host != nil {
		go host.runAccelReconciler(ctx)
	}

	routes, volumeProxy, err := nodeRoutes(st, o, cp)
	if err != nil {
		return err
	}
	apiCfg := api.Config{Domain: o.domain, Logger: log, Registry: reg, Templates: tpls.api, Images: tpls.images,
		MaxImageBytes: o.maxImageBytes, Secrets: secrets, Join: join, HostMountTeams: o.hostMountTeams}
	if volumeProxy != nil {
		defer volumeProxy.Close()
		apiCfg.VolumeNodes = volumeProxy
	}
	apiSrv := api.New(apiCfg, mgr, st)
	tpls.startCollector(ctx, apiSrv)
	var handler http.Handler = proxy.New(proxy.Config{Domain: o.domain, Logger: log, Limits: o.conns.proxyLimits(budget), Registry: reg, Nodes: routes}, mgr, st, apiSrv)
	handler = nodeRegistry(handler, join, st, tpls.ociRegistry)

	o.conns.listeners(budget, reg, &ln, &lnTLS)
	srv := o.conns.server(handler)
	// HTTP/1.1 for the JS SDK, cleartext HTTP/2 for clients that prefer it.
	srv.Protocols = new(http.Protocols)
	srv.Protocols.SetHTTP1(true)
	srv.Protocols.SetUnencryptedHTTP2(true)
	if tlsConfig != nil {
		srv.TLSConfig = tlsConfig
		srv.Protocols.SetHTTP2(true)
	}
	log.Info("connection limits", "nofile", budget.nofile, "max_conns", budget.maxConns, "max_conns_per_client", o.conns.maxConnsPerClient,
		"proxy_max_conns", budget.proxyMaxConns, "proxy_per_sandbox", o.conns.proxyPerSandbox, "proxy_per_client", o.conns.proxyPerClient,
		"proxy_response_start", o.conns.responseStart)
	metricsAddr := "off"
	errc := make(chan error, 3)
	var metricsSrv *http.Server
	if metricsLn != nil {
		metricsAddr = metricsLn.Addr().String()
		metricsSrv = &http.Server{Handler: metricsHandler(reg), ReadHeaderTimeout: 10 * time.Second}
		go func() { errc <- metricsSrv.Serve(metricsLn) }()
	}
	log.Info("cubicle serving", "listen", ln.Addr().String(), "metrics", metricsAddr, "secrets_key", o.secretsKey, "runtime", o.runtime, "userns", userns, "data", o.dataDir, "images", o.imagesDir,
		"volume_drivers", ctrlPlugins.Names(), "volume_base_dir", vc.node.BaseDir)
	go func() {
		if tlsConfig != nil && lnTLS == nil {
			errc <- srv.ServeTLS(ln, "", "")
			return
		}
		errc <- srv.Serve(ln)
	}()
	if lnTLS != nil {
		go func() { errc <- srv.ServeTLS(lnTLS, "", "") }()
	}
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	// Sandboxes keep running across a restart; the next serve re-adopts them.
	sctx, scancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer scancel()
	if metricsSrv != nil {
		metricsSrv.Close()
	}
	if err := srv.Shutdown(sctx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	log.Info("cubicle stopped; sandboxes left running for re-adoption")
	return nil
}

// diskSources lists the sparse images on the data filesystem for the disk
// budget: every sandbox's disk, every snapshot layer cloned from one, and
// every sized volume of a local plugin.
func diskSources(drv *oci.Driver, plugins []volume.PluginConfig) []diskbudget.Source {
	srcs := []diskbudget.Source{func() ([]diskbudget.Image, error) {
		imgs, err := drv.DiskImages()
		out := make([]diskbudget.Image, 0, len(imgs))
		for id, p := range imgs {
			out = append(out, diskbudget.Image{Key: "sandbox/" + id, Path: p})
		}
		return out, err
	}, func() ([]diskbudget.Image, error) {
		imgs, err := drv.LayerImages()
		out := make([]diskbudget.Image, 0, len(imgs))
		for _, p := range imgs {
			out = append(out, diskbudget.Image{Key: "snapshot/" + filepath.Base(p), Path: p, Frozen: true})
		}
		return out, err
	}}
	seen := map[string]bool{}
	for _, p := range plugins {
		if p.Type != volume.TypeLocal || seen[p.Root] {
			continue
		}
		seen[p.Root] = true
		root := p.Root
		srcs = append(srcs, func() ([]diskbudget.Image, error) {
			imgs, err := local.Images(root)
			out := make([]diskbudget.Image, 0, len(imgs))
			for _, i := range imgs {
				out = append(out, diskbudget.Image{Key: "volume/" + i.VolumeID, Path: i.Path})
			}
			return out, err
		})
	}
	return srcs
}

// sandboxResolvers writes the sandboxes' resolv.conf: --dns when given,
// else the host's resolvers.
func sandboxResolvers(dns []string, resolv string) ([]netip.Addr, error) {
	if len(dns) == 0 {
		r, err := node.WriteResolvConf("/etc/resolv.conf", resolv)
		if err != nil {
			return nil, fmt.Errorf("resolv.conf: %w", err)
		}
		return r, nil
	}
	var addrs []netip.Addr
	for _, s := range dns {
		a, err := netip.ParseAddr(strings.TrimSpace(s))
		if err != nil || !a.Is4() || a.IsLoopback() || a.IsUnspecified() {
			return nil, fmt.Errorf("--dns %q: want the IPv4 address of a resolver sandboxes can reach (not loopback)", s)
		}
		addrs = append(addrs, a)
	}
	r, err := node.WriteResolvConfWith(resolv, addrs)
	if err != nil {
		return nil, fmt.Errorf("resolv.conf: %w", err)
	}
	return r, nil
}

// serveTLS loads or makes the listener's certificate; nil without TLS flags.
func serveTLS(o *serveOptions, log *slog.Logger) (*tls.Config, error) {
	if o.tlsCert == "" && o.tlsKey == "" && !o.tlsSelfSigned {
		return nil, nil
	}
	switch {
	case o.domain == "":
		return nil, errors.New("--tls-cert/--tls-self-signed need --domain: the certificate is for *.<domain>")
	case o.tlsSelfSigned && (o.tlsCert != "" || o.tlsKey != ""):
		return nil, errors.New("--tls-self-signed and --tls-cert/--tls-key are exclusive")
	case !o.tlsSelfSigned && (o.tlsCert == "" || o.tlsKey == ""):
		return nil, errors.New("--tls-cert and --tls-key go together")
	}
	if !o.tlsSelfSigned {
		c, err := servecert.Load(o.tlsCert, o.tlsKey, o.domain)
		if err != nil {
			return nil, fmt.Errorf("--tls-cert: %w", err)
		}
		return servecert.Config(c), nil
	}
	c, ca, err := servecert.SelfSigned(filepath.Join(o.dataDir, "tls"), o.domain)
	if err != nil {
		return nil, fmt.Errorf("--tls-self-signed: %w", err)
	}
	log.Info("serving TLS with a certificate from the local CA", "domain", "*."+o.domain, "ca", ca)
	fmt.Fprintln(os.Stderr, servecert.TrustHint(ca))
	return servecert.Config(c), nil
}

// sandboxMaxima fills the server maxima left at 0 from the host (never
// below the per-sandbox defaults, so a small host still boots base) and
// refuses defaults above explicit maxima.
func sandboxMaxima(o *serveOptions) error {
	if o.maxImageBytes <= 0 {
		return fmt.Errorf("--max-image-bytes must be positive")
	}
	host := hostResources(o.dataDir)
	for _, m := range []struct {
		name, defName  string
		max            *int
		def, hostValue int
	}{
		{"--max-sandbox-cpu", "--cpu-count", &o.maxCPU, o.cpuCount, host.cpus},
		{"--max-sandbox-memory-mb", "--memory-mb", &o.maxMemoryMB, o.memoryMB, host.memoryMB},
		{"--max-sandbox-disk-mb", "--disk-size-mb", &o.maxDiskMB, o.diskSizeMB, host.diskMB},
		{"--max-volume-size-mb", "--volume-size-mb", &o.maxVolumeSizeMB, o.volumeSizeMB, host.diskMB},
	} {
		switch {
		case *m.max < 0:
			return fmt.Errorf("%s must not be negative", m.name)
		case *m.max == 0:
			*m.max = max(m.hostValue, m.def)
		case m.def > *m.max:
			return fmt.Errorf("%s %d exceeds %s %d", m.defName, m.def, m.name, *m.max)
		}
	}
	switch {
	case o.codeInterpreterMemoryMB < 0:
		return fmt.Errorf("--code-interpreter-memory-mb must not be negative")
	case o.codeInterpreterMemoryMB > o.maxMemoryMB:
		return fmt.Errorf("--code-interpreter-memory-mb %d exceeds --max-sandbox-memory-mb %d", o.codeInterpreterMemoryMB, o.maxMemoryMB)
	}
	return nil
}

type hostSizes struct{ cpus, memoryMB, diskMB int }

func hostResources(dataDir string) hostSizes {
	h := hostSizes{cpus: goruntime.NumCPU()}
	var si syscall.Sysinfo_t
	if syscall.Sysinfo(&si) == nil {
		h.memoryMB = int(uint64(si.Totalram) * uint64(si.Unit) >> 20)
	}
	var fs syscall.Statfs_t
	if syscall.Statfs(dataDir, &fs) == nil {
		h.diskMB = int(fs.Blocks * uint64(fs.Bsize) >> 20)
	}
	return h
}

type volumeConfig struct {
	controller []volume.PluginConfig
	node       volume.NodeConfig
}

// loadVolumeConfig reads both halves of the plugin registration; without
// files, both get the built-in local plugin. In embedded mode the control
// plane and the node are one process, so their driver names must match.
func loadVolumeConfig(o serveOptions) (volumeConfig, error) {
	local := volume.PluginConfig{Name: "local", Type: volume.TypeLocal, Root: filepath.Join(o.dataDir, "volumes", "local")}
	vc := volumeConfig{controller: []volume.PluginConfig{local}}
	var err error
	if vc.node, err = nodeVolumeConfig(&o.nodeHostOptions); err != nil {
		return vc, err
	}
	if o.volumeConfig != "" {
		b, err := os.ReadFile(o.volumeConfig)
		if err != nil {
			return vc, fmt.Errorf("--volume-config: %w", err)
		}
		if vc.controller, err = volume.ParseControllerConfig(b); err != nil {
			return vc, fmt.Errorf("--volume-config %s: %w", o.volumeConfig, err)
		}
	}
	for i := range vc.controller {
		if vc.controller[i].Type == volume.TypeLocal && vc.controller[i].Root == "" {
			vc.controller[i].Root = local.Root
		}
	}
	// A pure control plane has no node of its own to align with: each
	// remote node reports its drivers, and the scheduler places a sandbox
	// only where its volumes' drivers are.
	if o.embeddedNode {
		if err := volume.CheckAligned(vc.controller, vc.node.Plugins); err != nil {
			return vc, fmt.Errorf("volume plugins: --volume-config and --node-config must register the same driver names: %w", err)
		}
	}
	return vc, nil
}

// usernsMode resolves --userns: on by default for every runtime. Under
// runsc the namespace holds gVisor's sentry and gofer, which otherwise run
// as host root.
func usernsMode(v, runtime string) (bool, error) {
	switch v {
	case "auto", "on":
		return true, nil
	case "off":
		return false, nil
	}
	return false, fmt.Errorf("--userns %q: want on, off or auto", v)
}

func hostname() string {
	h, _ := os.Hostname()
	return h
}

// trustRoots is what the egress proxy verifies real servers against: the
// host's trust store plus the operator's CAs, what a sandbox trusts.
func trustRoots(set *cacerts.Set) (*x509.CertPool, error) {
	pool, err := x509.SystemCertPool()
	if err != nil {
		return nil, fmt.Errorf("host trust store: %w", err)
	}
	if set != nil {
		pool.AppendCertsFromPEM(set.PEM())
	}
	return pool, nil
}
