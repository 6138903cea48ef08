package lease

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
)

// Postgres is the cluster Leaser: a lease is a session-level advisory lock
// (pg_try_advisory_lock) held on a connection dedicated to it, so it is
// released by PostgreSQL the moment that connection ends, however the
// replica died.
//
// Timing, with Poll = p: a standby tries the lock every p. The holder
// checks its connection every p/4 with a p/4 timeout, so it cancels fn at
// most p/2 after losing the connection (its lock is gone from then on). A
// new holder waits a further p after taking the lock before starting fn:
// the old holder has been cancelled by then. Failover therefore takes at
// most 2p plus connection set-up, and fn must return within p/2 of being
// cancelled for two fns never to overlap. A holder that lost its
// connection waits 2p before competing again, so a standby wins.
type Postgres struct {
	cfg    *pgx.ConnConfig
	poll   time.Duration
	log    *slog.Logger
	holder string
}

var _ Leaser = (*Postgres)(nil)

// DefaultPoll is the poll interval NewPostgres uses for poll <= 0.
const DefaultPoll = 2 * time.Second

// NewPostgres returns a Leaser on the database dsn names.
func NewPostgres(dsn string, poll time.Duration, log *slog.Logger) (*Postgres, error) {
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return nil, errors.New("lease: cannot parse the PostgreSQL DSN")
	}
	if poll <= 0 {
		poll = DefaultPoll
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Postgres{cfg: cfg, poll: poll, log: log, holder: NewHolder()}, nil
}

// Holder is this Leaser's identity: in its logs and, as the lease
// connection's application_name, in pg_stat_activity, so an operator sees
// which replica holds which lease.
func (p *Postgres) Holder() string { return p.holder }

// NewHolder returns a holder identity unique to this process start:
// hostname, pid and a random part (two containers may share a hostname and
// a pid).
func NewHolder() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "unknown"
	}
	b := make([]byte, 4)
	rand.Read(b)
	return fmt.Sprintf("%s/%d/%s", host, os.Getpid(), hex.EncodeToString(b))
}

// Key is the advisory lock key of lease name (FNV-1a 64 of a prefixed
// name, so it stays clear of other users of advisory locks).
func Key(name string) int64 {
	h := fnv.New64a()
	h.Write([]byte("cubicle.lease/" + name))
	return int64(h.Sum64())
}

// Run implements Leaser.
func (p *Postgres) Run(ctx context.Context, name string, fn func(ctx context.Context)) {
	key := Key(name)
	var conn *pgx.Conn
	defer func() {
		if conn != nil {
			conn.Close(context.WithoutCancel(ctx))
		}
	}()
	for ctx.Err() == nil {
		if conn == nil {
			c, err := p.connect(ctx, name)
			if err != nil {
				p.log.Warn("lease: connect", "lease", name, "err", err)
				sleep(ctx, p.poll)
				continue
			}
			conn = c
		}
		held, err := p.tryLock(ctx, conn, key)
		if err != nil {
			p.log.Warn("lease: try lock", "lease", name, "err", err)
			conn.Close(context.WithoutCancel(ctx))
			conn = nil
			sleep(ctx, p.poll)
			continue
		}
		if !held {
			sleep(ctx, p.poll)
			continue
		}
		if p.hold(ctx, conn, name, fn) {
			// The connection is gone, and the lock with it. Back off two
			// polls: a standby, trying every poll, takes over first rather
			// than this replica, whose database link just failed.
			conn.Close(context.WithoutCancel(ctx))
			conn = nil
			sleep(ctx, 2*p.poll)
			continue
		}
		// ctx ended while holding: hand the lease over at once.
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), p.poll)
		conn.Exec(uctx, `SELECT pg_advisory_unlock($1)`, key)
		cancel()
	}
}

func (p *Postgres) connect(ctx context.Context, name string) (*pgx.Conn, error) {
	cfg := p.cfg.Copy()
	// Shown in pg_stat_activity: which backend holds which lease.
	// PostgreSQL truncates it to 63 bytes; the holder goes first.
	cfg.RuntimeParams["application_name"] = "cubicle " + p.holder + " " + name
	cctx, cancel := context.WithTimeout(ctx, max(5*time.Second, p.poll))
	defer cancel()
	return pgx.ConnectConfig(cctx, cfg)
}

func (p *Postgres) tryLock(ctx context.Context, conn *pgx.Conn, key int64) (bool, error) {
	qctx, cancel := context.WithTimeout(ctx, p.poll)
	defer cancel()
	var held bool
	err := conn.QueryRow(qctx, `SELECT pg_try_advisory_lock($1)`, key).Scan(&held)
	return held, err
}

// hold runs fn while conn stays healthy; it reports whether the lease was
// lost (true) or ctx ended (false), after fn has returned.
func (p *Postgres) hold(ctx context.Context, conn *pgx.Conn, name string, fn func(context.Context)) (lost bool) {
	check := p.poll / 4
	// Fencing delay: a holder whose connection just died is still running
	// until its next check fails; start only once it has stopped.
	if !p.healthyFor(ctx, conn, p.poll, check) {
		return ctx.Err() == nil
	}
	p.log.Info("lease: acquired", "lease", name, "holder", p.holder)
	fctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		fn(fctx)
	}()
	for {
		select {
		case <-done:
			cancel()
			// fn finished on its own: keep the lease until ctx ends, so
			// no other replica starts it again meanwhile.
			return !p.healthyFor(ctx, conn, -1, check) && ctx.Err() == nil
		case <-ctx.Done():
			cancel()
			<-done
			return false
		case <-time.After(check):
		}
		if !p.alive(ctx, conn, check) {
			cancel()
			<-done
			if ctx.Err() != nil {
				return false
			}
			p.log.Warn("lease: lost", "lease", name)
			return true
		}
	}
}

// healthyFor checks conn every check for d (forever when d < 0); false
// when a check fails or ctx ends.
func (p *Postgres) healthyFor(ctx context.Context, conn *pgx.Conn, d, check time.Duration) bool {
	var end <-chan time.Time
	if d >= 0 {
		end = time.After(d)
	}
	for {
		select {
		case <-end:
			return true
		case <-ctx.Done():
			return false
		case <-time.After(check):
		}
		if !p.alive(ctx, conn, check) {
			return false
		}
	}
}

// alive: a session lock lives exactly as long as its session, so a
// working connection still holds it.
func (p *Postgres) alive(ctx context.Context, conn *pgx.Conn, timeout time.Duration) bool {
	qctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	_, err := conn.Exec(qctx, `SELECT 1`)
	return err == nil
}

func sleep(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}
