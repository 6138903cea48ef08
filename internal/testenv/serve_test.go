package testenv

import (
	"bufio"
	"errors"
	"io"
	"net"
	"path/filepath"
	"testing"
)

// Serve answers each connection with handle, on a loopback port and on a
// unix socket; when its test ends the listener is gone and a handle still
// blocked on an open connection has returned.
func TestServeJoinsAtCleanup(t *testing.T) {
	for _, c := range []struct{ network, address string }{
		{"tcp", "127.0.0.1:0"},
		{"unix", filepath.Join(t.TempDir(), "s.sock")},
	} {
		var addr net.Addr
		ended := make(chan struct{})
		var held net.Conn
		if !t.Run(c.network, func(t *testing.T) {
			addr = Serve(t, c.network, c.address, func(conn net.Conn) {
				line, _ := bufio.NewReader(conn).ReadString('\n')
				io.WriteString(conn, "got "+line)
				if line == "hold\n" {
					io.Copy(io.Discard, conn) // until the connection closes
					close(ended)
				}
			})
			for _, line := range []string{"a\n", "hold\n"} {
				conn, err := net.Dial(addr.Network(), addr.String())
				if err != nil {
					t.Fatal(err)
				}
				io.WriteString(conn, line)
				got, err := bufio.NewReader(conn).ReadString('\n')
				if err != nil || got != "got "+line {
					t.Fatalf("answer to %q: %q %v", line, got, err)
				}
				if line == "hold\n" {
					held = conn // left open: cleanup must end its handle
				} else {
					conn.Close()
				}
			}
		}) {
			return
		}
		defer held.Close()
		select {
		case <-ended:
		default:
			t.Fatalf("%s: the handle of an open connection was still running after its test ended", c.network)
		}
		if conn, err := net.Dial(addr.Network(), addr.String()); err == nil {
			conn.Close()
			t.Fatalf("%s: the listener still accepts after its test ended", c.network)
		}
		if _, err := held.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
			t.Fatalf("%s: the held connection after cleanup: %v, want EOF", c.network, err)
		}
	}
}
