package testcluster

import (
	"bufio"
	"fmt"
	"net"
	"testing"

	"github.com/cubicle-dev/cubicle/internal/testenv"
)

// echo serves one line back, prefixed with name, on a loopback port.
func echo(t *testing.T, name string) string {
	t.Helper()
	return testenv.Serve(t, "tcp", "127.0.0.1:0", func(c net.Conn) {
		line, _ := bufio.NewReader(c).ReadString('\n')
		fmt.Fprintf(c, "%s %s", name, line)
	}).String()
}

// The balancer passes each connection, both ways, to the next backend
// that answers: a dead replica is skipped, the live ones take turns.
func TestBalancerRoundRobinSkipsDead(t *testing.T) {
	dead, err := FreeListenAddr() // nothing listens there
	if err != nil {
		t.Fatal(err)
	}
	b, err := StartBalancer("127.0.0.1:0", []string{echo(t, "a"), dead, echo(t, "b")})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	got := map[string]int{}
	for i := range 6 {
		c, err := net.Dial("tcp", b.Addr)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(c, "hello %d\n", i)
		line, err := bufio.NewReader(c).ReadString('\n')
		c.Close()
		if err != nil {
			t.Fatalf("connection %d: %v", i, err)
		}
		var who string
		var n int
		if _, err := fmt.Sscanf(line, "%s hello %d", &who, &n); err != nil || n != i {
			t.Fatalf("connection %d answered %q", i, line)
		}
		got[who]++
	}
	if got["a"] == 0 || got["b"] == 0 || got["a"]+got["b"] != 6 {
		t.Fatalf("answers per backend %v: want both live backends used, all 6 answered", got)
	}
}

// No loopback address is handed out twice, so two children picked at once
// never race for one port.
func TestFreeListenAddrNeverTwice(t *testing.T) {
	seen := map[string]bool{}
	for range 100 {
		a, err := FreeListenAddr()
		if err != nil {
			t.Fatal(err)
		}
		if seen[a] {
			t.Fatalf("%s handed out twice", a)
		}
		seen[a] = true
	}
}

func TestNewRefusesMissingParts(t *testing.T) {
	good := Options{Bin: "cubicle", AgentBin: "agent", ImagesDir: "images", LogDir: "logs", Replicas: 1, Nodes: 1}
	for name, o := range map[string]Options{
		"no nodes":    func() Options { o := good; o.Nodes = 0; return o }(),
		"no replicas": func() Options { o := good; o.Replicas = 0; return o }(),
		"no log dir":  func() Options { o := good; o.LogDir = ""; return o }(),
	} {
		if _, err := New(o); err == nil {
			t.Errorf("%s: New accepted %+v", name, o)
		}
	}
	if _, err := New(good); err != nil {
		t.Fatal(err)
	}
}

// Pools picked one after another differ even before any bridge holds
// them: a cluster's nodes pick theirs before the first one starts.
func TestFreePoolSuccessivePicksDiffer(t *testing.T) {
	seen := map[string]bool{}
	for range 8 {
		p, err := FreePool("10.219")
		if err != nil {
			t.Fatal(err)
		}
		if seen[p] {
			t.Fatalf("%s picked twice", p)
		}
		seen[p] = true
	}
}
