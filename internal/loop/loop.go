// Package loop runs the control plane's background work on a ticker: a
// process's own loops (its node's heartbeat, its sampler) everywhere, and
// the cluster-wide ones (reaper, reconcilers, pool refill, node loss) on
// one replica at a time, under a lease.
package loop

import (
	"context"
	"log/slog"
	"math/rand/v2"
	"runtime/debug"
	"sync"
	"time"

	"github.com/cubicle-dev/cubicle/internal/lease"
)

// Spec is one loop.
type Spec struct {
	// Name names the loop in logs and, for a leased loop, its lease
	// ("loop/" + Name): two processes running a leased loop of one name
	// take turns.
	Name string
	// Every is the interval between runs (> 0).
	Every time.Duration
	// Leased: run only while this process holds the loop's lease. An
	// unleased loop runs on every process that starts it.
	Leased bool
	// Kick, when set, runs the loop at once on a receive (a trigger such
	// as "a standby was taken"); runs never overlap.
	Kick <-chan struct{}
	// Now: the first run is at once instead of after a random part of
	// Every (the jitter keeps replicas started together from running in
	// step).
	Now bool
}

// Runner starts loops. The zero value is not usable: use New.
type Runner struct {
	leaser lease.Leaser
	log    *slog.Logger
	wg     sync.WaitGroup
}

// New returns a Runner whose leased loops run under leaser (lease.Local
// in embedded mode, lease.Postgres across replicas).
func New(leaser lease.Leaser, log *slog.Logger) *Runner {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Runner{leaser: leaser, log: log}
}

// LeaseName is the lease a leased loop named name runs under.
func LeaseName(name string) string { return "loop/" + name }

// Go starts the loop in the background; Wait waits for every loop started
// so to return (they return once ctx ends).
func (r *Runner) Go(ctx context.Context, s Spec, fn func(context.Context)) {
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		r.Run(ctx, s, fn)
	}()
}

// Wait returns once every loop started with Go has returned.
func (r *Runner) Wait() { r.wg.Wait() }

// Run runs fn every s.Every until ctx ends, blocking. A leased loop runs
// fn only while the lease is held: on loss, fn's context is cancelled and
// no further run starts until the lease is taken again. A panic in fn is
// logged with its stack and the loop goes on at the next tick.
func (r *Runner) Run(ctx context.Context, s Spec, fn func(context.Context)) {
	if s.Every <= 0 {
		panic("loop: " + s.Name + ": Every must be positive")
	}
	if !s.Leased {
		r.tick(ctx, s, fn)
		return
	}
	r.leaser.Run(ctx, LeaseName(s.Name), func(lctx context.Context) {
		r.log.Debug("loop: lease held", "loop", s.Name)
		r.tick(lctx, s, fn)
	})
}

func (r *Runner) tick(ctx context.Context, s Spec, fn func(context.Context)) {
	first := time.Duration(0)
	if !s.Now {
		first = rand.N(s.Every)
	}
	wait := time.NewTimer(first)
	defer wait.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-wait.C:
		case <-s.Kick:
			wait.Stop() // Go 1.23 timers: no stale tick after Stop
		}
		r.once(ctx, s.Name, fn)
		wait.Reset(s.Every)
	}
}

// once runs fn, turning a panic into a log line: one bad pass must not
// take the process down, nor stop the loop for good.
func (r *Runner) once(ctx context.Context, name string, fn func(context.Context)) {
	defer func() {
		if p := recover(); p != nil {
			r.log.Error("loop: panic", "loop", name, "panic", p, "stack", string(debug.Stack()))
		}
	}()
	if ctx.Err() == nil {
		fn(ctx)
	}
}
