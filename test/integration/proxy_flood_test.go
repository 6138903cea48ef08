package integration

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/testenv"
)

// silentPortScript listens on 8000 and never answers, holding each
// connection until its peer closes it (one thread, so that thousands fit
// in the sandbox's pids limit).
const silentPortScript = `cat > /tmp/silent.py <<'PY'
import selectors, socket, time
sel = selectors.DefaultSelector()
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", 8000))
s.listen(4096)
s.setblocking(False)
sel.register(s, selectors.EVENT_READ)
while True:
    for key, _ in sel.select():
        if key.fileobj is s:
            try:
                c, _ = s.accept()
            except OSError:  # out of descriptors: the rest wait in the backlog
                time.sleep(0.01)
                continue
            c.setblocking(False)
            sel.register(c, selectors.EVENT_READ)
            continue
        c = key.fileobj
        try:
            data = c.recv(65536)
        except OSError:
            data = b""
        if not data:
            sel.unregister(c)
            c.close()
PY
ulimit -n "$(ulimit -Hn)"
(python3 /tmp/silent.py >/dev/null 2>&1 &)
for i in $(seq 100); do (echo > /dev/tcp/127.0.0.1/8000) 2>/dev/null && exit 0; sleep 0.1; done; exit 1`

// openFiles is how many descriptors process pid has open.
func openFiles(t *testing.T, pid int) int {
	t.Helper()
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// rssMiB is process pid's resident set.
func rssMiB(pid int) int {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, _ := strconv.Atoi(f[1])
			return kb / 1024
		}
	}
	return 0
}

// flood is anonymous clients (no API key) that keep sending requests to a
// sandbox port, each on its own connection.
type flood struct {
	mu       sync.Mutex
	outcomes map[string]int // status code, "closed" or "dial error"
}

func (f *flood) note(o string) {
	f.mu.Lock()
	f.outcomes[o]++
	f.mu.Unlock()
}

func (f *flood) snapshot() map[string]int {
	f.mu.Lock()
	defer f.mu.Unlock()
	m := map[string]int{}
	for k, v := range f.outcomes {
		m[k] = v
	}
	return m
}

// worker sends requests from the loopback address src until stop is closed.
func (f *flood) worker(src, addr, sandboxID string, stop <-chan struct{}) {
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 10 * time.Second}
	stopped := func() bool {
		select {
		case <-stop:
			return true
		default:
			return false
		}
	}
	for !stopped() {
		c, err := d.Dial("tcp", addr)
		if err != nil {
			f.note("dial error")
			time.Sleep(50 * time.Millisecond)
			continue
		}
		done := make(chan struct{})
		go func() {
			select {
			case <-stop: // a held request ends with the flood
			case <-done:
			}
			c.Close()
		}()
		c.SetDeadline(time.Now().Add(2 * time.Minute))
		fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: flood\r\nE2b-Sandbox-Id: %s\r\nE2b-Sandbox-Port: 8000\r\n\r\n", sandboxID)
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		switch {
		case err == nil:
			io.Copy(io.Discard, resp.Body)
			f.note(strconv.Itoa(resp.StatusCode))
		case !stopped():
			f.note("closed") // at accept, past the per-address cap
		}
		close(done)
		time.Sleep(200 * time.Millisecond) // refused: try again, a little later
	}
}

// 10,200 anonymous requests to a sandbox port that accepts and never
// answers took serve to its descriptor limit: /health timed out and every
// team's creates failed. Now, under a sustained flood from two addresses,
// past the caps requests are refused (429 per address, 503 per sandbox),
// held ones end at the response-start timeout (504), serve's descriptors
// stay bounded, /health answers, a create succeeds, and a command in the
// flooded sandbox that runs longer than the response-start timeout streams
// its output to the end. The proxy is the same for both runtimes; the
// sandbox side (the netstack holding the connections) is not.
func TestProxyFloodLeavesTheServerServing(t *testing.T) {
	for _, rt := range []string{"runc", "runsc"} {
		t.Run(rt, func(t *testing.T) {
			testenv.LookPath(t, rt)
			proxyFlood(t, rt)
		})
	}
}

func proxyFlood(t *testing.T, runtime string) {
	const (
		perClient, perSandbox, connsPerClient = 60, 100, 150
		responseStart                         = 4 * time.Second
	)
	s := startServer(t, "--runtime", runtime, "--proxy-max-conns-per-client", strconv.Itoa(perClient), "--proxy-max-conns-per-sandbox", strconv.Itoa(perSandbox),
		"--max-conns-per-client", strconv.Itoa(connsPerClient), "--proxy-response-start-timeout", responseStart.String())
	c := s.create(map[string]any{"templateID": "base"})
	s.mustRun(c, silentPortScript)
	pid := s.cmd.Process.Pid
	baseFiles, baseRSS := openFiles(t, pid), rssMiB(pid)

	f := &flood{outcomes: map[string]int{}}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	spawn := func(src string) {
		for range connsPerClient + 10 { // past the per-address connection cap
			wg.Add(1)
			go func() { defer wg.Done(); f.worker(src, s.listenOn, c.SandboxID, stop) }()
		}
	}
	var maxFiles, maxRSS int
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for {
			if ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid)); err == nil {
				maxFiles = max(maxFiles, len(ents))
			}
			maxRSS = max(maxRSS, rssMiB(pid))
			select {
			case <-stop:
				return
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
	var once sync.Once
	end := func() {
		once.Do(func() {
			close(stop)
			wg.Wait()
			<-sampled
		})
	}
	defer end()

	// Held requests fill the caps, one client first so that each cap is
	// met in turn whatever the scheduling: the first address holds its
	// perClient (< perSandbox) and is refused 429; the second then fills
	// the sandbox's remaining slots and is refused 503.
	waitFor := func(code string) {
		for i := 0; ; i++ {
			o := f.snapshot()
			if o[code] > 0 {
				return
			}
			if i == 600 {
				t.Fatalf("no %s under the flood: %v", code, o)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	spawn("127.0.0.2")
	waitFor("429")
	spawn("127.0.0.3")
	waitFor("503")

	// Another client is served meanwhile: /health, a create and a command
	// in the new sandbox, and a long command in the flooded one.
	resp, err := s.client.Get(s.URL + "/health")
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("/health under the flood: %v %v", resp, err)
	}
	resp.Body.Close()
	other := s.create(map[string]any{"templateID": "base"})
	if out := s.mustRun(other, "echo fresh"); out != "fresh\n" {
		t.Fatalf("command in a sandbox created under the flood: %q", out)
	}
	long := fmt.Sprintf("sleep %d; echo late; for i in 1 2 3; do echo $i; sleep 1; done", int(responseStart.Seconds())+2)
	if out := s.mustRun(c, long); out != "late\n1\n2\n3\n" {
		t.Fatalf("long command in the flooded sandbox: %q", out)
	}
	end()

	o := f.snapshot()
	t.Logf("flood outcomes %v; serve descriptors %d -> at most %d, RSS %d -> at most %d MiB", o, baseFiles, maxFiles, baseRSS, maxRSS)
	if o["504"] == 0 {
		t.Errorf("no held request ended at the response-start timeout: %v", o)
	}
	for k := range o {
		switch k {
		case "429", "503", "504", "closed":
		default:
			t.Errorf("flood outcome %q: want only 429, 503, 504 or a connection closed at accept: %v", k, o)
		}
	}
	s.requireMetrics(t, `cubicle_proxy_requests_refused_total{cap="sandbox"}`, `cubicle_proxy_requests_refused_total{cap="client"}`,
		"cubicle_proxy_response_start_timeouts_total", "cubicle_proxy_requests_in_flight", "cubicle_client_connections_refused_total")
	// Client connections (per address), upstream ones (per sandbox), the
	// upstream pool and the second sandbox's, with room to spare.
	if bound := baseFiles + 2*connsPerClient + perSandbox + 64 + 100; maxFiles > bound {
		t.Errorf("serve held %d descriptors under the flood, more than %d", maxFiles, bound)
	}
}
