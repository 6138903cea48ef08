package catalog

import (
	"context"
	"encoding/json"
	"time"

	"github.com/cubicle-dev/cubicle/internal/store"
)

// CollectorConfig configures the garbage collector of what template
// requests leave behind. Its state is the store and the context dir, so a
// restart loses nothing: the first pass runs at start.
type CollectorConfig struct {
	Interval       time.Duration // between passes (default 1h)
	IdempotencyTTL time.Duration // Idempotency-Key replay window (default 24h)
	ContextTTL     time.Duration // unreferenced build contexts older than this go (default 24h)
	// Contexts removes uploaded build contexts older than maxAge except the
	// hashes keep reports (contextstore.Store.GCExcept); nil skips them.
	Contexts func(maxAge time.Duration, keep func(hash string) bool) (int, error)
	// Also runs each pass (the API's expired upload grants).
	Also func()
}

func (cfg *CollectorConfig) defaults() {
	if cfg.Interval == 0 {
		cfg.Interval = time.Hour
	}
	if cfg.IdempotencyTTL == 0 {
		cfg.IdempotencyTTL = 24 * time.Hour
	}
	if cfg.ContextTTL == 0 {
		cfg.ContextTTL = 24 * time.Hour
	}
}

// RunCollector collects now and then every cfg.Interval until ctx ends.
func (c *Catalog) RunCollector(ctx context.Context, cfg CollectorConfig) {
	cfg.defaults()
	t := time.NewTicker(cfg.Interval)
	defer t.Stop()
	for {
		c.Collect(ctx, cfg)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Collect runs one pass: expired idempotency keys, unreferenced old build
// contexts, then cfg.Also. Failures are logged; the next pass retries.
func (c *Catalog) Collect(ctx context.Context, cfg CollectorConfig) {
	cfg.defaults()
	if n, err := c.st.DeleteIdempotencyBefore(ctx, time.Now().UTC().Add(-cfg.IdempotencyTTL)); err != nil {
		c.log.Warn("collect idempotency keys", "err", err)
	} else if n > 0 {
		c.log.Info("collected idempotency keys", "removed", n)
	}
	if cfg.Contexts != nil {
		refs, err := c.referencedContexts(ctx)
		if err != nil {
			// Without the reference set nothing is known safe to remove.
			c.log.Warn("collect build contexts", "err", err)
		} else if n, err := cfg.Contexts(cfg.ContextTTL, func(h string) bool { return refs[h] }); err != nil {
			c.log.Warn("collect build contexts", "removed", n, "err", err)
		} else if n > 0 {
			c.log.Info("collected build contexts", "removed", n)
		}
	}
	if cfg.Also != nil {
		cfg.Also()
	}
}

// referencedContexts is the set of filesHash values that builds still to
// run (queued) or running read.
func (c *Catalog) referencedContexts(ctx context.Context) (map[string]bool, error) {
	refs := map[string]bool{}
	err := c.eachBuild(ctx, func(_ *store.Template, b *store.TemplateBuild) error {
		if b.Spec == "" || (b.Status != store.BuildWaiting && b.Status != store.BuildBuilding && b.Status != store.BuildUploaded) {
			return nil
		}
		var spec storedSpec
		if err := json.Unmarshal([]byte(b.Spec), &spec); err != nil {
			return nil
		}
		for _, s := range spec.Steps {
			if s.FilesHash != "" {
				refs[s.FilesHash] = true
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return refs, nil
}
