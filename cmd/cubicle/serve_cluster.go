package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/spf13/pflag"

	"github.com/cubicle-dev/cubicle/internal/control"
	"github.com/cubicle-dev/cubicle/internal/idlock"
	"github.com/cubicle-dev/cubicle/internal/lease"
)

// replicaOptions are the control plane's flags for running beside other
// replicas: leases for the cluster-wide loops, node loss.
type replicaOptions struct {
	nodeLostAfter, nodeLostGrace time.Duration
	leasePoll                    time.Duration
}

func addReplicaFlags(f *pflag.FlagSet, o *replicaOptions) {
	f.DurationVar(&o.nodeLostAfter, "node-lost-after", control.DefaultNodeLostAfter, "a node silent (no heartbeat) this long is lost: its running and paused sandboxes show state lost and new sandboxes go elsewhere")
	f.DurationVar(&o.nodeLostGrace, "node-lost-grace", control.DefaultNodeLostGrace, "how long a lost node's sandboxes stay lost before they are killed (their volume attachments stay until the node returns or `cubicle node forget`)")
	f.DurationVar(&o.leasePoll, "lease-poll", lease.DefaultPoll, "with --store postgres://: how often a standby replica tries the leases of the cluster-wide loops; a dead holder's loops move within about twice this")
}

func (o replicaOptions) validate() error {
	if o.nodeLostAfter <= 0 {
		return errors.New("--node-lost-after must be positive")
	}
	if o.nodeLostGrace <= 0 {
		return errors.New("--node-lost-grace must be positive")
	}
	if o.leasePoll <= 0 {
		return errors.New("--lease-poll must be positive")
	}
	return nil
}

// replicaCoordination returns what serializes this control plane with
// others on its store: PostgreSQL advisory-lock leases and per-sandbox
// locks on a PostgreSQL store; in-process ones on SQLite (one replica).
// close releases the lock connections.
func replicaCoordination(ctx context.Context, dsn string, o replicaOptions, log *slog.Logger) (lease.Leaser, idlock.Locker, func(), error) {
	if dsn == "" {
		return lease.NewLocal(), &idlock.Map{}, func() {}, nil
	}
	l, err := lease.NewPostgres(dsn, o.leasePoll, log)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("--store: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, storeOpenTimeout)
	defer cancel()
	locks, err := idlock.NewPostgres(ctx, dsn, "sandbox", 0)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("--store: sandbox locks: %w", err)
	}
	log.Info("replica: cluster-wide loops run under PostgreSQL leases", "holder", l.Holder(), "lease_poll", o.leasePoll)
	return l, locks, locks.Close, nil
}
