package testenv

import (
	"net"
	"sync"
	"testing"
)

// Serve listens on address (network "tcp" on "127.0.0.1:0" for a loopback
// port, or "unix" on a socket path) and runs handle on each connection in
// its own goroutine, closing the connection when handle returns. It
// returns the listener's address. When tb ends the listener closes, the
// connections still open are closed (so a handle blocked on one returns),
// and every goroutine is joined: a test leaves nothing behind.
func Serve(tb testing.TB, network, address string, handle func(net.Conn)) net.Addr {
	tb.Helper()
	ln, err := net.Listen(network, address)
	if err != nil {
		tb.Fatal(err)
	}
	var (
		wg     sync.WaitGroup
		mu     sync.Mutex
		open   = map[net.Conn]struct{}{}
		closed bool
	)
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			if closed {
				mu.Unlock()
				c.Close()
				return
			}
			open[c] = struct{}{}
			mu.Unlock()
			wg.Go(func() {
				defer func() {
					mu.Lock()
					delete(open, c)
					mu.Unlock()
					c.Close()
				}()
				handle(c)
			})
		}
	})
	tb.Cleanup(func() {
		ln.Close()
		mu.Lock()
		closed = true
		for c := range open {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return ln.Addr()
}
