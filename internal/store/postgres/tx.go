package postgres

import (
	"context"
	"database/sql"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"time"
)

// db and tx run the queries shared with the SQLite backend's shape: they
// turn its ? placeholders into PostgreSQL's $n, and every transaction is
// SERIALIZABLE, so a check and the write that depends on it (a quota, the
// volume delete guard, a pool claim) act as one step across replicas.
type db struct{ *sql.DB }

type txn struct{ *sql.Tx }

type querier interface {
	QueryContext(ctx context.Context, q string, args ...any) (*sql.Rows, error)
}

func (d db) ExecContext(ctx context.Context, q string, args ...any) (sql.Result, error) {
	return d.DB.ExecContext(ctx, rebind(q), args...)
}

func (d db) QueryContext(ctx context.Context, q string, args ...any) (*sql.Rows, error) {
	return d.DB.QueryContext(ctx, rebind(q), args...)
}

func (d db) QueryRowContext(ctx context.Context, q string, args ...any) *sql.Row {
	return d.DB.QueryRowContext(ctx, rebind(q), args...)
}

func (d db) BeginTx(ctx context.Context) (*txn, error) {
	t, err := d.DB.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelSerializable})
	if err != nil {
		return nil, err
	}
	return &txn{t}, nil
}

func (t *txn) ExecContext(ctx context.Context, q string, args ...any) (sql.Result, error) {
	return t.Tx.ExecContext(ctx, rebind(q), args...)
}

func (t *txn) QueryContext(ctx context.Context, q string, args ...any) (*sql.Rows, error) {
	return t.Tx.QueryContext(ctx, rebind(q), args...)
}

func (t *txn) QueryRowContext(ctx context.Context, q string, args ...any) *sql.Row {
	return t.Tx.QueryRowContext(ctx, rebind(q), args...)
}

var rebound sync.Map // query text -> rewritten text

// rebind numbers ? placeholders outside quoted literals. No query here
// uses PostgreSQL's jsonb ? operator (jsonb_exists is used instead).
func rebind(q string) string {
	if v, ok := rebound.Load(q); ok {
		return v.(string)
	}
	var b strings.Builder
	n, quoted := 0, false
	for i := 0; i < len(q); i++ {
		c := q[i]
		switch {
		case c == '\'':
			quoted = !quoted
		case c == '?' && !quoted:
			n++
			b.WriteString("$" + strconv.Itoa(n))
			continue
		}
		b.WriteByte(c)
	}
	out := b.String()
	rebound.Store(q, out)
	return out
}

// maxAttempts bounds the retries of a transaction that lost a
// serialization conflict (SQLSTATE 40001) or a deadlock (40P01).
const maxAttempts = 20

func retryable(err error) bool {
	c := pgCode(err)
	return c == "40001" || c == "40P01"
}

// retry runs fn again while it fails with a serialization failure. fn must
// be a whole transaction (begin to commit) so a retry starts clean.
func retry(ctx context.Context, fn func() error) error {
	_, err := retry1(ctx, func() (struct{}, error) { return struct{}{}, fn() })
	return err
}

func retry1[T any](ctx context.Context, fn func() (T, error)) (T, error) {
	var v T
	var err error
	for attempt := range maxAttempts {
		v, err = fn()
		if !retryable(err) || ctx.Err() != nil {
			return v, err
		}
		// A short random pause spreads the losers out so they do not
		// collide again in lockstep.
		select {
		case <-ctx.Done():
			return v, err
		case <-time.After(time.Duration(rand.Int64N(int64(attempt+1) * int64(time.Millisecond)))):
		}
	}
	return v, fmt.Errorf("%w (gave up after %d attempts)", err, maxAttempts)
}
