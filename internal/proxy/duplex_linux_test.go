package proxy

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// blackhole returns a loopback port whose listen queue is full, so the
// kernel drops SYNs and a dial hangs until its timeout: a sandbox whose
// network stopped answering.
func blackhole(t *testing.T) int {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Listen(fd, 0); err != nil {
		t.Fatal(err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	port := sa.(*syscall.SockaddrInet4).Port
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	for filled := false; !filled; {
		c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
		if err != nil {
			filled = true
			continue
		}
		t.Cleanup(func() { c.Close() })
	}
	return port
}

// freePort returns a loopback port nothing listens on.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	return port
}

// earlyUpstream returns a loopback port whose server sends a complete
// response as soon as it has the request headers, then reads the body: the
// proxy's handler returns while the transport is still sending that body.
func earlyUpstream(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				if _, err := http.ReadRequest(bufio.NewReader(c)); err != nil {
					return
				}
				io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nearly")
				io.Copy(io.Discard, c)
			}()
		}
	}()
	return l.Addr().(*net.TCPAddr).Port
}

// A request whose body is still streaming when dialling the sandbox fails
// (or the sandbox answers before reading it) got its response, and then the
// server panicked reading the connection's next request ("invalid
// concurrent Body.Read call", golang/go#68560): the full-duplex body was
// drained after the handler returned.
func TestUnreachableSandboxWithStreamingBody(t *testing.T) {
	for _, tc := range []struct {
		name   string
		status int
		port   func(*testing.T, *fixture) int
	}{
		{"dial timeout", http.StatusBadGateway, func(t *testing.T, _ *fixture) int { return blackhole(t) }},
		{"refused", http.StatusBadGateway, func(t *testing.T, _ *fixture) int { return freePort(t) }},
		{"upstream answers early", http.StatusOK, func(t *testing.T, _ *fixture) int { return earlyUpstream(t) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := setup(t, echoPath())
			p := New(Config{Domain: "cubicle.test"}, nil, f.st, http.NotFoundHandler())
			tr := p.rp.Transport.(portTransport).user.(*http.Transport) // a user port
			dial := tr.DialContext
			tr.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
				ctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond) // not the real 3 s
				defer cancel()
				return dial(ctx, network, addr)
			}
			var logs syncBuffer
			front := httptest.NewUnstartedServer(p)
			front.Config.ErrorLog = log.New(&logs, "", 0)
			front.Start()
			defer front.Close()

			conn, err := net.Dial("tcp", front.Listener.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			conn.SetDeadline(time.Now().Add(10 * time.Second))
			br := bufio.NewReader(conn)
			port := tc.port(t, f)
			body := strings.Repeat("x", 1000)
			fmt.Fprintf(conn, "POST /upload HTTP/1.1\r\nHost: %d-%s.cubicle.test\r\nContent-Length: %d\r\n\r\n%s",
				port, f.sb.ID, len(body), body[:100])
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := io.Copy(io.Discard, resp.Body); err != nil {
				t.Fatalf("response body: %v", err)
			}
			resp.Body.Close()
			if resp.StatusCode != tc.status {
				t.Fatalf("status %d, want %d", resp.StatusCode, tc.status)
			}
			// The rest of the body, then (once the server is waiting for it) the
			// connection's next request.
			conn.Write([]byte(body[100:]))
			time.Sleep(200 * time.Millisecond)
			fmt.Fprintf(conn, "GET /v2/sandboxes HTTP/1.1\r\nHost: api\r\n\r\n")
			resp, err = http.ReadResponse(br, nil)
			if err != nil {
				t.Fatalf("keep-alive request after the first: %v; server log:\n%s", err, logs.String())
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusNotFound {
				t.Fatalf("second request status %d, want the API's 404", resp.StatusCode)
			}
			if strings.Contains(logs.String(), "panic") {
				t.Fatalf("server panicked:\n%s", logs.String())
			}
		})
	}
}
