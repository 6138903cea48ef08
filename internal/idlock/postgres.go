package idlock

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// Postgres serialises work per ID across processes on one database: the
// lock is a session-level advisory lock on a hash of the ID, held on a
// pooled connection dedicated to it until release. A replica that dies
// loses its connections, and PostgreSQL drops their locks with them.
//
// Callers in one process first queue on a Map, so one process holds at
// most one connection per locked ID however many of its callers wait.
type Postgres struct {
	pool  *pgxpool.Pool
	ns    string
	local Map
}

var _ Locker = (*Postgres)(nil)

// DefaultMaxConns bounds the connections a Postgres locker holds: one per
// ID locked at once (a create holds its sandbox's for the whole create).
const DefaultMaxConns = 64

// unlockTimeout bounds a release's unlock; past it the connection is
// closed, which drops the lock all the same.
const unlockTimeout = 10 * time.Second

// NewPostgres returns a Locker over the database dsn names. ns keeps its
// keys apart from other lockers' ("sandbox"); maxConns <= 0 is
// DefaultMaxConns. Close it when done.
func NewPostgres(ctx context.Context, dsn, ns string, maxConns int32) (*Postgres, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, errors.New("idlock: cannot parse the PostgreSQL DSN")
	}
	if maxConns <= 0 {
		maxConns = DefaultMaxConns
	}
	cfg.MaxConns = maxConns
	cfg.MinConns = 0
	// Shown in pg_stat_activity beside the locks it holds.
	cfg.ConnConfig.RuntimeParams["application_name"] = "cubicle idlock " + ns
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("idlock: %w", err)
	}
	return &Postgres{pool: pool, ns: ns}, nil
}

// Close closes the pool (after every lock is released).
func (p *Postgres) Close() { p.pool.Close() }

// Key is the advisory lock key of id in namespace ns (FNV-1a 64 of a
// prefixed name, clear of the lease keys). Two IDs with one key only
// serialise needlessly.
func Key(ns, id string) int64 {
	h := fnv.New64a()
	h.Write([]byte("cubicle.idlock/" + ns + "/" + id))
	return int64(h.Sum64())
}

// Acquire implements Locker.
func (p *Postgres) Acquire(ctx context.Context, id string) (func(), error) {
	releaseLocal, err := p.local.Acquire(ctx, id)
	if err != nil {
		return nil, err
	}
	conn, err := p.pool.Acquire(ctx)
	if err != nil {
		releaseLocal()
		return nil, p.err(ctx, id, err)
	}
	key := Key(p.ns, id)
	if _, err := conn.Exec(ctx, `SELECT pg_advisory_lock($1)`, key); err != nil {
		// A wait cancelled just as it was granted may hold the lock:
		// ending the session drops whatever it holds (taken from the
		// pool first, so the pool's count is right at once).
		conn.Hijack().Close(context.Background())
		releaseLocal()
		return nil, p.err(ctx, id, err)
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			uctx, cancel := context.WithTimeout(context.Background(), unlockTimeout)
			var unlocked bool
			err := conn.QueryRow(uctx, `SELECT pg_advisory_unlock($1)`, key).Scan(&unlocked)
			if err != nil || !unlocked {
				// The session's state is unknown: end it, and the lock
				// with it, rather than pool a connection that may hold it.
				conn.Hijack().Close(uctx)
			} else {
				conn.Release()
			}
			cancel()
			releaseLocal()
		})
	}, nil
}

func (p *Postgres) err(ctx context.Context, id string, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("lock %s: %w", id, ctx.Err())
	}
	return fmt.Errorf("lock %s: %w", id, err)
}

// Held implements Locker: local entries plus connections out of the pool.
func (p *Postgres) Held() int { return p.local.Len() + int(p.pool.Stat().AcquiredConns()) }
