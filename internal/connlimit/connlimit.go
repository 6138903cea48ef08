// Package connlimit bounds the connections one server holds: in total, per
// client address and per any other key, so that no single client (or
// sandbox) can take the process's file descriptors from everyone else.
package connlimit

import (
	"net"
	"net/netip"
	"sync"
)

// Counter counts holders per key, with a cap per key and a cap in total.
// A cap of 0 is no cap. Safe for concurrent use.
type Counter struct {
	perKey, total int

	mu      sync.Mutex
	n       map[string]int
	sum     int
	refused uint64
}

// NewCounter returns a counter allowing perKey holders per key and total
// holders in all (0: no cap).
func NewCounter(perKey, total int) *Counter {
	return &Counter{perKey: perKey, total: total, n: map[string]int{}}
}

// Refusal says which cap an Acquire hit.
type Refusal int

const (
	// Granted: the holder was counted and must Release.
	Granted Refusal = iota
	// KeyFull: key already holds its cap.
	KeyFull
	// TotalFull: the counter already holds its total cap.
	TotalFull
)

// Acquire counts one holder for key, unless a cap is reached.
func (c *Counter) Acquire(key string) Refusal {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.perKey > 0 && c.n[key] >= c.perKey {
		c.refused++
		return KeyFull
	}
	if c.total > 0 && c.sum >= c.total {
		c.refused++
		return TotalFull
	}
	c.n[key]++
	c.sum++
	return Granted
}

// Release uncounts one holder of key taken by a granted Acquire.
func (c *Counter) Release(key string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n[key] <= 1 {
		delete(c.n, key) // the map holds only live keys
	} else {
		c.n[key]--
	}
	c.sum--
}

// Len is how many holders are counted in all.
func (c *Counter) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.sum
}

// Refused is how many Acquire calls were refused, ever.
func (c *Counter) Refused() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.refused
}

// ClientKey is the key of the client at addr (host:port or a bare address):
// an IPv4 address, or an IPv6 /64, since one IPv6 host has a whole /64 to
// pick source addresses from. Anything unparsable is its own key.
func ClientKey(addr string) string {
	ap, err := netip.ParseAddrPort(addr)
	var a netip.Addr
	if err == nil {
		a = ap.Addr()
	} else if a, err = netip.ParseAddr(addr); err != nil {
		return addr
	}
	a = a.Unmap()
	if a.Is4() {
		return a.String()
	}
	p, _ := a.WithZone("").Prefix(64)
	return p.String()
}

// Listener caps the connections a net.Listener has open, in total and per
// client address. Past a cap a new connection is closed as soon as it is
// accepted: no HTTP answer can be written before reading a request (nor
// under TLS before a handshake), and holding the descriptor to do so is
// what the cap is there to prevent. Accept errors (EMFILE among them) are
// returned unchanged, so that http.Server backs off and retries as it does
// for any temporary error.
type Listener struct {
	net.Listener
	conns *Counter
}

// NewListener wraps ln so that its connections are counted in conns, by
// client address (ClientKey). Listeners that share conns share its caps.
func NewListener(ln net.Listener, conns *Counter) *Listener {
	return &Listener{Listener: ln, conns: conns}
}

// Accept implements net.Listener.
func (l *Listener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		key := ClientKey(c.RemoteAddr().String())
		if l.conns.Acquire(key) != Granted {
			c.Close()
			continue
		}
		return &conn{Conn: c, release: sync.OnceFunc(func() { l.conns.Release(key) })}, nil
	}
}

type conn struct {
	net.Conn
	release func()
}

// Close implements net.Conn; the slot is freed once, whoever closes
// (http.Server, or a handler that hijacked the connection).
func (c *conn) Close() error {
	err := c.Conn.Close()
	c.release()
	return err
}
