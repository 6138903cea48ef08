package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/cubicle-dev/cubicle/internal/store"
	"github.com/cubicle-dev/cubicle/internal/store/postgres"
	"github.com/cubicle-dev/cubicle/internal/store/sqlite"
)

const storeUsage = "the database: empty for SQLite in the data dir, or a postgres://user@host/db?... URL (cluster mode: every control-plane replica and CLI command names the same one)"

// addStoreFlag registers --store, the flag every command that opens the
// store takes.
func addStoreFlag(f *pflag.FlagSet, dsn *string) { f.StringVar(dsn, "store", "", storeUsage) }

// storeOpenTimeout bounds connecting to PostgreSQL and migrating at start.
const storeOpenTimeout = 30 * time.Second

// openStore opens "the store": SQLite in dataDir when dsn is empty, else
// the PostgreSQL database dsn names. Errors name the flag and never echo
// the DSN (it may hold a password).
func openStore(ctx context.Context, dataDir, dsn string) (store.Store, error) {
	if dsn == "" {
		if err := os.MkdirAll(dataDir, 0o700); err != nil {
			return nil, err
		}
		return sqlite.Open(filepath.Join(dataDir, "cubicle.db"))
	}
	if !strings.HasPrefix(dsn, "postgres://") && !strings.HasPrefix(dsn, "postgresql://") {
		return nil, errors.New("--store: want a postgres:// (or postgresql://) URL, or nothing for SQLite in the data dir")
	}
	ctx, cancel := context.WithTimeout(ctx, storeOpenTimeout)
	defer cancel()
	st, err := postgres.Open(ctx, dsn)
	if err != nil {
		return nil, fmt.Errorf("--store: %w", err)
	}
	return st, nil
}

// withStore opens the store for one CLI command.
func withStore(ctx context.Context, dataDir, dsn string, fn func(store.Store) error) error {
	st, err := openStore(ctx, dataDir, dsn)
	if err != nil {
		return err
	}
	defer st.Close()
	return fn(st)
}
