package catalog

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/cubicle-dev/cubicle/internal/store"
	"github.com/cubicle-dev/cubicle/internal/template"
)

// BuildError is a failed build with the step it failed at ("base",
// "finalize" or a step index) for the SDK's stack trace.
type BuildError struct {
	Step string
	Err  error
}

func (e *BuildError) Error() string { return e.Err.Error() }
func (e *BuildError) Unwrap() error { return e.Err }

// worker runs one build at a time: builds are CPU- and disk-heavy and a
// small node should not run several at once.
func (c *Catalog) worker(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case id := <-c.queue:
			// runMu: the orphan sweep never sees this build half way.
			c.runMu.Lock()
			c.run(ctx, id)
			c.runMu.Unlock()
		}
	}
}

func (c *Catalog) scrub(buildID, msg string) string {
	c.mu.Lock()
	secrets := c.secrets[buildID]
	c.mu.Unlock()
	for _, s := range secrets {
		msg = strings.ReplaceAll(msg, s, "***")
	}
	// Header values never belong in logs.
	for _, h := range []string{"Authorization:", "authorization:", "X-Registry-Auth:"} {
		if i := strings.Index(msg, h); i >= 0 {
			msg = msg[:i+len(h)] + " ***"
		}
	}
	return msg
}

func (c *Catalog) logf(ctx context.Context, buildID, level, step, format string, a ...any) {
	msg := c.scrub(buildID, fmt.Sprintf(format, a...))
	if err := c.st.AppendBuildLogs(context.WithoutCancel(ctx), buildID, []store.BuildLog{{Time: time.Now().UTC(), Level: level, Message: msg, Step: step}}); err != nil {
		c.log.Warn("append build log", "build", buildID, "err", err)
	}
}

func (c *Catalog) run(ctx context.Context, buildID string) {
	start := time.Now()
	b, err := c.st.GetTemplateBuild(ctx, buildID)
	if err != nil || b.Status != store.BuildWaiting {
		return
	}
	t, err := c.st.GetTemplate(ctx, b.TemplateID)
	if err != nil {
		return
	}
	var spec storedSpec
	if err := json.Unmarshal([]byte(b.Spec), &spec); err != nil {
		c.finish(ctx, t.ID, b.ID, nil, &BuildError{Step: "base", Err: fmt.Errorf("stored build request unreadable: %v", err)}, nil)
		return
	}
	req, caller := spec.StartRequest, spec.caller()
	if v, ok := c.pending.LoadAndDelete(b.ID); ok {
		req.FromImageRegistry, _ = v.(*Registry)
	}
	if c.cfg.SharedStore {
		stop := c.heartbeat(ctx, b.ID)
		defer stop()
	}
	b.Status = store.BuildBuilding
	if err := c.retry(ctx, "mark build building", b.ID, func(ctx context.Context) error { return c.st.RecordTemplateBuild(ctx, b, nil) }); err != nil {
		// Still waiting with its spec: fail it rather than leave it queued forever.
		c.finish(ctx, t.ID, b.ID, nil, &BuildError{Step: "base", Err: errors.New("could not record the build start")}, nil)
		return
	}
	c.logf(ctx, b.ID, "info", "base", "build %s of template %s (%s) started", b.ID, t.ID, t.PrimaryName)
	job := Job{TemplateID: t.ID, BuildID: b.ID, TeamID: caller.TeamID, Start: req}
	if req.FromTemplate != "" {
		src, err := c.readyBuildOf(ctx, caller, req.FromTemplate)
		if err != nil {
			c.finish(ctx, t.ID, b.ID, nil, &BuildError{Step: "base", Err: err}, nil)
			return
		}
		job.FromImage, job.FromRootfs, job.FromImageDigest = src.Image, src.Rootfs, src.ImageDigest
	} else {
		job.FromImage = req.FromImage
	}
	out, err := c.cfg.Builder.Build(ctx, job, func(level, msg, step string) { c.logf(ctx, b.ID, level, step, "%s", msg) })
	if err != nil {
		c.finish(ctx, t.ID, b.ID, nil, err, nil)
		c.metrics.observe("error", start)
		return
	}
	// The image exists; the readyCmd probe decides (uploaded is internal).
	b.Status, b.Image, b.ImageDigest, b.Rootfs = store.BuildUploaded, out.Image, out.ImageDigest, out.Rootfs
	// Uploaded is internal (the API says building either way): a failed
	// write only loses the intermediate step; finish records the outcome.
	_ = c.retry(ctx, "mark build uploaded", b.ID, func(ctx context.Context) error { return c.st.RecordTemplateBuild(ctx, b, nil) })
	if req.ReadyCmd != "" {
		c.mu.Lock()
		p := c.prober
		c.mu.Unlock()
		if p != nil {
			c.logf(ctx, b.ID, "info", "finalize", "waiting for the ready command: %s", req.ReadyCmd)
			// Image too: a node that pulls images (a cluster node) boots
			// the probe from the registry, not from these layer paths.
			pt := template.Template{ID: t.ID, Layers: template.Layers(out.Rootfs), Image: out.Image, ImageDigest: out.ImageDigest, CPUCount: b.CPUCount, MemoryMB: b.MemoryMB, DiskSizeMB: b.DiskSizeMB,
				StartCmd: req.StartCmd, ReadyCmd: req.ReadyCmd, RunAs: out.RunAs, Workdir: out.Workdir, Env: spec.Cube.env()}
			if err := p.Probe(ctx, out.Rootfs, pt); err != nil {
				c.finish(ctx, t.ID, b.ID, nil, &BuildError{Step: "finalize", Err: fmt.Errorf("ready command failed: %v", err)}, nil)
				c.metrics.observe("error", start)
				return
			}
		}
	}
	c.finish(ctx, t.ID, b.ID, &out, nil, &req)
	if spec.Cube != nil && spec.Cube.Name != "" {
		c.claimAlias(ctx, caller, t.ID, b.ID, spec.Cube.Name)
	}
	c.metrics.observe("ready", start)
}

// finish records the outcome. Only a ready build touches the template's
// ready image; a failed one leaves the previous ready build serving. The
// write is retried; when it still fails the outcome is kept in memory for
// the sweep to write (and a restart fails the build), so a build never
// stays "building" with no worker.
func (c *Catalog) finish(ctx context.Context, templateID, buildID string, out *Output, berr error, req *StartRequest) {
	ctx = context.WithoutCancel(ctx)
	defer func() {
		c.mu.Lock()
		delete(c.secrets, buildID)
		c.mu.Unlock()
	}()
	status, reason, step := store.BuildReady, "", ""
	if berr != nil {
		step = "base"
		var be *BuildError
		if errors.As(berr, &be) && be.Step != "" {
			step = be.Step
		}
		status, reason = store.BuildError, c.scrub(buildID, berr.Error())
		c.logf(ctx, buildID, "error", step, "build failed: %s", reason)
	} else {
		c.logf(ctx, buildID, "info", "finalize", "build %s is ready", buildID)
	}
	finished := time.Now().UTC()
	record := func(ctx context.Context) error {
		b, err := c.st.GetTemplateBuild(ctx, buildID)
		if errors.Is(err, store.ErrNotFound) {
			return nil // deleted with its template meanwhile: nothing to record
		}
		if err != nil {
			return err
		}
		b.FinishedAt, b.Status = finished, status
		if berr != nil {
			b.Reason, b.Step = reason, step
		}
		if out != nil {
			// Again here: the uploaded write before the probe is best-effort,
			// and a ready row must name its image by digest.
			b.Image, b.ImageDigest, b.Rootfs = out.Image, out.ImageDigest, out.Rootfs
		}
		var ready *store.TemplateReady
		if out != nil {
			ready = &store.TemplateReady{Image: out.Image, StartCmd: req.StartCmd, ReadyCmd: req.ReadyCmd, RunAs: out.RunAs, Workdir: out.Workdir,
				CPUCount: b.CPUCount, MemoryMB: b.MemoryMB, DiskSizeMB: b.DiskSizeMB}
		}
		if err := c.st.RecordTemplateBuild(ctx, b, ready); err != nil && !errors.Is(err, store.ErrNotFound) {
			return err
		}
		c.log.Info("template build finished", "templateID", templateID, "buildID", buildID, "result", status)
		if out != nil {
			c.notifyReady(templateID)
		}
		return nil
	}
	if err := c.retry(ctx, "record build outcome", buildID, record); err != nil {
		c.mu.Lock()
		c.unrecorded[buildID] = record
		c.mu.Unlock()
	}
}

// retry runs a store write with bounded exponential backoff, logging each
// failure; the last error is returned.
func (c *Catalog) retry(ctx context.Context, what, buildID string, f func(context.Context) error) error {
	ctx = context.WithoutCancel(ctx)
	delay := c.cfg.StoreRetryDelay
	var err error
	for i := 0; i < c.cfg.StoreRetries; i++ {
		if i > 0 {
			time.Sleep(delay)
			delay = min(2*delay, 5*time.Second)
		}
		if err = f(ctx); err == nil {
			return nil
		}
		c.log.Warn("template store write failed", "what", what, "build", buildID, "attempt", i+1, "err", err)
	}
	c.log.Error("template store write gave up", "what", what, "build", buildID, "err", err)
	return err
}

// sweepLoop retries outcomes that could not be written and fails builds
// the store says are building but no worker runs (the in-process twin of
// Start's recovery).
func (c *Catalog) sweepLoop(ctx context.Context) {
	t := time.NewTicker(c.cfg.SweepInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			c.Sweep(ctx)
		}
	}
}

// Sweep runs one pass of the sweep loop.
func (c *Catalog) Sweep(ctx context.Context) {
	c.mu.Lock()
	pending := make(map[string]func(context.Context) error, len(c.unrecorded))
	for id, f := range c.unrecorded {
		pending[id] = f
	}
	c.mu.Unlock()
	for id, f := range pending {
		if err := f(context.WithoutCancel(ctx)); err != nil {
			c.log.Warn("template store write failed", "what", "record build outcome (sweep)", "build", id, "err", err)
			continue
		}
		c.mu.Lock()
		delete(c.unrecorded, id)
		c.mu.Unlock()
	}
	c.runMu.Lock()
	defer c.runMu.Unlock()
	if err := c.failOrphans(ctx); err != nil {
		c.log.Warn("template build sweep", "err", err)
	}
}

// heartbeat touches the build's row until stop is called, so that the
// other replicas' sweeps see it is running.
func (c *Catalog) heartbeat(ctx context.Context, buildID string) (stop func()) {
	ctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(c.cfg.OrphanAfter / 4)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				if err := c.st.TouchTemplateBuild(ctx, buildID); err != nil && ctx.Err() == nil {
					c.log.Warn("template build heartbeat", "build", buildID, "err", err)
				}
			}
		}
	}()
	return func() { cancel(); <-done }
}

// failOrphans fails builds in building/uploaded whose outcome is not
// waiting to be written; with runMu held no worker of this process runs,
// so their builder session is gone and they cannot finish. With a shared
// store a build whose heartbeat is recent is another replica's.
func (c *Catalog) failOrphans(ctx context.Context) error {
	return c.eachBuild(ctx, func(t *store.Template, b *store.TemplateBuild) error {
		if b.Status != store.BuildBuilding && b.Status != store.BuildUploaded {
			return nil
		}
		if c.cfg.SharedStore && time.Since(b.UpdatedAt) < c.cfg.OrphanAfter {
			return nil
		}
		c.mu.Lock()
		_, pending := c.unrecorded[b.ID]
		c.mu.Unlock()
		if !pending {
			c.finish(ctx, t.ID, b.ID, nil, errors.New("builder disappeared"), nil)
		}
		return nil
	})
}

// ---- resolution for sandbox create ------------------------------------------

// ReadyHook is told when a template's ready build changes (warm pools
// retire standbys of the previous image).
type ReadyHook func(templateID string)

func (c *Catalog) notifyReady(id string) {
	c.mu.Lock()
	hooks := append([]ReadyHook(nil), c.hooks...)
	c.mu.Unlock()
	for _, h := range hooks {
		h(id)
	}
}

// OnReady registers a hook.
func (c *Catalog) OnReady(h ReadyHook) {
	c.mu.Lock()
	c.hooks = append(c.hooks, h)
	c.mu.Unlock()
}

// Resolve implements template.Resolver for the control plane itself (the
// pool reconciler): every template, names in the default team.
func (c *Catalog) Resolve(ctx context.Context, ref string) (template.Template, error) {
	return c.resolve(ctx, System(), ref)
}

// ResolveTeam resolves ref as teamID sees templates (its own and public
// ones; any other team's is not found).
func (c *Catalog) ResolveTeam(ctx context.Context, teamID, ref string) (template.Template, error) {
	return c.resolve(ctx, Caller{TeamID: teamID}, ref)
}

// resolve goes in the CEP's order: "" → base; a name, name:tag or ID of a
// catalog template → its ready build (409 while none); otherwise the
// fallback resolver (image dirs / local images); else not found.
func (c *Catalog) resolve(ctx context.Context, caller Caller, ref string) (template.Template, error) {
	if ref == "" {
		ref = BaseID
	}
	name, tag, hasTag := strings.Cut(ref, ":")
	t, err := c.byID(ctx, caller, ref)
	if errors.Is(err, store.ErrNotFound) {
		t, err = c.st.TemplateByName(ctx, caller.TeamID, ref)
	}
	if errors.Is(err, store.ErrNotFound) && hasTag {
		// name:default and name:latest mean the ready build.
		t, err = c.st.TemplateByName(ctx, caller.TeamID, name)
		if err == nil && tag != "default" && tag != "latest" {
			t, err = nil, store.ErrNotFound
		}
	}
	if errors.Is(err, store.ErrNotFound) {
		if c.fallback != nil {
			return c.fallback.Resolve(ctx, ref)
		}
		return template.Template{}, fmt.Errorf("%w: %q", template.ErrNotFound, ref)
	}
	if err != nil {
		return template.Template{}, err
	}
	buildID := t.ReadyBuildID
	if hasTag && tag != "default" && tag != "latest" {
		if buildID, err = c.taggedBuild(ctx, t.ID, tag); err != nil {
			return template.Template{}, err
		}
	}
	if buildID == "" {
		return template.Template{}, fmt.Errorf("%w: %q (build status %s)", template.ErrNotReady, ref, APIStatus(t.BuildStatus))
	}
	b, err := c.st.GetTemplateBuild(ctx, buildID)
	if err != nil || b.Status != store.BuildReady || b.Rootfs == "" {
		return template.Template{}, fmt.Errorf("%w: %q", template.ErrNotReady, ref)
	}
	contract, err := Contract(t)
	if err != nil {
		return template.Template{}, err
	}
	img := b.Image
	if img == "" && seededBuild(t.ID, b.ID) {
		img = t.ID // a seeded built-in: the node's own images dir has it
	}
	return template.Template{ID: t.ID, Alias: name, Layers: template.Layers(b.Rootfs), Image: img, ImageDigest: b.ImageDigest, CPUCount: b.CPUCount, MemoryMB: b.MemoryMB,
		DiskSizeMB: b.DiskSizeMB, StartCmd: t.StartCmd, ReadyCmd: t.ReadyCmd, RunAs: t.RunAs, Workdir: t.Workdir, BuildID: b.ID, PoolSize: t.PoolSize,
		Accelerators: contract, Env: buildEnv(b)}, nil
}

// SetFallback resolves references that are not catalog templates.
func (c *Catalog) SetFallback(r template.Resolver) { c.fallback = r }

// Spawned records a sandbox created from the template.
func (c *Catalog) Spawned(ctx context.Context, id string) {
	if err := c.st.RecordSpawn(ctx, id, time.Now().UTC()); err != nil {
		c.log.Warn("record spawn", "template", id, "err", err)
	}
}

// ---- metrics --------------------------------------------------------------------

type metrics struct {
	builds   *prometheus.CounterVec
	duration prometheus.Histogram
}

type templatesCollector struct {
	st   store.Store
	desc *prometheus.Desc
}

func (tc templatesCollector) Describe(ch chan<- *prometheus.Desc) { ch <- tc.desc }
func (tc templatesCollector) Collect(ch chan<- prometheus.Metric) {
	counts := map[string]float64{store.BuildWaiting: 0, store.BuildBuilding: 0, store.BuildReady: 0, store.BuildError: 0}
	var after string
	for i := 0; i < 100; i++ {
		ts, err := tc.st.ListTemplates(context.Background(), after, 500)
		if err != nil || len(ts) == 0 {
			break
		}
		for _, t := range ts {
			counts[APIStatus(t.BuildStatus)]++
			after = t.ID
		}
	}
	for s, n := range counts {
		ch <- prometheus.MustNewConstMetric(tc.desc, prometheus.GaugeValue, n, s)
	}
}

func newMetrics(reg prometheus.Registerer, st store.Store) *metrics {
	m := &metrics{
		builds: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "cubicle_template_builds_total", Help: "Finished template builds by result."}, []string{"result"}),
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "cubicle_template_build_duration_seconds", Help: "Template build duration.",
			Buckets: prometheus.ExponentialBuckets(0.5, 2, 12)}),
	}
	if reg != nil {
		reg.MustRegister(m.builds, m.duration, templatesCollector{st: st,
			desc: prometheus.NewDesc("cubicle_templates", "Templates by the status of their latest build.", []string{"status"}, nil)})
	}
	return m
}

func (m *metrics) observe(result string, start time.Time) {
	m.builds.WithLabelValues(result).Inc()
	m.duration.Observe(time.Since(start).Seconds())
}
