package lease

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// ErrHeld is what a HeldError matches: another process holds the claim.
var ErrHeld = errors.New("lease: held by another process")

// HeldError says which claim is held, and by whom (the holder's
// application_name in pg_stat_activity; "" when it could not be read).
type HeldError struct {
	Name   string
	Holder string
}

func (e *HeldError) Error() string {
	if e.Holder == "" {
		return fmt.Sprintf("%s is held by another process on this database", e.Name)
	}
	return fmt.Sprintf("%s is held by another process on this database (%s)", e.Name, e.Holder)
}

func (e *HeldError) Unwrap() error { return ErrHeld }

// Claim is a lease taken for a process's whole life, for what only one
// process may be at a time (an embedded node's ID): the same session-level
// advisory lock as Run's, on a connection of its own, so PostgreSQL
// releases it the moment the process dies, however it dies. A restart of
// the holder therefore finds it free.
type Claim struct {
	p    *Postgres
	name string
	key  int64

	cancel context.CancelFunc
	done   chan struct{}
	lost   chan struct{}

	mu   sync.Mutex
	conn *pgx.Conn
}

// Claim takes name now, or fails with a *HeldError when another process
// holds it. Until Close, the connection is checked every poll; when it
// fails (a database restart) the claim is taken again on a new one, and
// if another process took it meanwhile, Lost is closed.
func (p *Postgres) Claim(ctx context.Context, name string) (*Claim, error) {
	conn, err := p.connect(ctx, name)
	if err != nil {
		return nil, fmt.Errorf("lease %s: %w", name, err)
	}
	key := Key(name)
	held, err := p.tryLock(ctx, conn, key)
	if err == nil && !held {
		err = &HeldError{Name: name, Holder: p.holderOf(ctx, conn, key)}
	}
	if err != nil {
		conn.Close(context.WithoutCancel(ctx))
		return nil, err
	}
	mctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	c := &Claim{p: p, name: name, key: key, conn: conn, cancel: cancel, done: make(chan struct{}), lost: make(chan struct{})}
	go c.maintain(mctx)
	return c, nil
}

// holderOf reads who holds the advisory lock key (best effort).
func (p *Postgres) holderOf(ctx context.Context, conn *pgx.Conn, key int64) string {
	qctx, cancel := context.WithTimeout(ctx, p.poll)
	defer cancel()
	var app string
	// A bigint advisory key is classid (high half) and objid (low half),
	// objsubid 1.
	err := conn.QueryRow(qctx, `SELECT a.application_name FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
		WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
		  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
		  AND l.classid::text::bigint = ($1::bigint >> 32) & 4294967295
		  AND l.objid::text::bigint = $1::bigint & 4294967295
		LIMIT 1`, key).Scan(&app)
	if err != nil {
		return ""
	}
	return app
}

// Lost is closed when the claim was lost to another process (after a
// failed connection); the claim is not taken again after that.
func (c *Claim) Lost() <-chan struct{} { return c.lost }

// Close releases the claim.
func (c *Claim) Close() {
	c.cancel()
	<-c.done
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.conn != nil {
		ctx, cancel := context.WithTimeout(context.Background(), c.p.poll)
		// Unlocked before the close returns: a closed connection's backend
		// drops its locks only when it exits, after Close, so the next
		// taker (a serve restarting, a forget) could still find it held.
		c.conn.Exec(ctx, `SELECT pg_advisory_unlock($1)`, c.key)
		c.conn.Close(ctx)
		cancel()
		c.conn = nil
	}
}

func (c *Claim) maintain(ctx context.Context) {
	defer close(c.done)
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(c.p.poll):
		}
		c.mu.Lock()
		conn := c.conn
		c.mu.Unlock()
		if conn != nil && c.p.alive(ctx, conn, c.p.poll) {
			continue
		}
		if ctx.Err() != nil {
			return
		}
		// The session is gone, and the lock with it: take it again.
		if conn != nil {
			conn.Close(context.WithoutCancel(ctx))
			c.mu.Lock()
			c.conn = nil
			c.mu.Unlock()
			c.p.log.Warn("lease: claim's connection failed; taking it again", "lease", c.name)
		}
		nc, err := c.p.connect(ctx, c.name)
		if err != nil {
			continue
		}
		held, err := c.p.tryLock(ctx, nc, c.key)
		if err != nil {
			nc.Close(context.WithoutCancel(ctx))
			continue
		}
		if !held {
			holder := c.p.holderOf(ctx, nc, c.key)
			nc.Close(context.WithoutCancel(ctx))
			c.p.log.Error("lease: claim lost to another process", "lease", c.name, "holder", holder)
			close(c.lost)
			return
		}
		c.mu.Lock()
		c.conn = nc
		c.mu.Unlock()
	}
}
