package dataplane

import (
	"bufio"
	"crypto/tls"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// halfCloseLinger bounds how long a tunnel stays open once one side has
// finished sending while the other sends nothing. The proxy never
// half-closes a live connection (its close sends close_notify too), so
// without this a sandbox that ignores the FIN would hold the tunnel, and
// a slot of the node's limit, forever. Each byte that still flows
// restarts it. A variable for the tests.
var halfCloseLinger = time.Minute

// closeWriter is a connection that can end its sending side alone:
// *net.TCPConn (FIN) and *tls.Conn (close_notify).
type closeWriter interface {
	CloseWrite() error
}

// splice copies a→b and b→a until both directions end. A direction that
// reaches EOF half-closes its destination; one that fails closes both.
func splice(a, b net.Conn) {
	var half atomic.Bool
	var wg sync.WaitGroup
	pipe := func(dst, src net.Conn) {
		defer wg.Done()
		_, err := io.Copy(dst, &lingerReader{c: src, half: &half})
		if err != nil {
			a.Close()
			b.Close()
			return
		}
		if cw, ok := dst.(closeWriter); !ok || cw.CloseWrite() != nil {
			a.Close()
			b.Close()
			return
		}
		// The other direction may be blocked in a read already: bound it now.
		if !half.Swap(true) {
			src2 := a
			if src == a {
				src2 = b
			}
			src2.SetReadDeadline(time.Now().Add(halfCloseLinger))
		}
	}
	wg.Add(2)
	go pipe(b, a)
	pipe(a, b)
	wg.Wait()
	a.Close()
	b.Close()
}

// lingerReader restarts its connection's read deadline before each read
// once the tunnel is half-closed. It has only Read, so io.Copy cannot
// bypass it through WriterTo.
type lingerReader struct {
	c    net.Conn
	half *atomic.Bool
}

func (r *lingerReader) Read(p []byte) (int, error) {
	if r.half.Load() {
		r.c.SetReadDeadline(time.Now().Add(halfCloseLinger))
	}
	return r.c.Read(p)
}

// bufConn is a connection whose first bytes were read into r (while
// parsing the CONNECT exchange): reads drain r, then go to the
// connection itself without the extra copy.
type bufConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *bufConn) Read(p []byte) (int, error) {
	if c.r != nil {
		if c.r.Buffered() > 0 {
			return c.r.Read(p)
		}
		c.r = nil
	}
	return c.Conn.Read(p)
}

// CloseWrite half-closes the underlying connection when it can.
func (c *bufConn) CloseWrite() error {
	if cw, ok := c.Conn.(closeWriter); ok {
		return cw.CloseWrite()
	}
	return c.Conn.Close()
}

// ConnectionState is the TLS state of a tunnel (zero for a plain
// connection): which node answered, whether the session was resumed.
func (c *bufConn) ConnectionState() tls.ConnectionState {
	if tc, ok := c.Conn.(*tls.Conn); ok {
		return tc.ConnectionState()
	}
	return tls.ConnectionState{}
}
