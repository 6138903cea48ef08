// Command cubicle-testcluster starts a throwaway Cubicle cluster on this
// machine for the SDK suites (test/e2b-js, test/e2b-py with CUBICLE_CLUSTER=1):
// a PostgreSQL in a temp dir (internal/store/postgres/pgtest), a pure control
// plane (`cubicle serve --store postgres://… --embedded-node=false
// --tls-self-signed`, plain HTTP on --listen for the SDKs, TLS on
// --listen-tls for the nodes) and N joined `cubicle node run` on loopback,
// each with its own data dir, bridge, pool, nft table and cgroup parent.
//
// Once every node has registered it prints one JSON line on stdout (the
// control plane's URL, an API key, the nodes) and waits. It tears everything
// down, by PID and by name, when its stdin closes (the harness exited or
// closed it) or on SIGTERM/SIGINT, then exits 1 naming whatever the
// sandboxes or the clean-up left on the host. The harness kills the
// sandboxes through the API before that, as it does with a single serve.
// internal/testenv/testcluster does the work, as it does for TestCluster
// and bench/cluster.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/cubicle-dev/cubicle/internal/testenv/testcluster"
	"github.com/jackc/pgx/v5"
)

type config struct {
	bin, agent, images, runtime, domain, logDir, caCerts string
	nodes                                                int
	cpuOvercommit                                        float64
	lxcfs                                                bool
	ready                                                time.Duration
}

// Ready is the line printed once the cluster serves.
type Ready struct {
	URL    string      `json:"url"`
	APIKey string      `json:"apiKey"`
	Domain string      `json:"domain"`
	Store  string      `json:"store"`
	Logs   []string    `json:"logs"`
	Nodes  []NodeReady `json:"nodes"`
}

// NodeReady describes one node agent.
type NodeReady struct {
	ID      string `json:"id"`
	DataDir string `json:"dataDir"`
	Bridge  string `json:"bridge"`
}

func main() {
	var c config
	flag.StringVar(&c.bin, "cubicle", "", "the cubicle binary (default: next to this one)")
	flag.StringVar(&c.agent, "agent-bin", "", "the cubicle-agent binary (default: next to this one)")
	flag.StringVar(&c.images, "images-dir", "/var/lib/cubicle/images", "image directory holding base/rootfs")
	flag.StringVar(&c.runtime, "runtime", "runc", "the nodes' OCI runtime: runc or runsc")
	flag.StringVar(&c.domain, "domain", "cubicle.local", "the control plane's --domain")
	flag.StringVar(&c.logDir, "log-dir", "", "where the control plane's and nodes' logs go (default: a temp dir, removed at exit)")
	flag.StringVar(&c.caCerts, "ca-certificates", "", "passed to every node as --ca-certificates when set")
	flag.IntVar(&c.nodes, "nodes", 2, "how many node agents (1-8)")
	flag.Float64Var(&c.cpuOvercommit, "cpu-overcommit", 16, "the control plane's --cpu-overcommit: the suites create more 2-CPU sandboxes at once than this machine has CPUs")
	flag.BoolVar(&c.lxcfs, "lxcfs", false, "run lxcfs on each node")
	flag.DurationVar(&c.ready, "ready-timeout", 90*time.Second, "how long the cluster may take to serve")
	flag.Parse()
	if flag.NArg() > 0 {
		fatalf("unexpected arguments %q", flag.Args())
	}
	if c.nodes < 1 || c.nodes > 8 {
		fatalf("--nodes %d: want 1-8", c.nodes)
	}
	if c.runtime != "runc" && c.runtime != "runsc" {
		fatalf("--runtime %q: want runc or runsc", c.runtime)
	}
	self, err := os.Executable()
	if err != nil {
		fatalf("%v", err)
	}
	if c.bin == "" {
		c.bin = filepath.Join(filepath.Dir(self), "cubicle")
	}
	if c.agent == "" {
		c.agent = filepath.Join(filepath.Dir(self), "cubicle-agent")
	}
	for _, f := range []string{c.bin, c.agent, filepath.Join(c.images, "base", "rootfs")} {
		if _, err := os.Stat(f); err != nil {
			fatalf("%v", err)
		}
	}

	// When the harness dies its end of our stdout/stderr goes; a write
	// there must not kill us before the clean-up that its death starts.
	signal.Ignore(syscall.SIGPIPE)
	cl := &cluster{cfg: c}
	ctx, cancel := context.WithCancelCause(context.Background())
	// Stop on a signal or on stdin's end, whichever comes first.
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		io.Copy(io.Discard, os.Stdin)
		stop <- syscall.SIGHUP
	}()
	stopped := make(chan struct{})
	go func() {
		s := <-stop
		cancel(fmt.Errorf("signal %v", s))
		close(stopped)
	}()
	began := time.Now()
	ready, err := cl.start(ctx)
	if err == nil {
		line, _ := json.Marshal(ready)
		fmt.Println(string(line))
		fmt.Fprintf(os.Stderr, "cubicle-testcluster: ready in %v\n", time.Since(began).Round(time.Millisecond))
		<-stopped
	}
	stopping := time.Now()
	leaks := cl.stop()
	fmt.Fprintf(os.Stderr, "cubicle-testcluster: stopped in %v\n", time.Since(stopping).Round(time.Millisecond))
	if err != nil {
		fmt.Fprintf(os.Stderr, "cubicle-testcluster: %v\n", err)
	}
	if len(leaks) > 0 {
		fmt.Fprintf(os.Stderr, "cubicle-testcluster: left host state behind:\n  %s\n", strings.Join(leaks, "\n  "))
	}
	if err != nil || len(leaks) > 0 {
		os.Exit(1)
	}
}

func fatalf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "cubicle-testcluster: "+format+"\n", args...)
	os.Exit(2)
}

type cluster struct {
	cfg     config
	tc      *testcluster.Cluster
	logDir  string
	ownLogs bool
	apiKey  string
}

func (cl *cluster) start(ctx context.Context) (*Ready, error) {
	c := cl.cfg
	var err error
	if c.logDir == "" {
		if cl.logDir, err = os.MkdirTemp("", "cubicle-testcluster-logs-"); err != nil {
			return nil, err
		}
		cl.ownLogs = true
	} else {
		cl.logDir = c.logDir
		if err := os.MkdirAll(cl.logDir, 0o755); err != nil {
			return nil, err
		}
	}
	var nodeArgs []string
	if c.caCerts != "" {
		nodeArgs = append(nodeArgs, "--ca-certificates", c.caCerts)
	}
	if cl.tc, err = testcluster.New(testcluster.Options{
		Bin: c.bin, AgentBin: c.agent, ImagesDir: c.images, Runtime: c.runtime, LXCFS: c.lxcfs,
		Replicas: 1, Nodes: c.nodes, Domain: c.domain, NodeArgs: nodeArgs,
		ReplicaArgs: []string{"--cpu-overcommit", strconv.FormatFloat(c.cpuOvercommit, 'f', -1, 64)},
		Names:       testcluster.Names{Dir: "cubicle-testcluster-node-", Bridge: "cbk", Cgroup: "cubicle-tc-", Pool: "10.215"},
		LogDir:      cl.logDir, ReadyTimeout: c.ready, Pdeathsig: true,
	}); err != nil {
		return nil, err
	}
	if err := cl.tc.Start(ctx); err != nil {
		return nil, err
	}
	cp := cl.tc.Replicas[0]
	out, err := cl.tc.CLI("apikey", "create", "--store", cl.tc.DSN, "--data-dir", cp.DataDir, "--name", "sdk-cluster")
	if err != nil {
		return nil, err
	}
	cl.apiKey = strings.TrimSpace(out)
	if !regexp.MustCompile(`^e2b_[0-9a-f]+$`).MatchString(cl.apiKey) {
		return nil, fmt.Errorf("cubicle apikey create printed %q, want e2b_<hex>", cl.apiKey)
	}
	r := &Ready{URL: cp.URL, APIKey: cl.apiKey, Domain: c.domain, Store: cl.tc.DSN, Logs: []string{cp.Proc.Log}}
	for _, n := range cl.tc.Nodes {
		r.Nodes = append(r.Nodes, NodeReady{ID: n.ID, DataDir: n.DataDir, Bridge: n.Bridge})
		r.Logs = append(r.Logs, n.Proc.Log)
	}
	return r, nil
}

// stop ends every process, lists what the sandboxes left on each node,
// removes everything and lists what survived that.
func (cl *cluster) stop() []string {
	var leaks []string
	if cl.tc != nil {
		if cl.tc.DSN != "" {
			cl.reportPlacement()
		}
		leaks = cl.tc.Stop()
	}
	if cl.ownLogs {
		os.RemoveAll(cl.logDir)
	}
	return leaks
}

// reportPlacement prints how many sandboxes each node ran (killed rows
// stay in the store), so a run shows that every node was used.
func (cl *cluster) reportPlacement() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, cl.tc.DSN)
	if err != nil {
		fmt.Fprintf(os.Stderr, "cubicle-testcluster: placement report: %v\n", err)
		return
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, "SELECT node, count(*) FROM sandboxes GROUP BY node ORDER BY node")
	if err != nil {
		fmt.Fprintf(os.Stderr, "cubicle-testcluster: placement report: %v\n", err)
		return
	}
	counts := map[string]int64{}
	for rows.Next() {
		var node string
		var n int64
		if err := rows.Scan(&node, &n); err != nil {
			fmt.Fprintf(os.Stderr, "cubicle-testcluster: placement report: %v\n", err)
			return
		}
		counts[node] = n
	}
	var parts []string
	for _, n := range cl.tc.Nodes {
		parts = append(parts, fmt.Sprintf("%s=%d", n.ID, counts[n.ID]))
		delete(counts, n.ID)
	}
	for id, n := range counts {
		parts = append(parts, fmt.Sprintf("%q=%d", id, n))
	}
	fmt.Fprintf(os.Stderr, "cubicle-testcluster: sandboxes per node: %s\n", strings.Join(parts, " "))
}
