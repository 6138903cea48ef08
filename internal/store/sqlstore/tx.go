package sqlstore

import (
	"context"
	"database/sql"
	"fmt"
	"math/rand/v2"
	"time"
)

// db and txn run every query through the dialect's placeholder rewriting,
// and begin every transaction at the dialect's isolation level, so a check
// and the write that depends on it (a quota, the volume delete guard, a
// pool claim) act as one step however many writers the database has.
type db struct {
	*sql.DB
	d *Dialect
}

type txn struct {
	*sql.Tx
	d *Dialect
}

type querier interface {
	QueryContext(ctx context.Context, q string, args ...any) (*sql.Rows, error)
}

func (d db) ExecContext(ctx context.Context, q string, args ...any) (sql.Result, error) {
	return d.DB.ExecContext(ctx, d.d.rebind(q), args...)
}

func (d db) QueryContext(ctx context.Context, q string, args ...any) (*sql.Rows, error) {
	return d.DB.QueryContext(ctx, d.d.rebind(q), args...)
}

func (d db) QueryRowContext(ctx context.Context, q string, args ...any) *sql.Row {
	return d.DB.QueryRowContext(ctx, d.d.rebind(q), args...)
}

func (d db) BeginTx(ctx context.Context) (*txn, error) {
	t, err := d.DB.BeginTx(ctx, &sql.TxOptions{Isolation: d.d.Isolation})
	if err != nil {
		return nil, err
	}
	return &txn{t, d.d}, nil
}

func (t *txn) ExecContext(ctx context.Context, q string, args ...any) (sql.Result, error) {
	return t.Tx.ExecContext(ctx, t.d.rebind(q), args...)
}

func (t *txn) QueryContext(ctx context.Context, q string, args ...any) (*sql.Rows, error) {
	return t.Tx.QueryContext(ctx, t.d.rebind(q), args...)
}

func (t *txn) QueryRowContext(ctx context.Context, q string, args ...any) *sql.Row {
	return t.Tx.QueryRowContext(ctx, t.d.rebind(q), args...)
}

// maxAttempts bounds the reruns of a transaction that failed in a way the
// dialect calls retryable (a serialization conflict, a deadlock).
const maxAttempts = 20

// retry runs fn again while it fails with an error the dialect calls
// retryable. fn must be a whole transaction (begin to commit) so a retry
// starts clean.
func retry(ctx context.Context, d *Dialect, fn func() error) error {
	_, err := retry1(ctx, d, func() (struct{}, error) { return struct{}{}, fn() })
	return err
}

func retry1[T any](ctx context.Context, d *Dialect, fn func() (T, error)) (T, error) {
	var v T
	var err error
	for attempt := range maxAttempts {
		v, err = fn()
		if d.Retryable == nil || !d.Retryable(err) || ctx.Err() != nil {
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
