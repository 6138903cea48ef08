//go:build linux

package egress_test

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/network"

	"github.com/cubicle-dev/cubicle/internal/testenv"
)

// rssKiB reads a field (VmRSS, VmHWM) of this process's status.
func rssKiB(t *testing.T, field string) int {
	t.Helper()
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, field+":"); ok {
			n, err := strconv.Atoi(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")))
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatalf("no %s in /proc/self/status", field)
	return 0
}

// floodConns and floodLine: a sandbox's whole connection allowance, each
// sending a 1 MiB header line after a normal request on the same
// kept-alive connection.
const (
	floodConns = 1024
	floodLine  = 1 << 20
	// floodRSSBound is the growth of this process's peak RSS (the proxy
	// runs in it, and the clients with their shared 1 MiB buffer) that
	// the flood may cause. Reading every line whole would take over 1 GiB.
	floodRSSBound = 128 << 10 // KiB
)

// Every read of a sandbox's input is bounded: later requests on a kept-alive
// connection as much as the first, and the proxy's memory for reading them
// is budgeted per sandbox, so the flood neither grows the process past a
// bound nor keeps the proxy from answering a neighbour.
func TestHeaderFloodIsBounded(t *testing.T) {
	testenv.RequireRoot(t, "netns, veth, nftables")
	tn := startTestnet(t)
	l, _ := newManager(t, netip.MustParseAddr(tn.DNS))
	pol := network.Policy{AllowOut: []string{"a.test"}, DenyOut: []string{"0.0.0.0/0"}}
	flooder, err := l.Setup(context.Background(), "floodsbx", pol)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = l.Teardown(context.Background(), "floodsbx") }()
	neighbour, err := l.Setup(context.Background(), "floodnbr", pol)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = l.Teardown(context.Background(), "floodnbr") }()
	if got := curl(t, neighbour.NetNSPath, "http://a.test/", "a.test", tn.Addr); got != "200" {
		t.Fatalf("control: the neighbour's request before the flood: %q", got)
	}

	// The sockets are made in the flooder's netns.
	conns := make([]net.Conn, 0, floodConns)
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	if err := network.RunInNetns(flooder.NetNSPath, func() error {
		for range floodConns {
			c, err := net.DialTimeout("tcp4", net.JoinHostPort(tn.Addr, "80"), 10*time.Second)
			if err != nil {
				return err
			}
			conns = append(conns, c)
		}
		return nil
	}); err != nil {
		t.Fatalf("dial from the sandbox: %v", err)
	}

	runtime.GC()
	base := rssKiB(t, "VmRSS")
	if err := os.WriteFile("/proc/self/clear_refs", []byte("5"), 0); err != nil {
		t.Fatalf("reset the peak RSS: %v", err)
	}
	line := bytes.Repeat([]byte("a"), floodLine)
	var wg sync.WaitGroup
	var mu sync.Mutex
	answered := 0
	start := make(chan struct{})
	for _, c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			_ = c.SetDeadline(time.Now().Add(2 * time.Minute))
			if _, err := io.WriteString(c, "GET / HTTP/1.1\r\nHost: a.test\r\n\r\n"); err != nil {
				return
			}
			br := bufio.NewReader(c)
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			mu.Lock()
			answered++
			mu.Unlock()
			if _, err := io.WriteString(c, "GET /2 HTTP/1.1\r\nHost: a.test\r\nX-Flood: "); err != nil {
				return
			}
			_, _ = c.Write(line) // the proxy stops reading long before the end
			_, _ = io.Copy(io.Discard, br)
		}()
	}
	close(start)
	// The neighbour is answered while the flood is on.
	if got := curl(t, neighbour.NetNSPath, "http://a.test/", "a.test", tn.Addr); got != "200" {
		t.Errorf("the neighbour's request during the flood: %q", got)
	}
	wg.Wait()
	peak := rssKiB(t, "VmHWM")
	t.Logf("RSS before the flood %d MiB, peak during it %d MiB (+%d MiB; bound +%d MiB); %d of %d first requests answered",
		base>>10, peak>>10, (peak-base)>>10, floodRSSBound>>10, answered, floodConns)
	if peak-base > floodRSSBound {
		t.Errorf("the flood grew the peak RSS by %d MiB, over the bound of %d MiB", (peak-base)>>10, floodRSSBound>>10)
	}
	if answered == 0 {
		t.Error("no first request of the flood was answered: the flood did not run")
	}
	for _, c := range conns {
		c.Close()
	}
	conns = nil
	// And the flooder itself once its connections are gone.
	if got := curl(t, flooder.NetNSPath, "http://a.test/", "a.test", tn.Addr); got != "200" {
		t.Errorf("the flooder's request after the flood: %q", got)
	}
}
