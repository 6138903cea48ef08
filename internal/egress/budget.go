package egress

import (
	"context"
	"errors"
	"io"
	"time"

	"golang.org/x/sync/semaphore"
)

// Memory budget. Everything the proxy reads from a sandbox before it can
// stream it is bounded: a request head (maxHeaderSize), a TLS ClientHello
// (maxHelloSize), a DNS message (its 16-bit length). While such a read is
// under way its worst case is reserved, from the sandbox's budget and from
// the proxy's, so one sandbox's slow or oversized heads cannot take the
// memory the others need: past the budget a connection waits for room (up
// to peekTimeout) and is then closed. A connection that is only being
// spliced holds no reservation; its cost (two copy buffers) is bounded by
// maxPerSandbox and maxConns.
const (
	// maxHelloSize: crypto/tls refuses a handshake message over 64 KiB; a
	// few records' headers on top.
	maxHelloSize = 64<<10 + 4<<10
	// headCost is what reading one head reserves: its limit plus the
	// read-ahead buffer that holds its first bytes.
	headCost = maxHeaderSize + readBuf
	readBuf  = 4096
	// sandboxBudget and proxyBudget bound the bytes reserved at once by
	// one sandbox and by all of them.
	sandboxBudget = 16 << 20
	proxyBudget   = 128 << 20
)

// errHeadTooLarge: a request head or ClientHello went past its limit.
var errHeadTooLarge = errors.New("egress: request head over the limit")

// budget is a sandbox's open connections and its byte reservations.
type budget struct {
	conns int
	bytes *semaphore.Weighted
}

// reserve takes n bytes from the sandbox's budget b and the proxy's, waiting
// up to peekTimeout; it returns the release, or nil when there was no room.
func (p *Proxy) reserve(b *budget, n int64) func() {
	ctx, cancel := context.WithTimeout(context.Background(), peekTimeout)
	defer cancel()
	if err := p.bytes.Acquire(ctx, n); err != nil {
		return nil
	}
	if err := b.bytes.Acquire(ctx, n); err != nil {
		p.bytes.Release(n)
		return nil
	}
	return func() { b.bytes.Release(n); p.bytes.Release(n) }
}

// limited reads at most n bytes from r while n >= 0 (then errHeadTooLarge),
// and without limit while n < 0: set for each head, lifted for its body.
type limited struct {
	r io.Reader
	n int64
}

func (l *limited) Read(b []byte) (int, error) {
	if l.n < 0 {
		return l.r.Read(b)
	}
	if l.n == 0 {
		return 0, errHeadTooLarge
	}
	if int64(len(b)) > l.n {
		b = b[:l.n]
	}
	n, err := l.r.Read(b)
	l.n -= int64(n)
	return n, err
}

// deadline sets c's read deadline peekTimeout from now (a head must arrive
// whole within it), or clears it.
func deadline(c interface{ SetReadDeadline(time.Time) error }, on bool) {
	if on {
		_ = c.SetReadDeadline(time.Now().Add(peekTimeout))
		return
	}
	_ = c.SetReadDeadline(time.Time{})
}
