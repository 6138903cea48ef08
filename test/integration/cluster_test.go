package integration

import (
	"context"
	"fmt"
	"net/netip"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/store"
	"github.com/cubicle-dev/cubicle/internal/store/postgres"
	"github.com/cubicle-dev/cubicle/internal/store/postgres/pgtest"
	"github.com/cubicle-dev/cubicle/internal/testenv/testcluster"
)

// testLAN is a bridge on the host standing for the network between
// machines (testcluster.LAN): every cluster node is a network namespace
// with one veth on it, and the control-plane replicas listen on the
// bridge's own address.
type testLAN struct {
	*testcluster.LAN
	bridge string
	gw     netip.Addr
	suffix string
}

func mustIP(t testing.TB, args ...string) {
	t.Helper()
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
	}
}

func newTestLAN(t testing.TB) *testLAN {
	t.Helper()
	l, err := testcluster.NewLAN()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.Close)
	return &testLAN{LAN: l, bridge: l.Bridge, gw: l.Gateway, suffix: l.Suffix}
}

// cluster is a throwaway PostgreSQL, control-plane replicas (`cubicle serve
// --store postgres://… --embedded-node=false`, this harness's servers) and
// nodes (`cubicle node run`), each node in its own network namespace on a
// testLAN, as separate machines would be: testcluster starts it.
type cluster struct {
	t        *testing.T
	tc       *testcluster.Cluster
	dsn      string
	st       *postgres.Store
	lan      *testLAN
	secrets  string // the secrets key every replica shares
	cp       string // https URL nodes join and call: the load balancer's
	lb       *tcpBalancer
	replicas []*server
	nodes    []*clusterNode
}

// clusterNode is one `cubicle node run` in its own namespace.
type clusterNode struct {
	*testcluster.Node
	// logs prints (%s) as the node's log so far.
	logs nodeLog
}

type nodeLog struct{ n *testcluster.Node }

func (l nodeLog) String() string { return l.n.Log() }

const clusterDomain = "cubicle.test"

// clusterOptions are extra arguments: replica's go to every replica,
// node[i] to the i-th node.
type clusterOptions struct {
	replica []string
	node    map[int][]string
	// lan, when set, is the LAN to use (made first by a caller that
	// needs its address); env is added to every node's and replica's.
	lan        *testLAN
	replicaEnv []string
	nodeEnv    []string
	// nodeConfig, when set, writes node i's --node-config TOML given its
	// data dir.
	nodeConfig func(dataDir string) string
	// labels[i] are node i's join-token labels besides zone=<node ID>.
	labels map[int][]string
}

// startCluster starts replicas control-plane replicas and nodes nodes.
func startCluster(t *testing.T, replicas, nodes int, o clusterOptions) *cluster {
	t.Helper()
	c := &cluster{t: t, lan: o.lan}
	if c.lan == nil {
		c.lan = newTestLAN(t)
	}
	var err error
	if c.dsn, err = pgtest.StartT(t).NewDatabase(context.Background()); err != nil {
		t.Fatal(err)
	}
	c.tc = testcluster.StartTB(t, testcluster.Options{
		Bin: filepath.Join(binDir, "cubicle"), AgentBin: filepath.Join(binDir, "cubicle-agent"), ImagesDir: imagesDir(t),
		Replicas: replicas, Nodes: nodes, DSN: c.dsn, Netns: true, LAN: c.lan.LAN, Domain: clusterDomain,
		ReplicaArgs: append([]string{"--buildkitd", "off"}, o.replica...), ReplicaEnv: o.replicaEnv,
		NodeArgs: []string{"--host-firewall", "off"}, PerNode: o.node, NodeEnv: o.nodeEnv, NodeConfig: o.nodeConfig, Labels: o.labels,
		NodeID: func(i int) string { return fmt.Sprintf("node-%c", 'a'+i) },
		Names:  testcluster.Names{Dir: "cubicle-it-node-", Bridge: "cbk", Cgroup: "cubicle-it-k", Pool: "10.213"},
		// Replicas are this harness's servers (their clean-up kills every
		// sandbox through the API before the nodes stop).
		Replica: func(_ int, args, env []string) (string, error) {
			tlsAddr := freeListenAddr(t) // the LAN reaches it through the balancer
			s := newServer(t, env, append([]string{"--tls-self-signed", "--domain", clusterDomain, "--listen-tls", tlsAddr}, args...)...)
			s.start()
			c.replicas = append(c.replicas, s)
			return tlsAddr, nil
		},
	})
	c.st, c.secrets, c.cp = c.tc.Store, c.tc.SecretsKey, c.tc.ControlPlane
	c.lb = &tcpBalancer{Balancer: c.tc.Balancer, addr: c.tc.Balancer.Addr}
	for _, n := range c.tc.Nodes {
		c.nodes = append(c.nodes, &clusterNode{Node: n, logs: nodeLog{n}})
	}
	// testcluster waited for this; the row is what every subtest relies on.
	for _, n := range c.nodes {
		c.waitNode(n, func(r *store.Node) bool { return r.Address != "" })
	}
	return c
}

// startNode starts (or restarts) `cubicle node run` in the node's namespace.
func (c *cluster) startNode(n *clusterNode) {
	c.t.Helper()
	if err := n.Start(); err != nil {
		c.t.Fatalf("start node %s: %v; its log so far:\n%s", n.ID, err, n.logs)
	}
}

func (c *cluster) stopNode(n *clusterNode, sig syscall.Signal) { n.Stop(sig) }

// waitNode waits (bounded) until the node's registry row satisfies ok.
func (c *cluster) waitNode(n *clusterNode, ok func(*store.Node) bool) {
	c.t.Helper()
	if err := c.tc.WaitNode(context.Background(), n.Node, 60*time.Second, ok); err != nil {
		c.t.Fatal(err)
	}
}

// row is a sandbox's row in the cluster's store.
func (c *cluster) row(id string) *store.Sandbox {
	c.t.Helper()
	sb, err := c.st.GetSandbox(context.Background(), id)
	if err != nil {
		c.t.Fatalf("sandbox %s: %v", id, err)
	}
	return sb
}

// waitState waits (bounded) until sandbox id is in state want.
func (c *cluster) waitState(id string, want store.SandboxState, max time.Duration) {
	c.t.Helper()
	deadline := time.Now().Add(max)
	var last store.SandboxState
	for time.Now().Before(deadline) {
		if sb, err := c.st.GetSandbox(context.Background(), id); err == nil {
			if last = sb.State; last == want {
				return
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	c.t.Fatalf("sandbox %s: state %s after %s, want %s", id, last, max, want)
}

// kill9 SIGKILLs a replica (sandboxes stay, as on a crash).
func kill9(s *server) {
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	s.cmd.Process.Signal(syscall.SIGKILL)
	s.cmd.Wait()
	s.cmd = nil
}

// cubicleCLI runs the cubicle binary and returns its combined output.
func cubicleCLI(args ...string) (string, error) {
	out, err := exec.Command(filepath.Join(binDir, "cubicle"), args...).CombinedOutput()
	return string(out), err
}

// memTotalMiB is the host's memory as a node reports it (sysinfo).
func memTotalMiB(t *testing.T) int64 {
	var si syscall.Sysinfo_t
	if err := syscall.Sysinfo(&si); err != nil {
		t.Fatal(err)
	}
	return int64(si.Totalram) * int64(si.Unit) >> 20
}

// tcpBalancer is a testcluster.Balancer: round robin with failover.
type tcpBalancer struct {
	*testcluster.Balancer
	addr string
}

func startBalancer(t *testing.T, listen string, backends []string) *tcpBalancer {
	t.Helper()
	b, err := testcluster.StartBalancer(listen, backends)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	return &tcpBalancer{Balancer: b, addr: b.Addr}
}
