package main

import (
	"context"
	"log/slog"
	"strings"
	"testing"

	"github.com/spf13/pflag"

	"github.com/cubicle-dev/cubicle/internal/idlock"
	"github.com/cubicle-dev/cubicle/internal/lease"
	"github.com/cubicle-dev/cubicle/internal/store/postgres/pgtest"
)

// A zero or negative node-loss or lease flag is refused by name, never
// taken as "off" or a default.
func TestReplicaFlagsRefuseNonPositive(t *testing.T) {
	for _, args := range [][]string{
		{"--node-lost-after", "0s"}, {"--node-lost-grace", "-1m"}, {"--lease-poll", "0s"},
	} {
		var o replicaOptions
		f := pflag.NewFlagSet("serve", pflag.ContinueOnError)
		addReplicaFlags(f, &o)
		if err := f.Parse(args); err != nil {
			t.Fatal(err)
		}
		if err := o.validate(); err == nil || !strings.Contains(err.Error(), args[0]) {
			t.Fatalf("%v: %v, want an error naming the flag", args, err)
		}
	}
	var o replicaOptions
	f := pflag.NewFlagSet("serve", pflag.ContinueOnError)
	addReplicaFlags(f, &o)
	if err := f.Parse(nil); err != nil || o.validate() != nil {
		t.Fatalf("defaults: %v %v", err, o.validate())
	}
}

// SQLite (one replica) gets in-process leases and locks; a PostgreSQL
// store gets advisory-lock ones with a holder identity of this process.
func TestReplicaCoordinationFollowsTheStore(t *testing.T) {
	ctx := context.Background()
	o := replicaOptions{leasePoll: lease.DefaultPoll}
	log := slog.New(slog.DiscardHandler)
	l, locks, closeLocks, err := replicaCoordination(ctx, "", o, log)
	if err != nil {
		t.Fatal(err)
	}
	closeLocks()
	if _, ok := l.(*lease.Local); !ok {
		t.Fatalf("SQLite leaser %T", l)
	}
	if _, ok := locks.(*idlock.Map); !ok {
		t.Fatalf("SQLite locker %T", locks)
	}
	dsn, err := pgtest.StartT(t).NewDatabase(ctx)
	if err != nil {
		t.Fatal(err)
	}
	l, locks, closeLocks, err = replicaCoordination(ctx, dsn, o, log)
	if err != nil {
		t.Fatal(err)
	}
	defer closeLocks()
	pl, ok := l.(*lease.Postgres)
	if !ok || pl.Holder() == "" || pl.Holder() == lease.NewHolder() {
		t.Fatalf("PostgreSQL leaser %T", l)
	}
	if _, ok := locks.(*idlock.Postgres); !ok {
		t.Fatalf("PostgreSQL locker %T", locks)
	}
}
