package integration

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

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
// run`), each node in its own network namespace on a testLAN.
type cluster struct {
	t        testing.TB
	pg       *pgtest.Server
	dsn      string
	lan      *testLAN
	domain   string
	secrets  string // the secrets key every replica shares
	replicas []*server
	nodes    []*clusterNode
	cpPort   int
}

// clusterNode is one `cubicle node run` in its own namespace. It reuses the
// server struct for its data dir, cgroup parent and leak checks.
type clusterNode struct {
	*server
	ID   string
	NS   string
	Addr netip.Addr
}

func startPG(t testing.TB) (*pgtest.Server, string) {
	t.Helper()
	pg := pgtest.StartT(t)
	dsn, err := pg.NewDatabase(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return pg, dsn
}

// cubicleCLI runs the cubicle binary and returns its combined output.
func cubicleCLI(args ...string) (string, error) {
	out, err := exec.Command(filepath.Join(binDir, "cubicle"), args...).CombinedOutput()
	return string(out), err
}

// nodeRows reads `cubicle node list -o json` through the store.
func (c *cluster) nodeRows() []map[string]any {
	c.t.Helper()
	out, err := exec.Command(filepath.Join(binDir, "cubicle"), "node", "list", "--store", c.dsn, "--json").Output()
	if err != nil {
		c.t.Fatalf("node list: %v", err)
	}
	var rows []map[string]any
	if err := json.Unmarshal(out, &rows); err != nil {
		c.t.Fatalf("node list: %v: %s", err, out)
	}
	return rows
}

// kill9 SIGKILLs a node or replica process (sandboxes stay, as on a crash).
func kill9(s *server) {
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	s.cmd.Process.Signal(syscall.SIGKILL)
	s.cmd.Wait()
	s.cmd = nil
}

var _, _ = bytes.NewReader, time.Second
