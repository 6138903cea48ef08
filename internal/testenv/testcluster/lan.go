package testcluster

import (
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// LAN is a bridge on the host standing for the network between machines:
// every machine is a network namespace with one veth on it, and what the
// machines reach on the host (control-plane replicas, S3) listens on the
// bridge's own address, Gateway.
type LAN struct {
	Bridge  string
	Prefix  netip.Prefix
	Gateway netip.Addr
	Suffix  string
	next    int
	mu      sync.Mutex
	netns   []string
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

func ip(args ...string) error {
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, out)
	}
	return nil
}

// NewLAN makes the bridge with its gateway address. Close removes it and
// every machine's namespace (and with it the veth); Close is also what to
// call when NewLAN fails half-way.
func NewLAN() (*LAN, error) {
	l := &LAN{Suffix: Suffix(), Prefix: freeLANPrefix()}
	l.Bridge = "cbl" + l.Suffix
	l.Gateway = l.Prefix.Addr().Next()
	for _, args := range [][]string{
		{"link", "add", l.Bridge, "type", "bridge"},
		{"addr", "add", netip.PrefixFrom(l.Gateway, 24).String(), "dev", l.Bridge},
		{"link", "set", l.Bridge, "up"},
	} {
		if err := ip(args...); err != nil {
			l.Close()
			return nil, err
		}
	}
	return l, nil
}

// Machine makes a network namespace with one interface (eth0) on the LAN,
// a default route through the gateway, and returns its name and address.
func (l *LAN) Machine(name string) (string, netip.Addr, error) {
	l.mu.Lock()
	l.next++
	n := l.next
	ns := "cbm" + l.Suffix + name
	l.netns = append(l.netns, ns)
	l.mu.Unlock()
	host := fmt.Sprintf("cbh%s%d", l.Suffix, n)
	addr := l.Gateway
	for range 9 + n {
		addr = addr.Next()
	}
	for _, args := range [][]string{
		{"netns", "add", ns},
		{"link", "add", host, "type", "veth", "peer", "name", "eth0", "netns", ns},
		{"link", "set", host, "master", l.Bridge},
		{"link", "set", host, "up"},
		{"-n", ns, "addr", "add", netip.PrefixFrom(addr, 24).String(), "dev", "eth0"},
		{"-n", ns, "link", "set", "eth0", "up"},
		{"-n", ns, "link", "set", "lo", "up"},
		{"-n", ns, "route", "add", "default", "via", l.Gateway.String()},
	} {
		if err := ip(args...); err != nil {
			return "", netip.Addr{}, err
		}
	}
	return ns, addr, nil
}

// Close deletes every machine's namespace and the bridge.
func (l *LAN) Close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, ns := range l.netns {
		exec.Command("ip", "netns", "del", ns).Run()
	}
	l.netns = nil
	exec.Command("ip", "link", "del", l.Bridge).Run()
}

// Balancer passes TCP connections to the first backend that answers,
// starting from the next one each time (round robin with failover), as any
// load balancer in front of control-plane replicas does (TLS passes
// through).
type Balancer struct {
	Addr     string
	backends []string
	next     atomic.Int64
	ln       net.Listener
	wg       sync.WaitGroup
	mu       sync.Mutex
	conns    map[net.Conn]bool
}

// StartBalancer listens on listen (host:port; port 0 picks one).
func StartBalancer(listen string, backends []string) (*Balancer, error) {
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return nil, err
	}
	b := &Balancer{Addr: ln.Addr().String(), backends: backends, ln: ln, conns: map[net.Conn]bool{}}
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			b.wg.Add(1)
			go func() {
				defer b.wg.Done()
				b.pass(in)
			}()
		}
	}()
	return b, nil
}

func (b *Balancer) track(c net.Conn, on bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if on {
		b.conns[c] = true
	} else {
		delete(b.conns, c)
	}
}

func (b *Balancer) pass(in net.Conn) {
	defer in.Close()
	start := int(b.next.Add(1))
	var out net.Conn
	var err error
	for i := range b.backends {
		if out, err = net.DialTimeout("tcp", b.backends[(start+i)%len(b.backends)], 2*time.Second); err == nil {
			break
		}
	}
	if out == nil {
		return
	}
	defer out.Close()
	b.track(in, true)
	b.track(out, true)
	defer b.track(in, false)
	defer b.track(out, false)
	done := make(chan struct{}, 2)
	go func() { io.Copy(out, in); out.(*net.TCPConn).CloseWrite(); done <- struct{}{} }()
	go func() { io.Copy(in, out); in.(*net.TCPConn).CloseWrite(); done <- struct{}{} }()
	<-done
	<-done
}

// Close stops listening, closes every passed connection and waits for
// its goroutines.
func (b *Balancer) Close() {
	b.ln.Close()
	b.mu.Lock()
	for c := range b.conns {
		c.Close()
	}
	b.mu.Unlock()
	b.wg.Wait()
}
