package sqlstore

import (
	"context"
	"io/fs"
	"sort"
)

// Migrate applies, in name order, each migrations/*.sql file of fsys that
// applied does not report as done. The backends keep the rest: their own
// schema_migrations table, locking and how a file runs in a transaction.
func Migrate(ctx context.Context, fsys fs.FS, applied func(ctx context.Context, name string) (bool, error), apply func(ctx context.Context, name, body string) error) error {
	names, err := fs.Glob(fsys, "migrations/*.sql")
	if err != nil {
		return err
	}
	sort.Strings(names)
	for _, name := range names {
		done, err := applied(ctx, name)
		if err != nil {
			return err
		}
		if done {
			continue
		}
		body, err := fs.ReadFile(fsys, name)
		if err != nil {
			return err
		}
		if err := apply(ctx, name, string(body)); err != nil {
			return err
		}
	}
	return nil
}
