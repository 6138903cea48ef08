// Package clientrate limits requests per client address with a token
// bucket per address, in a table of bounded size: for the requests that
// carry no API key (signed /files lookups, node joins).
package clientrate

import (
	"net"
	"net/http"
	"net/netip"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// MaxClients is the usual bound on the buckets kept. Idle ones (full
// again) are dropped first; past it, a new address is refused until some
// refill, so the table never grows with the addresses an attacker has.
const MaxClients = 4096

// Limiter is a token bucket per client address: per IPv4 address,
// per /64 for IPv6 (one host usually holds a whole /64).
type Limiter struct {
	rate  rate.Limit
	burst int
	max   int

	mu      sync.Mutex
	buckets map[netip.Prefix]*rate.Limiter
}

// New allows r requests a second per client, in bursts of burst, and
// keeps at most max clients' buckets.
func New(r rate.Limit, burst, max int) *Limiter {
	return &Limiter{rate: r, burst: burst, max: max, buckets: map[netip.Prefix]*rate.Limiter{}}
}

// Allow takes a token for addr's bucket; when there is none it returns
// false and how long until there is.
func (c *Limiter) Allow(addr netip.Addr, now time.Time) (bool, time.Duration) {
	key := clientKey(addr)
	c.mu.Lock()
	defer c.mu.Unlock()
	lim, ok := c.buckets[key]
	if !ok {
		if len(c.buckets) >= c.max {
			c.sweep(now)
		}
		if len(c.buckets) >= c.max {
			return false, time.Duration(float64(time.Second) / float64(c.rate))
		}
		lim = rate.NewLimiter(c.rate, c.burst)
		c.buckets[key] = lim
	}
	if lim.AllowN(now, 1) {
		return true, 0
	}
	return false, time.Duration((1 - lim.TokensAt(now)) / float64(c.rate) * float64(time.Second))
}

// sweep drops the buckets that are full again: a new one is the same.
func (c *Limiter) sweep(now time.Time) {
	for k, lim := range c.buckets {
		if lim.TokensAt(now) >= float64(c.burst) {
			delete(c.buckets, k)
		}
	}
}

func clientKey(a netip.Addr) netip.Prefix {
	a = a.Unmap()
	bits := 32
	if a.Is6() {
		bits = 64
	}
	p, _ := a.Prefix(bits)
	return p
}

// RemoteAddr is the address the connection came from. Forwarding headers
// are not trusted: any client can send them.
func RemoteAddr(r *http.Request) netip.Addr {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		host = r.RemoteAddr
	}
	a, _ := netip.ParseAddr(host)
	return a
}
