package main

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/cubicle-dev/cubicle/internal/api"
	"github.com/cubicle-dev/cubicle/internal/dataplane"
	"github.com/cubicle-dev/cubicle/internal/image"
	"github.com/cubicle-dev/cubicle/internal/network"
	"github.com/cubicle-dev/cubicle/internal/store"
	"github.com/cubicle-dev/cubicle/internal/template"
	"github.com/cubicle-dev/cubicle/internal/template/builder"
	"github.com/cubicle-dev/cubicle/internal/template/buildkit"
	"github.com/cubicle-dev/cubicle/internal/template/catalog"
	"github.com/cubicle-dev/cubicle/internal/template/clusterbuild"
	"github.com/cubicle-dev/cubicle/internal/template/contextstore"
)

// templateStack is everything the template catalog runs on.
type templateStack struct {
	catalog  *catalog.Catalog
	api      *api.Templates
	images   *image.Store
	registry string // host:port of the local registry
	// registryPassword is the registry's (user "cubicle"), for BuildKit.
	registryPassword string
	// ociRegistry is the same registry, which serve also offers to
	// cluster nodes (read-only, by digest: nodeRegistry).
	ociRegistry *image.Registry
	contexts    *contextstore.Store
	// cluster runs builds on builder nodes (a pure control plane); nil
	// when builds use this process's buildkitd or none.
	cluster *clusterbuild.Solver
	closers []func()
}

// setClusterBuilds gives the builder-node solver its way to the nodes:
// the builder tunnel of their data planes, with this replica's
// control-plane identity (cp; nil without TLS, which a pure control
// plane refuses at its flags).
func (t *templateStack) setClusterBuilds(cp *cpCert) error {
	if t.cluster == nil || cp == nil {
		return nil
	}
	dp, err := dataplane.NewClientFunc(func() (*tls.Certificate, error) { return cp.get(time.Now()) }, cp.ca.Cert, cp.revs)
	if err != nil {
		return err
	}
	t.cluster.Dial = dp.DialBuilder
	return nil
}

// startCollector runs the catalog's garbage collector (idempotency keys,
// unreferenced uploaded build contexts, the API's expired upload grants).
func (t *templateStack) startCollector(ctx context.Context, apiSrv *api.Server) {
	go t.catalog.RunCollector(ctx, catalog.CollectorConfig{Contexts: t.contexts.GCExcept, Also: apiSrv.PruneUploads})
}

func (t *templateStack) Close() {
	for i := len(t.closers) - 1; i >= 0; i-- {
		t.closers[i]()
	}
}

// setupTemplates opens the local image store and its registry, the build
// context store, BuildKit (when available) and the catalog.
func setupTemplates(ctx context.Context, o serveOptions, st store.Store, netm *network.Linux, reg prometheus.Registerer, log *slog.Logger) (*templateStack, error) {
	ts := &templateStack{}
	imgs, err := image.Open(filepath.Join(o.dataDir, "oci"))
	if err != nil {
		return nil, fmt.Errorf("image store: %w", err)
	}
	ts.images = imgs
	switch {
	case o.sharedImages != nil:
		imgs.SetRemote(o.sharedImages)
		log.Info("template images are kept in the shared image store (--image-store) as well as in " + imgs.Dir())
	case !o.embeddedNode:
		// Another replica would not know the images built or pushed here.
		log.Warn("template images live in this replica's data dir only (" + imgs.Dir() + "): run one replica, or give every replica the same --image-store")
	}
	ln, err := net.Listen("tcp", o.registryListen)
	if err != nil {
		return nil, fmt.Errorf("--registry-listen: %w", err)
	}
	ts.registry = ln.Addr().String()
	// The registry is for BuildKit alone: buildkitd reaches it through a
	// relay in its own netns that serves buildkitd's sockets only, and it
	// takes a password only the build sessions present.
	ocireg := image.NewRegistry(imgs)
	ts.registryPassword = rand.Text()
	ocireg.RequireBasicAuth("cubicle", ts.registryPassword)
	ts.ociRegistry = ocireg
	rsrv := &http.Server{Handler: ocireg, ReadHeaderTimeout: 30 * time.Second}
	go rsrv.Serve(ln)
	ts.closers = append(ts.closers, func() { rsrv.Close() })

	ctxs, err := contextstore.Open(filepath.Join(o.dataDir, "template-context"), 512<<20)
	if err != nil {
		ts.Close()
		return nil, fmt.Errorf("context store: %w", err)
	}
	ts.contexts = ctxs
	var solver builder.Solver
	buildRegistry := ts.registry
	switch {
	case !o.embeddedNode && o.buildkitd != "off":
		// A pure control plane builds on its nodes labelled builder=true,
		// whose buildkitd reaches this registry through its relay at
		// clusterbuild.RegistryHost; the dialer is set once the cluster
		// identity exists (setClusterBuilds).
		// Each build gets its own registry credentials, revoked when it
		// ends: a builder node never holds the registry's password.
		ts.cluster = &clusterbuild.Solver{Nodes: st.ListNodes, TTL: o.replica.nodeLostAfter,
			Grant: func(repo, tag string, reads []string) (buildkit.Credentials, func(), error) {
				u, p, revoke, err := ocireg.GrantBuild(repo, tag, reads...)
				return buildkit.Credentials{Username: u, Password: p}, revoke, err
			}}
		solver, buildRegistry = ts.cluster, clusterbuild.RegistryHost
		log.Info("template builds with steps run on nodes labelled " + clusterbuild.Label + "=true")
	default:
		s, closeSolver, err := startSolver(ctx, o, netm, ts.registry, ts.registryPassword, log)
		if err != nil {
			log.Warn("BuildKit unavailable: template builds with steps are disabled", "err", err)
		} else {
			solver = s
			ts.closers = append(ts.closers, closeSolver)
		}
	}
	bld, err := builder.New(builder.Config{Images: imgs, Contexts: ctxs, Registry: buildRegistry, Solver: solver,
		RootfsDir: filepath.Join(o.dataDir, "builds"), WorkDir: filepath.Join(o.dataDir, "build-work"), CACerts: o.caCerts})
	if err != nil {
		ts.Close()
		return nil, err
	}
	ts.catalog = catalog.New(catalog.Config{Store: st, Builder: bld, BaseRootfs: filepath.Join(o.imagesDir, template.BaseTemplate, "rootfs"),
		CodeInterpreterRootfs: codeInterpreterRootfs(o.imagesDir, log), CodeInterpreterMemoryMB: o.codeInterpreterMemoryMB,
		CPUCount: o.cpuCount, MemoryMB: o.memoryMB, DiskSizeMB: o.diskSizeMB, Logger: log, Registry: reg,
		MaxCPUCount: o.maxCPU, MaxMemoryMB: o.maxMemoryMB, MaxDiskSizeMB: o.maxDiskMB,
		// PostgreSQL: other replicas may be running builds of their own.
		SharedStore: o.store != ""})
	noteMovedDir(log, filepath.Join(o.imagesDir, "refs"), filepath.Join(o.dataDir, "image-refs"))
	ts.catalog.SetFallback(&builder.ImageRefs{Images: imgs, Dir: filepath.Join(o.dataDir, "image-refs"),
		CPUCount: o.cpuCount, MemoryMB: o.memoryMB, DiskSizeMB: o.diskSizeMB,
		Next: &template.Images{Dir: o.imagesDir, CPUCount: o.cpuCount, MemoryMB: o.memoryMB, DiskSizeMB: o.diskSizeMB}})
	ts.api = &api.Templates{Catalog: ts.catalog, Contexts: teamContexts{ctxs}, Errors: api.ContextErrors{
		Conflict: contextstore.ErrConflict, TooLarge: contextstore.ErrTooLarge, BadArchive: contextstore.ErrBadArchive,
		UnsafePath: contextstore.ErrUnsafePath, InvalidHash: contextstore.ErrInvalidHash}}
	ts.api.InUse = func(ctx context.Context, id string) (string, error) {
		// Idle warm-pool standbys do not count: the pool is drained first.
		rows, err := st.ListSandboxes(ctx, store.SandboxFilter{Template: id, Limit: 1, ExcludeMetadataKey: store.PoolMetadataKey,
			States: []store.SandboxState{store.StateCreating, store.StateRunning, store.StatePausing, store.StatePaused, store.StateResuming}})
		if err != nil {
			return "", err
		}
		if len(rows) > 0 {
			// Not named: for a public template it may be another team's.
			return "a live sandbox uses it", nil
		}
		// Snapshots stack their layer on the template's files.
		snaps, err := st.ListSnapshots(ctx, store.SnapshotFilter{})
		if err != nil {
			return "", err
		}
		n := 0
		for _, sn := range snaps {
			if sn.SourceTemplateID == id {
				n++
			}
		}
		if n > 0 {
			return fmt.Sprintf("%d snapshot(s) of its sandboxes depend on it; delete them first", n), nil
		}
		return "", nil
	}
	if err := os.MkdirAll(filepath.Join(o.dataDir, "builds"), 0o755); err != nil {
		ts.Close()
		return nil, err
	}
	return ts, nil
}

// teamContexts adapts the context store's per-team views to the API.
type teamContexts struct{ s *contextstore.Store }

func (c teamContexts) Has(team, hash string) bool {
	t, err := c.s.Team(team)
	return err == nil && t.Has(hash)
}

func (c teamContexts) Put(team, hash string, body io.Reader) error {
	t, err := c.s.Team(team)
	if err != nil {
		return err
	}
	return t.Put(hash, body)
}

// bkSolver adapts the supervised buildkitd to builder.Solver.
type bkSolver struct{ d *buildkit.Daemon }

func (s bkSolver) Solve(ctx context.Context, dockerfile []byte, contextDir string, noCache bool, push string, secrets map[string][]byte,
	log func(level, msg string, line int)) error {
	_, err := s.d.Build(ctx, buildkit.BuildRequest{Dockerfile: dockerfile, ContextDir: contextDir, NoCache: noCache, Push: push, Secrets: secrets},
		func(l buildkit.Log) { log(l.Level, l.Message, l.Step+1) })
	return clusterbuild.SolveError(err)
}

// builderNetPrefix starts the template builder's network endpoint ID: a
// netns on the sandbox bridge with the default sandbox egress policy. The
// '.' keeps it apart from sandbox IDs, which never contain one.
const builderNetPrefix = "cubicle.builder"

// builderNetID is this server's builder endpoint. It names the bridge:
// host link names derive from the ID, so two servers on one host (each with
// its own bridge) must not share it, or one would take the other's link.
func builderNetID(bridge string) string { return builderNetPrefix + "." + bridge }

func isBuilderNet(id string) bool { return strings.HasPrefix(id, builderNetPrefix) }

// sandboxNetworks is the network manager as the node sees it: the
// builder's endpoint is the server's own, not a sandbox, so the node never
// lists it (and recovery never deletes it) nor touches it by ID.
type sandboxNetworks struct{ *network.Linux }

func (n sandboxNetworks) List(ctx context.Context) ([]network.Endpoint, error) {
	eps, err := n.Linux.List(ctx)
	out := eps[:0]
	for _, ep := range eps {
		if !isBuilderNet(ep.ID) {
			out = append(out, ep)
		}
	}
	return out, err
}

func (n sandboxNetworks) Setup(ctx context.Context, id string, p network.Policy) (network.Endpoint, error) {
	if isBuilderNet(id) {
		return network.Endpoint{}, network.ErrInvalidID
	}
	return n.Linux.Setup(ctx, id, p)
}

func (n sandboxNetworks) Teardown(ctx context.Context, id string) error {
	if isBuilderNet(id) {
		return nil
	}
	return n.Linux.Teardown(ctx, id)
}

func (n sandboxNetworks) UpdatePolicy(ctx context.Context, id string, p network.Policy) error {
	if isBuilderNet(id) {
		return network.ErrNotFound
	}
	return n.Linux.UpdatePolicy(ctx, id, p)
}

func (n sandboxNetworks) Get(ctx context.Context, id string) (network.Endpoint, error) {
	if isBuilderNet(id) {
		return network.Endpoint{}, network.ErrNotFound
	}
	return n.Linux.Get(ctx, id)
}

// builderNetns gives the builder its endpoint: a fresh one each start (one
// left by a server that died is torn down first).
func builderNetns(ctx context.Context, netm *network.Linux, bridge string) (string, error) {
	if err := netm.Teardown(ctx, builderNetID(bridge)); err != nil {
		return "", err
	}
	// The default sandbox egress: the internet yes; the host, the pool,
	// internal ranges and metadata no (docs/network.md).
	ep, err := netm.Setup(ctx, builderNetID(bridge), network.Policy{AllowInternet: true})
	if err != nil {
		return "", err
	}
	return ep.NetNSPath, nil
}

// startBuilderNetns readies what buildkitd needs here, for serve and node
// run alike: its binary (flagBin, else next to this binary) and a fresh
// builder netns on bridge, which teardown removes. noBinary is the
// command's own hint for a missing binary.
func startBuilderNetns(ctx context.Context, netm *network.Linux, flagBin, bridge, noBinary string, log *slog.Logger) (bin, nsPath string, teardown func(), err error) {
	bin = flagBin
	if bin == "" {
		exe, err := os.Executable()
		if err != nil {
			return "", "", nil, err
		}
		bin = filepath.Join(filepath.Dir(exe), "buildkitd")
	}
	if _, err := os.Stat(bin); err != nil {
		return "", "", nil, fmt.Errorf("buildkitd binary: %w (%s)", err, noBinary)
	}
	nsPath, err = builderNetns(ctx, netm, bridge)
	if err != nil {
		return "", "", nil, fmt.Errorf("builder network: %w", err)
	}
	teardown = func() {
		tctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		if err := netm.Teardown(tctx, builderNetID(bridge)); err != nil {
			log.Error("removing the builder's network", "err", err)
		}
	}
	return bin, nsPath, teardown, nil
}

// startSolver starts buildkitd when its binary is present (next to this
// binary, or --buildkitd), in its own user namespace and in the builder's
// netns.
func startSolver(ctx context.Context, o serveOptions, netm *network.Linux, registry, registryPassword string, log *slog.Logger) (builder.Solver, func(), error) {
	if o.buildkitd == "off" {
		return nil, nil, fmt.Errorf("disabled by --buildkitd=off")
	}
	bin, nsPath, teardown, err := startBuilderNetns(ctx, netm, o.buildkitd, o.bridge, "make build produces bin/buildkitd", log)
	if err != nil {
		return nil, nil, err
	}
	d, err := buildkit.Start(ctx, buildkit.Config{Binary: bin, Root: filepath.Join(o.dataDir, "buildkit"), InsecureRegistries: []string{registry},
		RegistryAuth: map[string]buildkit.Credentials{registry: {Username: "cubicle", Password: registryPassword}}, NetNS: nsPath, Logger: log})
	if err != nil {
		teardown()
		return nil, nil, err
	}
	return bkSolver{d}, func() { d.Close(); teardown() }, nil
}

// codeInterpreterRootfs is the code-interpreter-v1 template's layered rootfs
// when its layer is installed (scripts/install builds it), else "".
func codeInterpreterRootfs(imagesDir string, log *slog.Logger) string {
	layers := template.ImageLayers(imagesDir, template.CodeInterpreterTemplate)
	if _, err := os.Stat(layers[0]); err != nil {
		log.Warn("the code interpreter image is not installed: template code-interpreter-v1 is unavailable (scripts/install builds it)", "layer", layers[0])
		return ""
	}
	return template.JoinLayers(layers...)
}
