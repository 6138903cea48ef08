package dataplane

import (
	"io"
	"net"
	"testing"
	"time"
)

// tcpPair is two ends of a loopback TCP connection.
func tcpPair(t *testing.T) (*net.TCPConn, *net.TCPConn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	a, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	b, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close(); b.Close() })
	return a.(*net.TCPConn), b.(*net.TCPConn)
}

// TestHalfClosedTunnelEnds: once the control plane has finished sending, a
// sandbox that ignores the FIN and never answers does not hold the tunnel
// for ever: after the linger with no bytes, both sides are closed.
func TestHalfClosedTunnelEnds(t *testing.T) {
	defer func(d time.Duration) { halfCloseLinger = d }(halfCloseLinger)
	halfCloseLinger = 50 * time.Millisecond
	client, nodeFront := tcpPair(t)
	nodeBack, sandbox := tcpPair(t)
	done := make(chan struct{})
	go func() { splice(nodeFront, nodeBack); close(done) }()

	io.WriteString(client, "request")
	client.CloseWrite()
	buf := make([]byte, 7)
	if _, err := io.ReadFull(sandbox, buf); err != nil || string(buf) != "request" {
		t.Fatalf("the sandbox got %q %v", buf, err)
	}
	// The sandbox reads the FIN and then sits silent, its socket open.
	if n, err := sandbox.Read(buf); n != 0 || err != io.EOF {
		t.Fatalf("the sandbox did not get the FIN: %d %v", n, err)
	}
	client.SetReadDeadline(time.Now().Add(time.Minute)) // a bound for a broken build, not a measure
	if b, err := io.ReadAll(client); err != nil || len(b) != 0 {
		t.Fatalf("the client's side: %q %v", b, err)
	}
	<-done
}
