// Package sqlite is the embedded Store backend (modernc.org/sqlite, no cgo).
package sqlite

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"time"

	"github.com/cubicle-dev/cubicle/internal/store"
	"github.com/cubicle-dev/cubicle/internal/store/sqlstore"
	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"
)

// isConstraint reports a primary-key/unique violation by its SQLite result code.
func isConstraint(err error) bool {
	var se *sqlite.Error
	if !errors.As(err, &se) {
		return false
	}
	c := se.Code()
	return c == sqlite3.SQLITE_CONSTRAINT_PRIMARYKEY || c == sqlite3.SQLITE_CONSTRAINT_UNIQUE
}

//go:embed migrations/*.sql
var migrations embed.FS

// dialect is SQLite's: ? placeholders, the default (serializable: one
// writer) transactions, nothing to retry, and the JSON1 functions.
var dialect = &sqlstore.Dialect{
	Isolation:       sql.LevelDefault,
	IsConstraint:    isConstraint,
	MetadataHas:     `EXISTS (SELECT 1 FROM json_each(sandboxes.metadata) WHERE json_each.key = ? AND json_each.value = ?)`,
	MetadataHasNot:  `NOT EXISTS (SELECT 1 FROM json_each(sandboxes.metadata) WHERE json_each.key = ?)`,
	MetadataWithout: `json_remove(metadata, ?, ?)`,
	// A JSON path, quoted: the keys contain dots.
	MetadataPath: func(key string) string { return `$."` + key + `"` },
	NoLimit:      -1,
}

// Store is a SQLite-backed store.Store.
type Store struct {
	*sqlstore.Store
	db *sql.DB
}

var _ store.Store = (*Store)(nil)

// Open opens (creating if needed) the database file and applies migrations.
func Open(path string) (*Store, error) {
	dsn := "file:" + path + "?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)&_pragma=foreign_keys(1)&_pragma=synchronous(NORMAL)"
	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		return nil, err
	}
	// One writer at a time avoids SQLITE_BUSY storms; reads are cheap enough.
	db.SetMaxOpenConns(1)
	s := &Store{Store: sqlstore.New(db, dialect), db: db}
	if err := s.migrate(context.Background()); err != nil {
		db.Close()
		return nil, fmt.Errorf("migrate %s: %w", path, err)
	}
	return s, nil
}

func (s *Store) migrate(ctx context.Context) error {
	if _, err := s.db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS schema_migrations (name TEXT PRIMARY KEY, applied_at INTEGER NOT NULL)`); err != nil {
		return err
	}
	applied := func(ctx context.Context, name string) (bool, error) {
		var n int
		err := s.db.QueryRowContext(ctx, `SELECT COUNT(*) FROM schema_migrations WHERE name=?`, name).Scan(&n)
		return n > 0, err
	}
	return sqlstore.Migrate(ctx, migrations, applied, s.apply)
}

// apply runs one migration in a transaction on a pinned connection with
// foreign keys off, SQLite's procedure for rebuilding a table that others
// reference (the pragma is a no-op inside a transaction). The references
// are checked before the commit instead.
func (s *Store) apply(ctx context.Context, name, body string) error {
	conn, err := s.db.Conn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx, `PRAGMA foreign_keys=OFF`); err != nil {
		return err
	}
	defer conn.ExecContext(context.WithoutCancel(ctx), `PRAGMA foreign_keys=ON`)
	tx, err := conn.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, body); err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	rows, err := tx.QueryContext(ctx, `PRAGMA foreign_key_check`)
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	bad := rows.Next()
	rows.Close()
	if bad {
		return fmt.Errorf("%s: leaves dangling foreign keys", name)
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO schema_migrations(name, applied_at) VALUES(?,?)`, name, time.Now().Unix()); err != nil {
		return err
	}
	return tx.Commit()
}
