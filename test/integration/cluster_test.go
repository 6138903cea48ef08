package integration

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/store"
	"github.com/cubicle-dev/cubicle/internal/store/postgres"
	"github.com/cubicle-dev/cubicle/internal/store/postgres/pgtest"
)

// testLAN is a bridge on the host standing for the network between
// machines: every cluster node is a network namespace with one veth on it,
// and the control-plane replicas listen on the bridge's own address.
type testLAN struct {
	t      testing.TB
	bridge string
	prefix netip.Prefix
	gw     netip.Addr
	suffix string
	next   int
}

// freeLANPrefix picks a 10.214.X.0/24 no interface on the host uses.
func freeLANPrefix() netip.Prefix {
	out, _ := exec.Command("ip", "-o", "-4", "addr", "show").Output()
	for i := 0; i < 250; i++ {
		x := (os.Getpid() + i) % 250
		if !strings.Contains(string(out), fmt.Sprintf(" 10.214.%d.", x)) {
			return netip.MustParsePrefix(fmt.Sprintf("10.214.%d.0/24", x))
		}
	}
	return netip.MustParsePrefix(fmt.Sprintf("10.214.%d.0/24", os.Getpid()%250))
}

func mustIP(t testing.TB, args ...string) {
	t.Helper()
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
	}
}

func newTestLAN(t testing.TB) *testLAN {
	t.Helper()
	b := make([]byte, 3)
	rand.Read(b)
	l := &testLAN{t: t, suffix: hex.EncodeToString(b), prefix: freeLANPrefix()}
	l.bridge = "cbl" + l.suffix
	l.gw = l.prefix.Addr().Next()
	t.Cleanup(func() { exec.Command("ip", "link", "del", l.bridge).Run() })
	mustIP(t, "link", "add", l.bridge, "type", "bridge")
	mustIP(t, "addr", "add", netip.PrefixFrom(l.gw, 24).String(), "dev", l.bridge)
	mustIP(t, "link", "set", l.bridge, "up")
	return l
}

// machine makes a network namespace with one interface (eth0) on the LAN
// and returns its name and address. The namespace, and with it the veth,
// goes at clean-up.
func (l *testLAN) machine(name string) (string, netip.Addr) {
	t := l.t
	t.Helper()
	l.next++
	ns := "cbm" + l.suffix + name
	host := fmt.Sprintf("cbh%s%d", l.suffix, l.next)
	addr := l.gw
	for range 9 + l.next {
		addr = addr.Next()
	}
	t.Cleanup(func() { exec.Command("ip", "netns", "del", ns).Run() })
	mustIP(t, "netns", "add", ns)
	mustIP(t, "link", "add", host, "type", "veth", "peer", "name", "eth0", "netns", ns)
	mustIP(t, "link", "set", host, "master", l.bridge)
	mustIP(t, "link", "set", host, "up")
	mustIP(t, "-n", ns, "addr", "add", netip.PrefixFrom(addr, 24).String(), "dev", "eth0")
	mustIP(t, "-n", ns, "link", "set", "eth0", "up")
	mustIP(t, "-n", ns, "link", "set", "lo", "up")
	mustIP(t, "-n", ns, "route", "add", "default", "via", l.gw.String())
	return ns, addr
}

// cluster is a throwaway PostgreSQL, control-plane replicas (`cubicle serve
// --store postgres://… --embedded-node=false`) and nodes (`cubicle node
// run`), each node in its own network namespace on a testLAN, as separate
// machines would be.
type cluster struct {
	t        *testing.T
	dsn      string
	st       *postgres.Store
	lan      *testLAN
	secrets  string // the secrets key every replica shares
	cp       string // https URL nodes join and call: the load balancer's
	lb       *tcpBalancer
	replicas []*server
	nodes    []*clusterNode
}

// clusterNode is one `cubicle node run` in its own namespace. It reuses
// the server struct for its data dir, cgroup parent and leak checks.
type clusterNode struct {
	*server
	ID     string
	NS     string
	Addr   netip.Addr
	labels []string
}

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
	ctx := context.Background()
	c := &cluster{t: t, lan: o.lan}
	if c.lan == nil {
		c.lan = newTestLAN(t)
	}
	var err error
	if c.dsn, err = pgtest.StartT(t).NewDatabase(ctx); err != nil {
		t.Fatal(err)
	}
	keyDir := t.TempDir()
	c.secrets = filepath.Join(keyDir, "secrets.key")
	// Nodes first: clean-ups run last-registered first, so the replicas'
	// (which kill every sandbox through the API) run before the nodes go.
	for i := range nodes {
		n := c.newNode(fmt.Sprintf("node-%c", 'a'+i))
		n.args = append(n.args, o.node[i]...)
		n.labels = o.labels[i]
		n.env = o.nodeEnv
		if o.nodeConfig != nil {
			cfg := filepath.Join(n.DataDir, "node.toml")
			if err := os.WriteFile(cfg, []byte(o.nodeConfig(n.DataDir)), 0o644); err != nil {
				t.Fatal(err)
			}
			n.args = append(n.args, "--node-config", cfg)
		}
		c.nodes = append(c.nodes, n)
	}
	var backends []string
	for range replicas {
		tlsAddr := freeListenAddr(t) // the LAN reaches it through the balancer
		args := append([]string{"--store", c.dsn, "--embedded-node=false", "--tls-self-signed", "--domain", clusterDomain,
			"--listen-tls", tlsAddr, "--secrets-key", c.secrets, "--buildkitd", "off"}, o.replica...)
		s := newServer(t, o.replicaEnv, args...)
		s.start()
		c.replicas = append(c.replicas, s)
		backends = append(backends, tlsAddr)
	}
	// Nodes reach the control plane through a TCP balancer (TLS passes
	// through), as behind any load balancer: a dead replica is skipped.
	c.lb = startBalancer(t, c.lan.gw.String()+":0", backends)
	c.cp = "https://" + c.lb.addr
	if c.st, err = postgres.Open(ctx, c.dsn); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.st.Close() })
	for _, n := range c.nodes {
		c.join(n)
		c.startNode(n)
	}
	for _, n := range c.nodes {
		c.waitNode(n, func(r *store.Node) bool { return r.Address != "" })
	}
	return c
}

// newNode prepares a node: its namespace, data dir and clean-up.
func (c *cluster) newNode(id string) *clusterNode {
	t := c.t
	ns, addr := c.lan.machine(id)
	data, err := os.MkdirTemp("/var/tmp", "cubicle-it-node-")
	if err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 3)
	rand.Read(b)
	sfx := hex.EncodeToString(b)
	n := &clusterNode{ID: id, NS: ns, Addr: addr, server: &server{t: t, DataDir: data, Bridge: "cbk" + sfx, Cgroup: "cubicle-it-k" + sfx, seen: map[string]bool{}}}
	n.args = []string{"node", "run", "--data-dir", data, "--listen", addr.String() + ":7443", "--data-listen", addr.String() + ":7444",
		"--images-dir", imagesDir(t), "--bridge", n.Bridge, "--pool", freePool(), "--cgroup-parent", n.Cgroup,
		"--agent-bin", filepath.Join(binDir, "cubicle-agent"), "--lxcfs=false", "--host-firewall", "off"}
	t.Cleanup(func() {
		c.stopNode(n, syscall.SIGTERM)
		leaks := n.sandboxLeftovers()
		n.forceClean()
		unmountUnder(n.DataDir)
		unmountUnder(filepath.Join("/run/cubicle", n.Bridge))
		os.RemoveAll(filepath.Join("/run/cubicle", n.Bridge))
		os.RemoveAll(n.DataDir)
		if len(leaks) > 0 {
			t.Errorf("node %s left sandboxes behind:\n  %s", id, strings.Join(leaks, "\n  "))
		}
		if t.Failed() && n.logs != nil {
			t.Logf("node %s logs:\n%s", id, n.logs)
		}
	})
	return n
}

// join runs `cubicle node join` in the node's network namespace with a
// fresh token.
func (c *cluster) join(n *clusterNode) {
	t := c.t
	t.Helper()
	args := []string{"node", "token", "create", "--store", c.dsn, "--secrets-key", c.secrets, "--label", "zone=" + n.ID}
	for _, l := range n.labels {
		args = append(args, "--label", l)
	}
	out, err := cubicleCLI(args...)
	if err != nil {
		t.Fatalf("token create: %v\n%s", err, out)
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
	cmd := exec.Command("nsenter", "--net=/run/netns/"+n.NS, filepath.Join(binDir, "cubicle"), "node", "join", "--control-plane", c.cp,
		"--token", tok, "--ca-pin", pin, "--node-id", n.ID, "--data-dir", n.DataDir, "--address", n.Addr.String())
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("join %s: %v\n%s", n.ID, err, out)
	}
}

// startNode starts (or restarts) `cubicle node run` in the node's namespace.
func (c *cluster) startNode(n *clusterNode) {
	n.logs = &bytes.Buffer{}
	// nsenter enters the network namespace only: `ip netns exec` would
	// also mount a fresh /sys, hiding the cgroup hierarchies from runc.
	n.cmd = exec.Command("nsenter", append([]string{"--net=/run/netns/" + n.NS, filepath.Join(binDir, "cubicle")}, n.args...)...)
	n.cmd.Env = append(os.Environ(), n.env...)
	n.cmd.Stdout, n.cmd.Stderr = n.logs, n.logs
	if err := n.cmd.Start(); err != nil {
		c.t.Fatal(err)
	}
}

func (c *cluster) stopNode(n *clusterNode, sig syscall.Signal) {
	if n.cmd == nil || n.cmd.Process == nil {
		return
	}
	n.cmd.Process.Signal(sig)
	done := make(chan struct{})
	go func() { n.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		n.cmd.Process.Kill()
		<-done
	}
	n.cmd = nil
}

// waitNode waits (bounded) until the node's registry row satisfies ok.
func (c *cluster) waitNode(n *clusterNode, ok func(*store.Node) bool) {
	c.t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		if r, err := c.st.GetNode(context.Background(), n.ID); err == nil && ok(r) {
			return
		}
		if n.cmd != nil && n.cmd.ProcessState != nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	c.t.Fatalf("node %s: registry row never as wanted; logs:\n%s", n.ID, n.logs)
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

// tcpBalancer passes TCP connections to the first backend that answers,
// starting from the next one each time (round robin with failover).
type tcpBalancer struct {
	addr     string
	backends []string
	next     atomic.Int64
}

func startBalancer(t *testing.T, listen string, backends []string) *tcpBalancer {
	t.Helper()
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		t.Fatal(err)
	}
	b := &tcpBalancer{addr: ln.Addr().String(), backends: backends}
	var wg sync.WaitGroup
	var mu sync.Mutex
	conns := map[net.Conn]bool{}
	track := func(c net.Conn, on bool) {
		mu.Lock()
		defer mu.Unlock()
		if on {
			conns[c] = true
		} else {
			delete(conns, c)
		}
	}
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer in.Close()
				start := int(b.next.Add(1))
				var out net.Conn
				for i := range b.backends {
					if out, err = net.DialTimeout("tcp", b.backends[(start+i)%len(b.backends)], 2*time.Second); err == nil {
						break
					}
				}
				if out == nil {
					return
				}
				defer out.Close()
				track(in, true)
				track(out, true)
				defer track(in, false)
				defer track(out, false)
				done := make(chan struct{}, 2)
				go func() { io.Copy(out, in); out.(*net.TCPConn).CloseWrite(); done <- struct{}{} }()
				go func() { io.Copy(in, out); in.(*net.TCPConn).CloseWrite(); done <- struct{}{} }()
				<-done
				<-done
			}()
		}
	}()
	return b
}
