// Package postgres is the Store backend for clusters: several control-plane
// replicas share one PostgreSQL database (pgx v5). Multi-statement steps run
// in SERIALIZABLE transactions, retried a bounded number of times on
// serialization failures (see the dialect below); single-statement compare-and-sets run
// at READ COMMITTED, where PostgreSQL re-checks the WHERE clause on the
// latest row version.
package postgres

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/cubicle-dev/cubicle/internal/store"
	"github.com/cubicle-dev/cubicle/internal/store/sqlstore"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
)

// isConstraint reports a primary-key/unique violation by its SQLSTATE.
func isConstraint(err error) bool { return pgCode(err) == "23505" } // unique_violation

func pgCode(err error) string {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Code
	}
	return ""
}

//go:embed migrations/*.sql
var migrations embed.FS

// dialect is PostgreSQL's: $n placeholders, SERIALIZABLE transactions
// retried on serialization failures (40001) and deadlocks (40P01), typed
// placeholders where the type cannot be inferred, and jsonb operators (the
// metadata column is text). The jsonb ? operator is not used: it would read
// as a placeholder.
var dialect = &sqlstore.Dialect{
	Numbered:  true,
	Isolation: sql.LevelSerializable,
	Retryable: func(err error) bool {
		c := pgCode(err)
		return c == "40001" || c == "40P01"
	},
	IsConstraint:    isConstraint,
	Typed:           func(sqlType string) string { return "?::" + sqlType },
	MetadataHas:     `sandboxes.metadata::jsonb ->> ?::text = ?::text`,
	MetadataHasNot:  `NOT jsonb_exists(sandboxes.metadata::jsonb, ?::text)`,
	MetadataWithout: `(metadata::jsonb - ?::text - ?::text)::text`,
	MetadataPath:    func(key string) string { return key },
	NoLimit:         math.MaxInt32,
}

// Store is a PostgreSQL-backed store.Store.
type Store struct {
	*sqlstore.Store
	pool *pgxpool.Pool
	db   *sql.DB
}

var _ store.Store = (*Store)(nil)

// ErrDSN is what Open returns (wrapped) for a DSN it cannot parse.
var ErrDSN = errors.New("postgres: bad DSN")

// Open connects to the database named by dsn (a postgres:// URL or
// key=value string), checks that it answers and applies migrations.
func Open(ctx context.Context, dsn string) (*Store, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		// pgx's message may quote the password: say only what is wrong.
		return nil, fmt.Errorf("%w: %s", ErrDSN, redactDSNError(err))
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("connect to %s:%d/%s: %w", cfg.ConnConfig.Host, cfg.ConnConfig.Port, cfg.ConnConfig.Database, err)
	}
	sqlDB := stdlib.OpenDBFromPool(pool)
	s := &Store{Store: sqlstore.New(sqlDB, dialect), pool: pool, db: sqlDB}
	if err := s.migrate(ctx); err != nil {
		s.Close()
		return nil, fmt.Errorf("migrate: %w", err)
	}
	return s, nil
}

func redactDSNError(err error) string {
	var pe *pgconn.ParseConfigError
	if errors.As(err, &pe) {
		if inner := errors.Unwrap(pe); inner != nil {
			return inner.Error()
		}
	}
	return "cannot parse"
}

// migrateLock is the session advisory lock key that serialises migrations
// when several control-plane replicas start against one database.
const migrateLock = 0x637562696d6967 // "cubimig"

func (s *Store) migrate(ctx context.Context) error {
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, `SELECT pg_advisory_lock($1)`, int64(migrateLock)); err != nil {
		return err
	}
	defer conn.Exec(context.WithoutCancel(ctx), `SELECT pg_advisory_unlock($1)`, int64(migrateLock))
	if _, err := conn.Exec(ctx, `CREATE TABLE IF NOT EXISTS schema_migrations (name TEXT PRIMARY KEY, applied_at BIGINT NOT NULL)`); err != nil {
		return err
	}
	applied := func(ctx context.Context, name string) (bool, error) {
		var n int
		err := conn.QueryRow(ctx, `SELECT COUNT(*) FROM schema_migrations WHERE name=$1`, name).Scan(&n)
		return n > 0, err
	}
	return sqlstore.Migrate(ctx, migrations, applied, func(ctx context.Context, name, body string) error {
		tx, err := conn.Begin(ctx)
		if err != nil {
			return err
		}
		// The simple protocol runs a multi-statement file in one call.
		if _, err := tx.Exec(ctx, body, pgx.QueryExecModeSimpleProtocol); err != nil {
			tx.Rollback(ctx)
			return fmt.Errorf("%s: %w", name, err)
		}
		if _, err := tx.Exec(ctx, `INSERT INTO schema_migrations(name, applied_at) VALUES($1,$2)`, name, time.Now().Unix()); err != nil {
			tx.Rollback(ctx)
			return err
		}
		return tx.Commit(ctx)
	})
}

// Close closes the database handle and the pool under it.
func (s *Store) Close() error {
	err := s.Store.Close()
	s.pool.Close()
	return err
}
