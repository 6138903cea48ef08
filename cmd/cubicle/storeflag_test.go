package main

import (
	"context"
	"strings"
	"testing"

	"github.com/cubicle-dev/cubicle/internal/store/postgres/pgtest"
)

// A --store that is not a PostgreSQL URL, or names a server that does not
// answer, fails the command with an error naming the flag and never the
// password in the URL.
func TestStoreFlagRefusesBadDSN(t *testing.T) {
	for dsn, want := range map[string]string{
		"mysql://u:hunter2@localhost/db":                                        "--store: want a postgres://",
		"postgres://u:hunter2@127.0.0.1:1/db?sslmode=disable&connect_timeout=2": "--store: connect to 127.0.0.1:1/db",
	} {
		_, err := run(t, "team", "list", "--data-dir", t.TempDir(), "--store", dsn)
		if err == nil || !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "hunter2") {
			t.Fatalf("--store %s: want an error with %q and without the password, got %v", dsn, want, err)
		}
	}
}

// Every command that opens the store reaches the same PostgreSQL database
// through --store: a team and a key made by one command are seen by another.
func TestStoreFlagPostgres(t *testing.T) {
	dsn, err := pgtest.StartT(t).NewDatabase(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := run(t, "team", "create", "--store", dsn, "ops"); err != nil {
		t.Fatal(err)
	}
	if _, err := run(t, "apikey", "create", "--store", dsn, "--team", "ops", "--name", "pgkey"); err != nil {
		t.Fatal(err)
	}
	out, err := run(t, "apikey", "list", "--store", dsn)
	if err != nil || !strings.Contains(out, "pgkey") {
		t.Fatalf("apikey list over --store: %q %v", out, err)
	}
	// The SQLite default (no --store) is a different database.
	out, err = run(t, "apikey", "list", "--data-dir", t.TempDir())
	if err != nil || strings.Contains(out, "pgkey") {
		t.Fatalf("apikey list without --store: %q %v", out, err)
	}
}
