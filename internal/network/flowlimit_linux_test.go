package network

import (
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// holdServer accepts connections in the netns at nsPath and keeps them
// open until drop is called or the test ends. Returns "ip:port".
func holdServer(t *testing.T, nsPath, ip string) (addr string, drop func()) {
	t.Helper()
	t.Helper()
	return holdServerAt(t, nsPath, net.JoinHostPort(ip, "0"))
}

// holdServerAt is holdServer on a given address ("" nsPath: the host's).
func holdServerAt(t *testing.T, nsPath, addr string) (string, func()) {
	t.Helper()
	var ln net.Listener
	listen := func() (err error) {
		ln, err = net.Listen("tcp", addr)
		return err
	}
	var err error
	if nsPath == "" {
		err = listen()
	} else {
		err = RunInNetns(nsPath, listen)
	}
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	drop := func() {
		mu.Lock()
		defer mu.Unlock()
		closeAll(conns)
		conns = nil
	}
	t.Cleanup(func() {
		ln.Close()
		drop()
	})
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	return ln.Addr().String(), drop
}

// dialMany opens n connections from nsPath to target at once, each with
// timeout (shorter than the first SYN retransmission, 1 s, so a dropped
// SYN is not retried), and returns those that connected. The caller
// closes them.
func dialMany(t *testing.T, nsPath, target string, n int, timeout time.Duration) []net.Conn {
	t.Helper()
	var mu sync.Mutex
	var ok []net.Conn
	var wg sync.WaitGroup
	var failed atomic.Int32
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var c net.Conn
			err := RunInNetns(nsPath, func() (err error) {
				c, err = (&net.Dialer{Timeout: timeout}).Dial("tcp", target)
				return err
			})
			if err != nil {
				failed.Add(1)
				return
			}
			mu.Lock()
			ok = append(ok, c)
			mu.Unlock()
		}()
	}
	wg.Wait()
	return ok
}

func closeAll(cs []net.Conn) {
	for _, c := range cs {
		c.Close()
	}
}

// A sandbox may hold at most MaxFlows connections; past them its new flows
// are dropped, while its neighbour's are not, and closing frees the
// budget again.
func TestSandboxFlowCap(t *testing.T) {
	cfg := testConfig(t, 24)
	cfg.MaxFlows, cfg.NewFlowRate = 20, 0
	l := newTestManager(t, cfg)
	ext := newExtHost(t)
	srv, drop := holdServer(t, ext.path, ext.ip.String())
	a := setup(t, l, "sbxa"+randHex(4), Policy{AllowInternet: true})
	b := setup(t, l, "sbxb"+randHex(4), Policy{AllowInternet: true})

	got := dialMany(t, a.NetNSPath, srv, 30, 800*time.Millisecond)
	if len(got) != cfg.MaxFlows {
		closeAll(got)
		t.Fatalf("the churning sandbox opened %d of 30 connections, want exactly MaxFlows=%d", len(got), cfg.MaxFlows)
	}
	nb := dialMany(t, b.NetNSPath, srv, 20, 2*time.Second)
	closeAll(nb)
	if len(nb) != 20 {
		t.Errorf("its neighbour opened %d of 20 connections, want all", len(nb))
	}
	// Closed connections leave the count (TIME_WAIT is not counted).
	closeAll(got)
	drop()
	deadline := time.Now().Add(10 * time.Second)
	for {
		again := dialMany(t, a.NetNSPath, srv, 5, 800*time.Millisecond)
		closeAll(again)
		if len(again) == 5 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after closing its connections the sandbox still gets only %d of 5", len(again))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// The cap counts flows to the host's egress proxy too (redirected at
// prerouting, accepted at input, never forwarded): the churn went
// there.
func TestSandboxFlowCapEgressProxy(t *testing.T) {
	cfg := testConfig(t, 24)
	cfg.MaxFlows, cfg.NewFlowRate = 20, 0
	probe, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cfg.EgressPort = uint16(probe.Addr().(*net.TCPAddr).Port)
	probe.Close()
	l := newTestManager(t, cfg)
	a := setup(t, l, "sbxa"+randHex(4), Policy{AllowInternet: true, AllowOut: []string{"example.com"}})
	b := setup(t, l, "sbxb"+randHex(4), Policy{AllowInternet: true, AllowOut: []string{"example.com"}})
	holdServerAt(t, "", net.JoinHostPort(a.Gateway.String(), strconv.Itoa(int(cfg.EgressPort))))
	// Any address on port 80 is redirected to the proxy's port.
	target := "198.51.100.7:80"
	got := dialMany(t, a.NetNSPath, target, 30, 800*time.Millisecond)
	closeAll(got)
	if len(got) != cfg.MaxFlows {
		t.Fatalf("the churning sandbox reached the egress proxy %d of 30 times at once, want exactly MaxFlows=%d", len(got), cfg.MaxFlows)
	}
	nb := dialMany(t, b.NetNSPath, target, 20, 2*time.Second)
	closeAll(nb)
	if len(nb) != 20 {
		t.Errorf("its neighbour reached the proxy %d of 20 times, want all", len(nb))
	}
}

// A burst of new flows from one sandbox is cut at the rate's burst
// (twice NewFlowRate), whatever the destination; its neighbour's burst
// passes whole.
func TestSandboxNewFlowRate(t *testing.T) {
	cfg := testConfig(t, 24)
	cfg.MaxFlows, cfg.NewFlowRate = 0, 5
	l := newTestManager(t, cfg)
	ext := newExtHost(t)
	srv, _ := holdServer(t, ext.path, ext.ip.String())
	a := setup(t, l, "sbxa"+randHex(4), Policy{AllowInternet: true})
	b := setup(t, l, "sbxb"+randHex(4), Policy{AllowInternet: true})

	// 60 at once take well under a second: the bucket holds 10, and
	// refills 5 a second. 30 leaves room for a slow host.
	got := dialMany(t, a.NetNSPath, srv, 60, 800*time.Millisecond)
	closeAll(got)
	if len(got) == 0 || len(got) > 30 {
		t.Fatalf("the churning sandbox opened %d of 60 connections at once, want 1..30 (burst 10, 5/s)", len(got))
	}
	t.Logf("churning sandbox: %d of 60 new flows accepted", len(got))
	nb := dialMany(t, b.NetNSPath, srv, 8, 2*time.Second)
	closeAll(nb)
	if len(nb) != 8 {
		t.Errorf("its neighbour opened %d of 8 connections, want all", len(nb))
	}
}

func TestFlowLimitConfig(t *testing.T) {
	for _, c := range []Config{{MaxFlows: -1}, {NewFlowRate: -1}, {NewFlowRate: 1 << 31}} {
		if err := c.applyDefaults(); err == nil {
			t.Errorf("applyDefaults(%+v) accepted", c)
		}
	}
}
