package network

import (
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// holdServer accepts connections in the netns at nsPath and keeps them
// open until drop is called or the test ends. Returns "ip:port".
func holdServer(t *testing.T, nsPath, ip string) (addr string, drop func()) {
	t.Helper()
	var ln net.Listener
	if err := RunInNetns(nsPath, func() (err error) {
		ln, err = net.Listen("tcp", net.JoinHostPort(ip, "0"))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	drop = func() {
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
