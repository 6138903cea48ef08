// Package testcluster starts a throwaway Cubicle cluster on this machine
// for tests, benchmarks and the SDK suites: a PostgreSQL (pgtest) unless
// given one, control-plane replicas (`cubicle serve --store postgres://…
// --embedded-node=false`) sharing one secrets key, and nodes (`cubicle
// node join`, then `cubicle node run`), each with its own data dir,
// bridge, pool, nft tables and cgroup parent: on loopback, or each in its
// own network namespace on a LAN bridge, reaching the replicas through a
// TCP balancer as separate machines would.
//
// Stop removes everything by PID and by name and returns what the
// sandboxes or the clean-up left on the host; StartTB fails the test on
// it.
package testcluster

import (
	"context"
	"fmt"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/store"
	"github.com/cubicle-dev/cubicle/internal/store/postgres"
	"github.com/cubicle-dev/cubicle/internal/store/postgres/pgtest"
)

// Names are the prefixes of what the nodes own on the host, so that
// suites running at once (and their leftovers) stay apart.
type Names struct {
	Dir    string // data dirs under /var/tmp: Dir + random
	Bridge string // Bridge + 6 hex digits (at most 9 characters in all)
	Cgroup string
	Pool   string // two octets: pools are Pool.X.0/24
}

// Options say what differs between the clusters.
type Options struct {
	// Bin and AgentBin are the cubicle and cubicle-agent binaries;
	// ImagesDir holds base/rootfs.
	Bin, AgentBin, ImagesDir string
	Replicas, Nodes          int
	// DSN is the database; "" starts a PostgreSQL that Stop removes.
	DSN string
	// Netns puts each node in its own network namespace on LAN (one is
	// made, and removed by Stop, when LAN is nil; a LAN given is the
	// caller's), reaching the replicas through a balancer on the LAN's
	// gateway. Otherwise nodes listen on loopback and, with one replica,
	// join it directly.
	Netns bool
	LAN   *LAN
	// Domain is the replicas' --domain (default cubicle.test).
	Domain string
	// Runtime, when set, is passed to every node as --runtime.
	Runtime string
	LXCFS   bool
	// ReplicaArgs go to every replica, NodeArgs to every node and
	// PerNode[i] to the i-th; the Env lists are added to the
	// environments of replicas and nodes.
	ReplicaArgs, ReplicaEnv []string
	NodeArgs, NodeEnv       []string
	PerNode                 map[int][]string
	// NodeConfig, when set, writes each node's --node-config TOML given
	// its data dir.
	NodeConfig func(dataDir string) string
	// Labels[i] are node i's join-token labels besides zone=<node ID>.
	Labels map[int][]string
	// NodeID names node i (default node-<i+1>).
	NodeID func(i int) string
	Names  Names
	// LogDir holds every process's log (<name>.log). Required.
	LogDir string
	// ReadyTimeout bounds the wait for each node's registration (default
	// 60 s).
	ReadyTimeout time.Duration
	// Pdeathsig has every child SIGKILLed when the thread that started it
	// dies: for a command whose clean-up may never run. Tests leave it
	// off (a test goroutine that locked its thread ends the thread).
	Pdeathsig bool
	// Replica, when set, starts replica i itself (a test harness's own
	// server type) with args (the store, --embedded-node=false,
	// --secrets-key and ReplicaArgs) and env, and returns the host:port
	// on which it serves the join and node calls over TLS. When nil a
	// replica is `cubicle serve` with its own data dir, --tls-self-signed,
	// plain HTTP on --listen (Replica.URL) and TLS on --listen-tls.
	Replica func(i int, args, env []string) (joinAddr string, err error)
}

// Replica is a control-plane replica started by the default starter.
type Replica struct {
	Proc    *Proc
	DataDir string
	URL     string // plain HTTP API
	TLSAddr string // joins and node calls
}

// Node is one `cubicle node run`.
type Node struct {
	*Host
	ID      string
	NS      string     // its network namespace, "" on loopback
	Addr    netip.Addr // its address (127.0.0.1 on loopback)
	Args    []string   // `node run` and its flags
	Env     []string
	Labels  []string // join-token labels besides zone=<ID>
	Proc    *Proc    // nil until started, and after Stop
	started bool
	c       *Cluster
}

// Cluster is what New made and Start started.
type Cluster struct {
	o        Options
	DSN      string
	Store    *postgres.Store
	LAN      *LAN
	Balancer *Balancer // nil when nodes join the one replica directly
	// ControlPlane is the https URL nodes join and call.
	ControlPlane string
	// SecretsKey is the key file every replica and token create share.
	SecretsKey string
	Replicas   []*Replica // only those the default starter made
	Nodes      []*Node
	ctx        context.Context // Start's
	pg         *pgtest.Server
	ownLAN     bool
	keyDir     string
	mu         sync.Mutex
	procs      []*Proc
}

// New checks the options; it starts nothing.
func New(o Options) (*Cluster, error) {
	if o.Replicas < 1 || o.Nodes < 1 {
		return nil, fmt.Errorf("testcluster: %d replicas, %d nodes: want at least one of each", o.Replicas, o.Nodes)
	}
	if o.Bin == "" || o.AgentBin == "" || o.ImagesDir == "" || o.LogDir == "" {
		return nil, fmt.Errorf("testcluster: Bin, AgentBin, ImagesDir and LogDir are required")
	}
	if o.Names == (Names{}) {
		o.Names = Names{Dir: "cubicle-testcluster-node-", Bridge: "cbk", Cgroup: "cubicle-tc-", Pool: "10.215"}
	}
	if o.Domain == "" {
		o.Domain = "cubicle.test"
	}
	if o.NodeID == nil {
		o.NodeID = func(i int) string { return fmt.Sprintf("node-%d", i+1) }
	}
	if o.ReadyTimeout == 0 {
		o.ReadyTimeout = 60 * time.Second
	}
	return &Cluster{o: o}, nil
}

// Start starts PostgreSQL (unless given), the replicas and the nodes, and
// waits until every node is registered. On an error, Stop still removes
// what was made.
func (c *Cluster) Start(ctx context.Context) error {
	o := c.o
	c.ctx = ctx
	var err error
	if c.DSN = o.DSN; c.DSN == "" {
		if c.pg, err = pgtest.Start(); err != nil {
			return err
		}
		if c.DSN, err = c.pg.NewDatabase(ctx); err != nil {
			return err
		}
	}
	if c.keyDir, err = os.MkdirTemp("", "cubicle-testcluster-key-"); err != nil {
		return err
	}
	c.SecretsKey = filepath.Join(c.keyDir, "secrets.key")
	if o.Netns {
		if c.LAN = o.LAN; c.LAN == nil {
			if c.LAN, err = NewLAN(); err != nil {
				return err
			}
			c.ownLAN = true
		}
	}
	// The nodes' dirs first, so that Stop cleans them up whatever fails.
	for i := range o.Nodes {
		if err := c.newNode(i); err != nil {
			return err
		}
	}
	var backends []string
	for i := range o.Replicas {
		args := append([]string{"--store", c.DSN, "--embedded-node=false", "--secrets-key", c.SecretsKey}, o.ReplicaArgs...)
		start := o.Replica
		if start == nil {
			start = c.startReplica
		}
		addr, err := start(i, args, o.ReplicaEnv)
		if err != nil {
			return fmt.Errorf("replica %d: %w", i, err)
		}
		backends = append(backends, addr)
	}
	switch {
	case o.Netns:
		c.Balancer, err = StartBalancer(c.LAN.Gateway.String()+":0", backends)
	case len(backends) > 1:
		c.Balancer, err = StartBalancer("127.0.0.1:0", backends)
	}
	if err != nil {
		return err
	}
	c.ControlPlane = "https://" + backends[0]
	if c.Balancer != nil {
		c.ControlPlane = "https://" + c.Balancer.Addr
	}
	if c.Store, err = postgres.Open(ctx, c.DSN); err != nil {
		return err
	}
	for _, n := range c.Nodes {
		if err := c.Join(n); err != nil {
			return err
		}
		if err := n.Start(); err != nil {
			return err
		}
	}
	for _, n := range c.Nodes {
		if err := c.waitRegistered(ctx, n); err != nil {
			return err
		}
	}
	return nil
}

func (c *Cluster) spawn(name string, argv, env []string) (*Proc, error) {
	p, err := Spawn(name, argv, env, filepath.Join(c.o.LogDir, name+".log"), c.o.Pdeathsig)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	c.procs = append(c.procs, p)
	c.mu.Unlock()
	return p, nil
}

// startReplica is the default replica: `cubicle serve` with a data dir of
// its own, healthy within 60 s.
func (c *Cluster) startReplica(i int, args, env []string) (string, error) {
	r := &Replica{}
	var err error
	if r.DataDir, err = os.MkdirTemp("/var/tmp", "cubicle-testcluster-cp-"); err != nil {
		return "", err
	}
	c.Replicas = append(c.Replicas, r)
	var listen, metrics string
	for _, a := range []*string{&listen, &r.TLSAddr, &metrics} {
		if *a, err = FreeListenAddr(); err != nil {
			return "", err
		}
	}
	r.URL = "http://" + listen
	name := "control-plane"
	if i > 0 {
		name = fmt.Sprintf("control-plane-%d", i+1)
	}
	argv := append([]string{c.o.Bin, "serve", "--data-dir", r.DataDir, "--tls-self-signed", "--domain", c.o.Domain,
		"--listen", listen, "--listen-tls", r.TLSAddr, "--metrics-listen", metrics, "--images-dir", c.o.ImagesDir}, args...)
	if r.Proc, err = c.spawn(name, argv, env); err != nil {
		return "", err
	}
	hc := &http.Client{Timeout: time.Second}
	deadline := time.Now().Add(60 * time.Second)
	for {
		if resp, err := hc.Get(r.URL + "/health"); err == nil {
			resp.Body.Close()
			if resp.StatusCode/100 == 2 {
				return r.TLSAddr, nil
			}
		}
		if r.Proc.Dead() {
			return "", fmt.Errorf("%s exited before it was healthy:\n%s", name, r.Proc.Tail())
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("%s not healthy after 60s:\n%s", name, r.Proc.Tail())
		}
		select {
		case <-c.ctx.Done():
			return "", fmt.Errorf("stopped (%v) while waiting for %s", context.Cause(c.ctx), name)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func (c *Cluster) newNode(i int) error {
	o := c.o
	id := o.NodeID(i)
	h, err := NewHost(id, o.Names.Dir, o.Names.Bridge, o.Names.Cgroup)
	if err != nil {
		return err
	}
	n := &Node{Host: h, ID: id, Env: o.NodeEnv, Labels: o.Labels[i], c: c, Addr: netip.MustParseAddr("127.0.0.1")}
	c.Nodes = append(c.Nodes, n)
	var listen, dataListen string
	if o.Netns {
		if n.NS, n.Addr, err = c.LAN.Machine(id); err != nil {
			return err
		}
		listen, dataListen = n.Addr.String()+":7443", n.Addr.String()+":7444"
	} else {
		if listen, err = FreeListenAddr(); err != nil {
			return err
		}
		if dataListen, err = FreeListenAddr(); err != nil {
			return err
		}
	}
	pool, err := FreePool(o.Names.Pool)
	if err != nil {
		return err
	}
	n.Args = []string{"node", "run", "--data-dir", h.DataDir, "--listen", listen, "--data-listen", dataListen,
		"--images-dir", o.ImagesDir, "--bridge", h.Bridge, "--pool", pool, "--cgroup-parent", h.Cgroup,
		"--agent-bin", o.AgentBin, "--lxcfs=" + strconv.FormatBool(o.LXCFS)}
	if o.Runtime != "" {
		n.Args = append(n.Args, "--runtime", o.Runtime)
	}
	n.Args = append(append(n.Args, o.NodeArgs...), o.PerNode[i]...)
	if o.NodeConfig != nil {
		cfg := filepath.Join(h.DataDir, "node.toml")
		if err := os.WriteFile(cfg, []byte(o.NodeConfig(h.DataDir)), 0o644); err != nil {
			return err
		}
		n.Args = append(n.Args, "--node-config", cfg)
	}
	return nil
}

// argv is cmd run on node n: in its namespace when it has one (nsenter
// enters the network namespace only: `ip netns exec` would also mount a
// fresh /sys, hiding the cgroup hierarchies from runc).
func (n *Node) argv(args ...string) []string {
	argv := append([]string{n.c.o.Bin}, args...)
	if n.NS != "" {
		argv = append([]string{"nsenter", "--net=/run/netns/" + n.NS}, argv...)
	}
	return argv
}

// Join has node n join the cluster with a fresh token (labelled
// zone=<node ID> and n.Labels), from its namespace.
func (c *Cluster) Join(n *Node) error {
	args := []string{"node", "token", "create", "--store", c.DSN, "--secrets-key", c.SecretsKey, "--label", "zone=" + n.ID}
	for _, l := range n.Labels {
		args = append(args, "--label", l)
	}
	out, err := c.CLI(args...)
	if err != nil {
		return err
	}
	var tok, pin string
	for _, l := range strings.Split(out, "\n") {
		if v, ok := strings.CutPrefix(l, "token: "); ok {
			tok = v
		}
		if v, ok := strings.CutPrefix(l, "ca-pin: "); ok {
			pin = v
		}
	}
	if tok == "" || pin == "" {
		return fmt.Errorf("node token create printed no token or ca-pin:\n%s", out)
	}
	argv := n.argv("node", "join", "--control-plane", c.ControlPlane, "--token", tok, "--ca-pin", pin,
		"--node-id", n.ID, "--data-dir", n.DataDir, "--address", n.Addr.String())
	if out, err := execCombined(argv); err != nil {
		return fmt.Errorf("join %s: %v\n%s", n.ID, err, out)
	}
	return nil
}

// CLI runs the cubicle binary (on the host) and returns its combined
// output; the error holds the output too.
func (c *Cluster) CLI(args ...string) (string, error) {
	out, err := execCombined(append([]string{c.o.Bin}, args...))
	if err != nil {
		return out, fmt.Errorf("cubicle %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out, nil
}

// Start starts (or restarts) the node's `cubicle node run`; its log is
// appended to.
func (n *Node) Start() error {
	p, err := n.c.spawn(n.ID, n.argv(n.Args...), n.Env)
	if err != nil {
		return err
	}
	n.Proc, n.started = p, true
	return nil
}

// Stop sends sig to the node and SIGKILL after 20 s, and waits for it.
// SIGTERM leaves its sandboxes running for re-adoption.
func (n *Node) Stop(sig syscall.Signal) {
	if n.Proc == nil {
		return
	}
	n.Proc.Signal(sig, 20*time.Second)
	n.Proc = nil
}

// Log is the node's log so far.
func (n *Node) Log() string {
	b, _ := os.ReadFile(filepath.Join(n.c.o.LogDir, n.ID+".log"))
	return string(b)
}

// waitRegistered waits until n's registry row has its address: the
// scheduler offers it.
func (c *Cluster) waitRegistered(ctx context.Context, n *Node) error {
	return c.WaitNode(ctx, n, c.o.ReadyTimeout, func(r *store.Node) bool { return r.Address != "" })
}

// WaitNode polls n's registry row every 100 ms until ok holds; it fails
// when n's process (if running) exits, ctx ends or timeout passes.
func (c *Cluster) WaitNode(ctx context.Context, n *Node, timeout time.Duration, ok func(*store.Node) bool) error {
	deadline := time.Now().Add(timeout)
	for {
		if r, err := c.Store.GetNode(ctx, n.ID); err == nil && ok(r) {
			return nil
		}
		if n.Proc != nil && n.Proc.Dead() {
			return fmt.Errorf("node %s exited while waiting for its registry row:\n%s", n.ID, n.Log())
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("node %s: registry row not as wanted after %v:\n%s", n.ID, timeout, n.Log())
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("stopped (%v) while waiting for node %s", context.Cause(ctx), n.ID)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// Stop ends every process it started, all at once (nodes leave sandboxes
// running for re-adoption on SIGTERM: the caller killed them through the
// API before), lists what the sandboxes left on each node, removes
// everything and lists what survived that.
func (c *Cluster) Stop() []string {
	c.mu.Lock()
	procs := c.procs
	c.mu.Unlock()
	var wg sync.WaitGroup
	for _, p := range procs {
		wg.Go(func() { p.Term(20 * time.Second) })
	}
	wg.Wait()
	var leaks []string
	for _, n := range c.Nodes {
		if n.started {
			leaks = append(leaks, n.SandboxLeftovers()...)
		}
		leaks = append(leaks, n.Clean()...)
	}
	for _, r := range c.Replicas {
		UnmountUnder(r.DataDir)
		os.RemoveAll(r.DataDir)
		if _, err := os.Stat(r.DataDir); err == nil {
			leaks = append(leaks, "control plane: dir "+r.DataDir)
		}
	}
	if c.Balancer != nil {
		c.Balancer.Close()
	}
	if c.Store != nil {
		c.Store.Close()
	}
	if c.ownLAN {
		c.LAN.Close()
	}
	if c.pg != nil {
		c.pg.Stop()
	}
	if c.keyDir != "" {
		os.RemoveAll(c.keyDir)
	}
	return leaks
}

// StartTB starts a cluster for a test or benchmark: its logs in a temp
// dir, Stop at clean-up (registered before any replica starts, so a
// harness's own replica clean-up, which kills the sandboxes through the
// API, runs first), failing tb on whatever it left, with every log when
// tb failed.
func StartTB(tb testing.TB, o Options) *Cluster {
	tb.Helper()
	if o.LogDir == "" {
		o.LogDir = tb.TempDir()
	}
	c, err := New(o)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		leaks := c.Stop()
		if len(leaks) > 0 {
			tb.Errorf("the cluster left host state behind:\n  %s", strings.Join(leaks, "\n  "))
		}
		if tb.Failed() {
			ents, _ := os.ReadDir(o.LogDir)
			for _, e := range ents {
				b, _ := os.ReadFile(filepath.Join(o.LogDir, e.Name()))
				tb.Logf("%s:\n%s", e.Name(), b)
			}
		}
	})
	if err := c.Start(context.Background()); err != nil {
		tb.Fatal(err)
	}
	return c
}
