package connlimit

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func TestClientKey(t *testing.T) {
	for in, want := range map[string]string{
		"10.0.0.1:443":                   "10.0.0.1",
		"[::ffff:10.0.0.1]:443":          "10.0.0.1",
		"[2001:db8:1:2:aaaa::1]:80":      "2001:db8:1:2::/64",
		"[2001:db8:1:2:bbbb::7%eth0]:80": "2001:db8:1:2::/64",
		"10.0.0.9":                       "10.0.0.9",
		"@":                              "@",
	} {
		if got := ClientKey(in); got != want {
			t.Errorf("ClientKey(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestCounter(t *testing.T) {
	c := NewCounter(2, 3)
	for _, step := range []struct {
		key  string
		want Refusal
	}{{"a", Granted}, {"a", Granted}, {"a", KeyFull}, {"b", Granted}, {"c", TotalFull}} {
		if got := c.Acquire(step.key); got != step.want {
			t.Fatalf("Acquire(%s) = %v, want %v", step.key, got, step.want)
		}
	}
	if c.Refused() != 2 {
		t.Fatalf("refused %d, want 2", c.Refused())
	}
	c.Release("a")
	if got := c.Acquire("c"); got != Granted {
		t.Fatalf("after a release: %v", got)
	}
	for _, k := range []string{"a", "b", "c"} {
		c.Release(k)
	}
	if c.Len() != 0 || len(c.n) != 0 {
		t.Fatalf("after releasing all: %d held, %d keys", c.Len(), len(c.n))
	}
}

// dialFrom connects to addr from the loopback address src.
func dialFrom(t *testing.T, src, addr string) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 10 * time.Second}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// closedByServer reports whether the server closed c without a word.
func closedByServer(c net.Conn) bool {
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, err := c.Read(make([]byte, 1))
	return errors.Is(err, io.EOF) || errors.Is(err, unix.ECONNRESET)
}

// Past its caps the listener closes a new connection as soon as it is
// accepted, and a closed connection gives its slot back.
func TestListenerCaps(t *testing.T) {
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := NewListener(raw, NewCounter(2, 3))
	defer l.Close()
	accepted := make(chan net.Conn, 10)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			accepted <- c
		}
	}()
	addr := raw.Addr().String()
	accept := func(src string) net.Conn {
		t.Helper()
		dialFrom(t, src, addr)
		select {
		case c := <-accepted:
			t.Cleanup(func() { c.Close() })
			return c
		case <-time.After(10 * time.Second):
			t.Fatalf("a connection from %s under the caps was not accepted", src)
			return nil
		}
	}
	refused := func(src, why string) {
		t.Helper()
		if !closedByServer(dialFrom(t, src, addr)) {
			t.Fatalf("a connection from %s past the %s cap was kept", src, why)
		}
	}
	first := accept("127.0.0.2")
	accept("127.0.0.2")
	refused("127.0.0.2", "per-client")
	accept("127.0.0.3")
	refused("127.0.0.4", "total")
	first.Close()
	first.Close() // a second close frees nothing more
	accept("127.0.0.4")
	refused("127.0.0.5", "total")
	if n := len(accepted); n != 0 {
		t.Fatalf("%d refused connections were handed to the server", n)
	}
}

// The EMFILE helper serves HTTP with its descriptor limit lowered to 64.
func TestMain(m *testing.M) {
	if os.Getenv("CONNLIMIT_EMFILE_HELPER") != "" {
		emfileHelper(os.Getenv("CONNLIMIT_EMFILE_HELPER") == "capped")
		return
	}
	os.Exit(m.Run())
}

func emfileHelper(capped bool) {
	lim := unix.Rlimit{Cur: 64, Max: 64}
	if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &lim); err != nil {
		fmt.Println("setrlimit:", err)
		os.Exit(1)
	}
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Println(err)
		os.Exit(1)
	}
	total := 0 // no cap: the flood runs the process out of descriptors
	if capped {
		total = 32
	}
	l := NewListener(raw, NewCounter(0, total))
	fmt.Println(raw.Addr().String())
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }),
		ReadHeaderTimeout: time.Minute}
	err = srv.Serve(l)
	fmt.Println("serve returned:", err)
	os.Exit(1)
}

type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// A flood of connections that send nothing: without a cap, accept fails
// with EMFILE, and http.Server must back off and keep its listener rather
// than spin or return; with a cap the server never reaches EMFILE. Either
// way it answers once the flood lets go.
func TestFloodOfIdleConnectionsLeavesTheListenerServing(t *testing.T) {
	for _, mode := range []string{"uncapped", "capped"} {
		t.Run(mode, func(t *testing.T) {
			cmd := exec.Command(os.Args[0], "-test.run=^$")
			cmd.Env = append(os.Environ(), "CONNLIMIT_EMFILE_HELPER="+mode)
			out, err := cmd.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			stderr := &lockedBuffer{}
			cmd.Stderr = stderr
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
			line := make([]byte, 64)
			n, err := out.Read(line)
			if err != nil {
				t.Fatal(err)
			}
			addr := strings.TrimSpace(string(line[:n]))
			var flood []net.Conn
			for range 100 {
				c, err := net.DialTimeout("tcp", addr, 10*time.Second)
				if err != nil {
					break // the backlog is full: flood enough
				}
				flood = append(flood, c)
			}
			if len(flood) < 64 {
				t.Fatalf("only %d flood connections", len(flood))
			}
			// Uncapped, hold the flood until the server has met EMFILE: on a
			// busy machine its accept loop can trail the dials, and a flood
			// closed first would be accepted and dropped one at a time.
			for i := 0; i < 100 && mode == "uncapped" && !strings.Contains(stderr.String(), "too many open files"); i++ {
				time.Sleep(100 * time.Millisecond)
			}
			for _, c := range flood {
				c.Close()
			}
			c := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
			var last error
			for range 100 {
				resp, err := c.Get("http://" + addr + "/")
				if err == nil {
					b, _ := io.ReadAll(resp.Body)
					resp.Body.Close()
					if string(b) != "ok" {
						t.Fatalf("answer %q", b)
					}
					// http.Server logs each accept error it retries.
					emfile := strings.Contains(stderr.String(), "too many open files")
					if emfile != (mode == "uncapped") {
						t.Fatalf("EMFILE seen: %v, want %v; helper log:\n%s", emfile, mode == "uncapped", stderr)
					}
					return
				}
				last = err
				time.Sleep(100 * time.Millisecond)
			}
			rest, _ := io.ReadAll(out)
			t.Fatalf("the server does not answer after the flood: %v; helper: %s %s", last, rest, strconv.Quote(stderr.String()))
		})
	}
}
