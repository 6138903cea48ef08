package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/cubicle-dev/cubicle/internal/builtinimage"
	"github.com/cubicle-dev/cubicle/internal/clusterpki"
	"github.com/cubicle-dev/cubicle/internal/control"
	"github.com/cubicle-dev/cubicle/internal/dataplane"
	"github.com/cubicle-dev/cubicle/internal/imagecache"
	"github.com/cubicle-dev/cubicle/internal/node"
	"github.com/cubicle-dev/cubicle/internal/node/nodegrpc"
	"github.com/cubicle-dev/cubicle/internal/nodeclient"
	"github.com/cubicle-dev/cubicle/internal/nodejoin"
	"github.com/cubicle-dev/cubicle/internal/store"
	"github.com/cubicle-dev/cubicle/internal/template/builder"
	"github.com/cubicle-dev/cubicle/internal/template/clusterbuild"
)

// nodeHeartbeatInterval is how often a node agent renews its lease: a third
// of the scheduler's default lease TTL, as the embedded node does.
const nodeHeartbeatInterval = 5 * time.Second

type nodeRunOptions struct {
	nodeHostOptions
	listen, dataListen, advertise string
	buildkitd                     string
	data                          dataplane.ServerConfig
}

// nodeRunCmd is `cubicle node run`: the node agent as its own process.
func nodeRunCmd() *cobra.Command {
	var o nodeRunOptions
	cmd := &cobra.Command{
		Use:   "run",
		Short: "Run this machine's node agent: its sandboxes, served to the control plane over mTLS gRPC",
		Long: "Run the node agent with the identity `cubicle node join` left in --data-dir. It serves the node's gRPC\n" +
			"services on --listen to the control plane only, registers with the control plane and heartbeats every\n" +
			"5s, and renews its certificate when a third of its life is left. SIGTERM stops it; sandboxes keep running\n" +
			"and are re-adopted when it starts again.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return nodeRun(cmd.Context(), o)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.dataDir, "data-dir", "/var/lib/cubicle-node", "the node's data directory: its join identity (node.key, node.crt, ca.crt, node.json), sandboxes and caches")
	f.StringVar(&o.listen, "listen", "0.0.0.0:7443", "address of the node's gRPC services (mTLS: only the control plane's identity is accepted)")
	f.StringVar(&o.dataListen, "data-listen", "0.0.0.0:7444", "address of the node's data plane (mTLS), registered as its dataAddress")
	f.StringVar(&o.advertise, "advertise", "", "host the control plane dials this node at (default: the first address in node.crt)")
	f.StringVar(&o.buildkitd, "buildkitd", "", "buildkitd binary for template builds on a node joined with the label "+clusterbuild.Label+"=true (default: next to this binary; off: this node builds nothing)")
	o.data.RegisterFlags(f)
	o.nodeHostOptions.flags(f)
	return cmd
}

// errNotJoined: node run found no join identity in its data dir.
var errNotJoined = errors.New("this node has not joined a cluster")

// nodeIdentity is what `cubicle node join` left in the data dir.
type nodeIdentity struct {
	info nodejoin.Info
	ca   *x509.Certificate
	cert *tls.Certificate
}

func loadNodeIdentity(dataDir string) (*nodeIdentity, error) {
	infoRaw, err := os.ReadFile(filepath.Join(dataDir, nodejoin.InfoFile))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%w: no %s in %s: run `cubicle node join` first", errNotJoined, nodejoin.InfoFile, dataDir)
	}
	if err != nil {
		return nil, err
	}
	var id nodeIdentity
	if err := json.Unmarshal(infoRaw, &id.info); err != nil {
		return nil, fmt.Errorf("%s: %w", filepath.Join(dataDir, nodejoin.InfoFile), err)
	}
	if err := clusterpki.ValidateNodeID(id.info.NodeID); err != nil {
		return nil, fmt.Errorf("%s: %w", filepath.Join(dataDir, nodejoin.InfoFile), err)
	}
	caRaw, err := os.ReadFile(filepath.Join(dataDir, nodejoin.CAFile))
	if err != nil {
		return nil, fmt.Errorf("%w: %v: run `cubicle node join` first", errNotJoined, err)
	}
	if id.ca, err = clusterpki.ParseCertPEM(caRaw); err != nil {
		return nil, fmt.Errorf("%s: %w", nodejoin.CAFile, err)
	}
	if id.cert, err = loadNodeCert(dataDir, id.ca, id.info.NodeID); err != nil {
		return nil, err
	}
	return &id, nil
}

// loadNodeCert reads node.crt and node.key and checks the certificate is
// this node's, from the cluster CA.
func loadNodeCert(dataDir string, ca *x509.Certificate, nodeID string) (*tls.Certificate, error) {
	c, err := tls.LoadX509KeyPair(filepath.Join(dataDir, nodejoin.CertFile), filepath.Join(dataDir, nodejoin.KeyFile))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%w: %v: run `cubicle node join` first", errNotJoined, err)
	}
	if err != nil {
		return nil, fmt.Errorf("node certificate: %w", err)
	}
	if err := checkNodeCert(c.Leaf, ca, nodeID); err != nil {
		return nil, err
	}
	return &c, nil
}

func checkNodeCert(leaf *x509.Certificate, ca *x509.Certificate, nodeID string) error {
	roots := x509.NewCertPool()
	roots.AddCert(ca)
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}}); err != nil {
		return fmt.Errorf("node certificate: %w (expired? join again after `cubicle node forget %s`)", err, nodeID)
	}
	if len(leaf.URIs) != 1 || leaf.URIs[0].String() != clusterpki.NodeURI(nodeID) {
		return fmt.Errorf("node certificate names %v, not %s", leaf.URIs, clusterpki.NodeURI(nodeID))
	}
	return nil
}

// certHolder is the node's current certificate: the gRPC listener and the
// control-plane client read it at each handshake, so a renewal needs no
// restart.
type certHolder struct {
	mu sync.RWMutex
	c  *tls.Certificate
}

func (h *certHolder) get() *tls.Certificate {
	h.mu.RLock()
	defer h.mu.RUnlock()
	return h.c
}

func (h *certHolder) set(c *tls.Certificate) {
	h.mu.Lock()
	h.c = c
	h.mu.Unlock()
}

// advertiseHost is --advertise, else the first address node.crt names.
func advertiseHost(flag string, leaf *x509.Certificate) (string, error) {
	if flag != "" {
		if net.ParseIP(flag) == nil && strings.Contains(flag, ":") {
			return "", fmt.Errorf("--advertise %q: want a host (an IP or DNS name) without a port: the ports are --listen's and --data-listen's", flag)
		}
		return flag, nil
	}
	if len(leaf.IPAddresses) > 0 {
		return leaf.IPAddresses[0].String(), nil
	}
	if len(leaf.DNSNames) > 0 {
		return leaf.DNSNames[0], nil
	}
	return "", errors.New("--advertise is required: node.crt names no address (join with --address to put one in it)")
}

func nodeRun(ctx context.Context, o nodeRunOptions) error {
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	slog.SetDefault(log)
	id, err := loadNodeIdentity(o.dataDir)
	if err != nil {
		return err
	}
	host, err := advertiseHost(o.advertise, id.cert.Leaf)
	if err != nil {
		return err
	}
	_, dataPort, err := net.SplitHostPort(o.dataListen)
	if err != nil {
		return fmt.Errorf("--data-listen: %w", err)
	}
	if p, err := strconv.Atoi(dataPort); err != nil || p < 1 || p > 65535 {
		return fmt.Errorf("--data-listen %q: want host:port with a port 1-65535", o.dataListen)
	}
	userns, pool, err := o.nodeHostOptions.prepare(false)
	if err != nil {
		return err
	}
	vc, err := nodeVolumeConfig(&o.nodeHostOptions)
	if err != nil {
		return err
	}
	certs := &certHolder{c: id.cert}
	cp, err := nodeclient.NewClient(id.info.ControlPlane, id.ca, func() (*tls.Certificate, error) { return certs.get(), nil })
	if err != nil {
		return fmt.Errorf("%s: %w", nodejoin.InfoFile, err)
	}
	defer cp.CloseIdleConnections()
	// Bound before the node host is built: a taken port fails before
	// anything touches the host.
	ln, err := net.Listen("tcp", o.listen)
	if err != nil {
		return err
	}
	defer ln.Close()
	grpcPort := ln.Addr().(*net.TCPAddr).Port
	dataLn, err := net.Listen("tcp", o.dataListen)
	if err != nil {
		return fmt.Errorf("--data-listen: %w", err)
	}
	defer dataLn.Close()

	// Template images come from the control plane's registry, by digest,
	// with this node's identity (docs/cluster.md, images across nodes).
	noteMovedDir(log, filepath.Join(o.imagesDir, "cache"), filepath.Join(o.dataDir, "image-cache"))
	images, err := imagecache.NewSource(id.info.ControlPlane, cp.TLSConfig(), o.imagesDir, filepath.Join(o.dataDir, "image-cache"))
	if err != nil {
		return err
	}
	reg := prometheus.NewRegistry()
	nh, err := startNodeHost(ctx, &o.nodeHostOptions, userns, pool, nodeHostConfig{
		ID: id.info.NodeID, Volumes: vc, Registry: reg, VolumeMetrics: control.NewVolumeMetrics(reg), Logger: log,
		// The control plane gives a secret only for a sandbox of this node
		// whose own rules name it.
		Secrets: cp.Secret,
		Images:  images,
	})
	if err != nil {
		return err
	}
	defer nh.Close()
	if err := nh.startAccelerators(ctx); err != nil {
		return err
	}

	if clusterbuild.IsBuilder(id.info.Labels) && o.buildkitd != "off" {
		dial, closeBuilder, err := startNodeBuilder(ctx, &o, nh.netm, id.info.ControlPlane, cp.TLSConfig(), log)
		if err != nil {
			return fmt.Errorf("template builder (this node is labelled %s=true): %w", clusterbuild.Label, err)
		}
		defer closeBuilder()
		o.data.Builder = dial
	}

	tlsConf := clusterpki.NodeServerConfig(*id.cert, id.ca)
	tlsConf.Certificates = nil
	tlsConf.GetCertificate = func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return certs.get(), nil }
	srv := nodegrpc.NewServer(nh.node, grpc.Creds(credentials.NewTLS(tlsConf)))
	o.data.CA, o.data.GetCertificate, o.data.Logger, o.data.Registry = id.ca, certs.get, log, reg
	o.data.Lookup = dataplane.NodeLookup(nh.node)
	o.data.Volumes = nh.node // the volume-content API of volumes attached here
	dp, err := dataplane.NewServer(o.data)
	if err != nil {
		return err
	}
	defer dp.Close()
	errc := make(chan error, 2)
	go func() { errc <- srv.Serve(ln) }()
	go func() {
		if err := dp.Serve(dataLn); !errors.Is(err, dataplane.ErrServerClosed) {
			errc <- fmt.Errorf("data plane: %w", err)
		}
	}()

	ctx, stop := signal.NotifyContext(ctx, syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	go nh.runAccelReconciler(ctx)
	a := &nodeAgent{
		node: nh.node, cp: cp, certs: certs, ca: id.ca, id: id.info.NodeID, dataDir: o.dataDir, imagesDir: o.imagesDir, log: log,
		address:     net.JoinHostPort(host, strconv.Itoa(grpcPort)),
		dataAddress: net.JoinHostPort(host, dataPort),
	}
	log.Info("cubicle node serving", "node", a.id, "listen", ln.Addr().String(), "address", a.address, "data_address", a.dataAddress,
		"control_plane", id.info.ControlPlane, "runtime", o.runtime, "data", o.dataDir)
	go a.run(ctx)
	select {
	case err := <-errc:
		return fmt.Errorf("node server: %w", err)
	case <-ctx.Done():
	}
	// In-flight calls get a moment; sandboxes keep running either way.
	done := make(chan struct{})
	go func() { srv.GracefulStop(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		srv.Stop()
	}
	log.Info("cubicle node stopped; sandboxes left running for re-adoption")
	return nil
}

// nodeAgent registers the node, heartbeats and renews its certificate.
type nodeAgent struct {
	node                 node.Node
	cp                   *nodeclient.Client
	certs                *certHolder
	ca                   *x509.Certificate
	id                   string
	dataDir, imagesDir   string
	address, dataAddress string
	log                  *slog.Logger
}

// status is what the node reports at each register and heartbeat.
func (a *nodeAgent) status(ctx context.Context) (nodeclient.Status, error) {
	info, err := a.node.Info(ctx)
	if err != nil {
		return nodeclient.Status{}, err
	}
	inv, err := a.node.AcceleratorInventory(ctx)
	if err != nil {
		return nodeclient.Status{}, fmt.Errorf("accelerators: %w", err)
	}
	return nodeclient.Status{
		Address: a.address, DataAddress: a.dataAddress, Runtime: info.Runtime, Version: info.Version,
		Capacity: store.Capacity{MilliCPU: int64(info.Capacity.CPUs) * 1000, MemoryMiB: int64(info.Capacity.MemoryBytes >> 20),
			DiskMiB: int64(hostResources(a.dataDir).diskMB)},
		VolumeDrivers: info.VolumeDrivers, Accelerators: inv, Templates: nodeTemplates(a.imagesDir, info.Images),
	}, nil
}

// cachedImages lists the images the node has unpacked (<dir>/<name>/rootfs).
// nodeTemplates are the templates whose images this node holds: the
// built-ins in its images dir, the registry images it has pulled and the
// built-ins it pulled (builtin/<name>), as the scheduler's "image cached"
// score names them.
func nodeTemplates(dir string, pulled []node.Image) []string {
	out := cachedImages(dir)
	for _, im := range pulled {
		id, ok := builder.TemplateOfRepository(im.Name)
		if !ok {
			// A built-in the control plane published: template <name>.
			id, ok = builtinimage.NameOf(im.Name)
		}
		if ok && !slices.Contains(out, id) {
			out = append(out, id)
		}
	}
	return out
}

func cachedImages(dir string) []string {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil
	}
	var out []string
	for _, e := range ents {
		if _, err := os.Stat(filepath.Join(dir, e.Name(), "rootfs")); e.IsDir() && err == nil {
			out = append(out, e.Name())
		}
	}
	return out
}

// run registers (retrying until it succeeds), then heartbeats every
// nodeHeartbeatInterval until ctx ends; a 404 registers again.
func (a *nodeAgent) run(ctx context.Context) {
	registered := false
	t := time.NewTicker(nodeHeartbeatInterval)
	defer t.Stop()
	for {
		st, err := a.status(ctx)
		if err == nil {
			err = a.beat(ctx, st, &registered)
		}
		if err != nil && ctx.Err() == nil {
			a.log.Error("node heartbeat", "err", err)
		}
		if err := a.renewIfDue(ctx, time.Now()); err != nil && ctx.Err() == nil {
			a.log.Error("node certificate renewal", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// beat heartbeats a registered node and registers one that is not (or
// that the control plane no longer knows).
func (a *nodeAgent) beat(ctx context.Context, st nodeclient.Status, registered *bool) error {
	if *registered {
		err := a.cp.Heartbeat(ctx, st)
		if !errors.Is(err, nodeclient.ErrNotRegistered) {
			return err
		}
		a.log.Warn("control plane has no row for this node (forgotten?): registering again")
		*registered = false
	}
	if err := a.cp.Register(ctx, st); err != nil {
		return fmt.Errorf("register: %w", err)
	}
	*registered = true
	a.log.Info("node registered", "node", a.id, "address", st.Address, "data_address", st.DataAddress)
	return nil
}

// renewIfDue renews the certificate once a third of its life is left: a
// new key is made here, the control plane signs it, and the key and
// certificate files are each replaced atomically (key first: a crash
// between the two leaves a pair `node run` refuses with a clear error,
// never a silent mismatch). The listener and the client take the new one
// at their next handshake.
func (a *nodeAgent) renewIfDue(ctx context.Context, now time.Time) error {
	leaf := a.certs.get().Leaf
	if now.Before(leaf.NotAfter.Add(-leaf.NotAfter.Sub(leaf.NotBefore) / 3)) {
		return nil
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	csr, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{CommonName: "node " + a.id}}, key)
	if err != nil {
		return err
	}
	certPEM, err := a.cp.Renew(ctx, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: csr}))
	if err != nil {
		return err
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return err
	}
	keyPEM := pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})
	c, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return fmt.Errorf("renewed certificate: %w", err)
	}
	if err := checkNodeCert(c.Leaf, a.ca, a.id); err != nil {
		return fmt.Errorf("renewed certificate refused: %w", err)
	}
	if err := nodejoin.WriteFile(filepath.Join(a.dataDir, nodejoin.KeyFile), keyPEM); err != nil {
		return err
	}
	if err := nodejoin.WriteFile(filepath.Join(a.dataDir, nodejoin.CertFile), certPEM); err != nil {
		return err
	}
	a.certs.set(&c)
	// Pooled connections to the control plane still carry the old one.
	a.cp.CloseIdleConnections()
	a.log.Info("node certificate renewed", "node", a.id, "not_after", c.Leaf.NotAfter.Format(time.RFC3339))
	return nil
}
