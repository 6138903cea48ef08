// Package catalog is the e2b template catalog: templates, names and tags,
// builds and their logs, on top of the store. Builds run in the background
// through a Builder; sandboxes resolve templates through Resolve.
package catalog

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/cubicle-dev/cubicle/internal/accel"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/cubicle-dev/cubicle/internal/store"
	"github.com/cubicle-dev/cubicle/internal/template"
)

// Typed errors, mapped to HTTP statuses by the API.
var (
	ErrNotFound       = errors.New("template not found")
	ErrBuildNotFound  = errors.New("template build not found")
	ErrInvalid        = errors.New("invalid template request")
	ErrConflict       = errors.New("template conflict")
	ErrNotImplemented = errors.New("not implemented")
)

// BaseID is the seeded template every empty templateID means.
const BaseID = template.BaseTemplate

// CodeInterpreterID is the seeded code interpreter template (base + the
// ipykernel layer; the agent serves e2b's interpreter on port 49999 in it).
const CodeInterpreterID = template.CodeInterpreterTemplate

// The names of the built-in templates (e2b's default aliases): reserved, so
// no team can shadow them.
var (
	baseNames            = []string{"base", "python"}
	codeInterpreterNames = []string{"code-interpreter-v1", "code-interpreter"}
	builtinNames         = append(append([]string{}, baseNames...), codeInterpreterNames...)
)

// ValidName reports whether s can be a template's name (without a tag).
func ValidName(s string) bool { return nameRE.MatchString(s) }

// builtin reports whether id is a seeded template.
func builtin(id string) bool { return id == BaseID || id == CodeInterpreterID }

var (
	// At most 64 characters, CubeAPI's limit, so a name made through
	// either API can be looked up through both (a longer one made by an
	// earlier version still resolves).
	nameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,63}$`)
	tagRE  = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9._-]{0,127}$`)
)

// Job is one build for the Builder.
type Job struct {
	TemplateID string
	BuildID    string
	// TeamID is whose uploaded build contexts the COPY steps read: the team
	// of the key that started the build.
	TeamID string
	Start  StartRequest
	// FromImage is the base image reference (fromImage, or the ready image
	// of fromTemplate); FromRootfs is fromTemplate's unpacked rootfs.
	FromImage  string
	FromRootfs string
	// FromImageDigest is FromImage's manifest digest when a ready build
	// recorded it (fromTemplate).
	FromImageDigest string
}

// Output is what a successful build produced.
type Output struct {
	Image string // reference in the local image store
	// ImageDigest is Image's manifest digest ("sha256:<hex>"), recorded
	// in the build's row; "" when the build has no image of its own.
	ImageDigest string
	Rootfs      string // unpacked lower layer for the runtime
	RunAs       string
	Workdir     string
}

// LogFunc receives build log lines.
type LogFunc func(level, message, step string)

// Builder turns a build request into an image and a rootfs.
type Builder interface {
	// Validate rejects a request synchronously (wrap ErrInvalid).
	Validate(ctx context.Context, job Job) error
	Build(ctx context.Context, job Job, log LogFunc) (Output, error)
}

// Prober runs a template's readyCmd against a fresh sandbox of a build.
type Prober interface {
	Probe(ctx context.Context, rootfs string, t template.Template) error
}

// Config wires the catalog.
type Config struct {
	Store      store.Store
	Builder    Builder
	BaseRootfs string // the seeded base template's rootfs
	// CodeInterpreterRootfs is the seeded code-interpreter-v1 template's
	// layered rootfs (template.JoinLayers); "" = not installed.
	CodeInterpreterRootfs string
	// CodeInterpreterMemoryMB is code-interpreter-v1's memory when it is
	// seeded (default 2048, e2b's size for it: kernels for python,
	// JavaScript, R and Java fit; MaxMemoryMB when lower).
	CodeInterpreterMemoryMB int
	CPUCount                int
	MemoryMB                int
	DiskSizeMB              int
	// Server maxima for a template's sizes (0 = 64 CPUs, 1 TiB memory, no
	// disk bound); a request above one is ErrInvalid naming it.
	MaxCPUCount   int
	MaxMemoryMB   int
	MaxDiskSizeMB int
	Logger        *slog.Logger
	Registry      prometheus.Registerer
	// StoreRetries and StoreRetryDelay bound the retries of a build's
	// state writes (default 5 tries from 100ms, doubling); SweepInterval
	// is how often unwritten outcomes are retried and orphaned builds
	// failed (default 30s).
	StoreRetries    int
	StoreRetryDelay time.Duration
	SweepInterval   time.Duration
	// SharedStore says other control-plane replicas use the same store
	// (PostgreSQL): a build in progress may be another replica's, so it is
	// an orphan only when its row's heartbeat (TouchTemplateBuild, every
	// OrphanAfter/4 while it runs) is older than OrphanAfter (default 2m).
	// False: this process runs every build, and one it does not run is an
	// orphan at once.
	SharedStore bool
	OrphanAfter time.Duration
}

// Catalog is the template service.
type Catalog struct {
	cfg   Config
	st    store.Store
	log   *slog.Logger
	queue chan string

	runMu sync.Mutex // held by the worker for a build and by the orphan sweep

	mu         sync.Mutex
	unrecorded map[string]func(context.Context) error // buildID -> outcome write still to do
	prober     Prober
	secrets    map[string][]string // buildID -> strings to scrub from logs
	pending    sync.Map            // buildID -> *Registry (pull credentials, memory only)
	metrics    *metrics
	hooks      []ReadyHook
	fallback   template.Resolver
}

// New builds the catalog; call Start before serving.
func New(cfg Config) *Catalog {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.CPUCount == 0 {
		cfg.CPUCount = 2
	}
	if cfg.MemoryMB == 0 {
		cfg.MemoryMB = 512
	}
	if cfg.DiskSizeMB == 0 {
		cfg.DiskSizeMB = 1024
	}
	if cfg.MaxCPUCount == 0 {
		cfg.MaxCPUCount = 64
	}
	if cfg.MaxMemoryMB == 0 {
		cfg.MaxMemoryMB = 1 << 20
	}
	if cfg.CodeInterpreterMemoryMB == 0 {
		cfg.CodeInterpreterMemoryMB = min(2048, cfg.MaxMemoryMB)
	}
	if cfg.StoreRetries == 0 {
		cfg.StoreRetries = 5
	}
	if cfg.StoreRetryDelay == 0 {
		cfg.StoreRetryDelay = 100 * time.Millisecond
	}
	if cfg.SweepInterval == 0 {
		cfg.SweepInterval = 30 * time.Second
	}
	if cfg.OrphanAfter == 0 {
		cfg.OrphanAfter = 2 * time.Minute
	}
	return &Catalog{cfg: cfg, st: cfg.Store, log: cfg.Logger, queue: make(chan string, 256), secrets: map[string][]string{}, unrecorded: map[string]func(context.Context) error{},
		metrics: newMetrics(cfg.Registry, cfg.Store)}
}

// SetProber installs the readyCmd prober (the control plane, which is built
// after the catalog).
func (c *Catalog) SetProber(p Prober) {
	c.mu.Lock()
	c.prober = p
	c.mu.Unlock()
}

func randHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// NewTemplateID follows the CEP: tpl_ + 8 hex chars.
func NewTemplateID() string { return "tpl_" + randHex(4) }

func invalid(format string, a ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalid, fmt.Sprintf(format, a...))
}

// Start seeds the base template, fails builds a previous process left
// running and starts the build worker.
func (c *Catalog) Start(ctx context.Context) error {
	if err := c.seedBase(ctx); err != nil {
		return err
	}
	if err := c.recover(ctx); err != nil {
		return err
	}
	go c.worker(ctx)
	go c.sweepLoop(ctx)
	return nil
}

func (c *Catalog) seedBase(ctx context.Context) error {
	if c.cfg.BaseRootfs == "" {
		return nil
	}
	if err := c.seedBuiltin(ctx, BaseID, baseNames, c.cfg.BaseRootfs, "", c.cfg.MemoryMB); err != nil {
		return err
	}
	if c.cfg.CodeInterpreterRootfs == "" {
		return nil
	}
	return c.seedBuiltin(ctx, CodeInterpreterID, codeInterpreterNames, c.cfg.CodeInterpreterRootfs, codeInterpreterReady, c.cfg.CodeInterpreterMemoryMB)
}

// codeInterpreterReady is the code interpreter's ready command: its /health
// answers once the default kernel is up, so a create (and a warm-pool
// standby) is ready with a warm kernel, as on e2b, whose template waits on
// the same URL.
const codeInterpreterReady = "curl -sf -o /dev/null http://127.0.0.1:49999/health"

// seededBuild reports whether buildID is the seeded build of built-in
// template id: its derived UUID, or bld_<id> in stores seeded before.
func seededBuild(id, buildID string) bool {
	return buildID == template.DerivedBuildID("builtin", id) || buildID == "bld_"+id
}

// seedBuiltin creates the built-in template id with its seeded build, or
// repoints an existing seeded build at rootfs (the image was rebuilt or moved)
// and gives the row its names (earlier versions had every built-in name on
// base). memoryMB sizes a new row, and a row seeded before built-ins had
// sizes of their own (it has the server's default memory and its seeded
// build); other rows keep theirs.
func (c *Catalog) seedBuiltin(ctx context.Context, id string, names []string, rootfs, readyCmd string, memoryMB int) error {
	buildID := template.DerivedBuildID("builtin", id)
	t, err := c.st.GetTemplate(ctx, id)
	if err == nil {
		if seededBuild(id, t.ReadyBuildID) {
			buildID = t.ReadyBuildID // a store seeded before build IDs were UUIDs keeps its ID
		}
		if !slices.Equal(t.Names, names) && slices.Contains(t.Names, names[0]) {
			if err := c.st.SetTemplateNames(ctx, id, names); err != nil {
				return fmt.Errorf("seeding template %s: names: %w", id, err)
			}
		}
		// Seeded before the built-in had a size of its own, the row has
		// the server's default of then: it gets its size.
		resize := t.ReadyBuildID == buildID && t.MemoryMB == c.cfg.MemoryMB && memoryMB > t.MemoryMB
		if (t.ReadyCmd == "" && readyCmd != "" && t.ReadyBuildID == buildID) || resize {
			if t.ReadyCmd == "" && t.ReadyBuildID == buildID {
				t.ReadyCmd = readyCmd
			}
			if resize {
				t.MemoryMB = memoryMB
			}
			if err := c.st.UpdateTemplate(ctx, t); err != nil {
				return fmt.Errorf("seeding template %s: %w", id, err)
			}
		}
		// Keep the row the operator may have edited; only repoint the seeded build.
		if b, err := c.st.GetTemplateBuild(ctx, t.ReadyBuildID); err == nil && t.ReadyBuildID == buildID && (b.Rootfs != rootfs || b.MemoryMB != t.MemoryMB) {
			b.Rootfs, b.MemoryMB = rootfs, t.MemoryMB
			return c.st.UpdateTemplateBuild(ctx, b)
		}
		return nil
	}
	if !errors.Is(err, store.ErrNotFound) {
		return err
	}
	now := time.Now().UTC()
	t = &store.Template{ID: id, TeamID: store.DefaultTeamID, PrimaryName: names[0], Names: names, CPUCount: c.cfg.CPUCount, MemoryMB: memoryMB,
		DiskSizeMB: c.cfg.DiskSizeMB, ReadyCmd: readyCmd, ReadyBuildID: buildID, LatestBuildID: buildID, BuildStatus: store.BuildReady, BuildCount: 1, Public: true}
	b := &store.TemplateBuild{ID: buildID, TemplateID: id, Status: store.BuildReady, CPUCount: t.CPUCount, MemoryMB: t.MemoryMB,
		DiskSizeMB: t.DiskSizeMB, Rootfs: rootfs, FinishedAt: now}
	err = c.st.CreateTemplate(ctx, t, b)
	if errors.Is(err, store.ErrConflict) {
		return fmt.Errorf("seeding template %s: a template already uses one of the names %v: %w", id, names, err)
	}
	return err
}

// recover: a build that was running when the process died cannot be
// adopted (the builder session is gone), so it fails with a clear reason;
// the template keeps its previous ready image.
func (c *Catalog) recover(ctx context.Context) error {
	// No worker runs yet: every building build is an orphan.
	if err := c.failOrphans(ctx); err != nil {
		return err
	}
	return c.eachBuild(ctx, func(_ *store.Template, b *store.TemplateBuild) error {
		if b.Status == store.BuildWaiting && b.Spec != "" {
			// Start was accepted but not begun: run it now.
			c.queue <- b.ID
		}
		return nil
	})
}

// eachBuild calls f on every build of every template, a page of templates
// at a time so no store call returns the whole catalog. It stops at the
// first error, f's or the store's.
func (c *Catalog) eachBuild(ctx context.Context, f func(*store.Template, *store.TemplateBuild) error) error {
	var after string
	for {
		ts, err := c.st.ListTemplates(ctx, after, 500)
		if err != nil || len(ts) == 0 {
			return err
		}
		for _, t := range ts {
			after = t.ID
			builds, err := c.st.ListTemplateBuilds(ctx, t.ID)
			if err != nil {
				return err
			}
			for _, b := range builds {
				if err := f(t, b); err != nil {
					return err
				}
			}
		}
	}
}

// ---- create / rebuild -----------------------------------------------------

// CreateRequest is POST /v3/templates (and the older /templates, /v2/templates).
type CreateRequest struct {
	Name  string   `json:"name"`
	Tags  []string `json:"tags"`
	Alias string   `json:"alias"`
	// TeamID (deprecated in e2b) may only name the key's own team.
	TeamID        string `json:"teamID"`
	CPUCount      *int   `json:"cpuCount"`
	MemoryMB      *int   `json:"memoryMB"`
	MinFreeDiskMB *int   `json:"minFreeDiskMb"`
	// Accelerators is Cubicle's extension: the template's accelerator
	// compatibility contract, validated here (registration stage).
	Accelerators *accel.Contract `json:"accelerators,omitempty"`
}

// CreateResponse is e2b's TemplateRequestResponseV3.
type CreateResponse struct {
	TemplateID string   `json:"templateID"`
	BuildID    string   `json:"buildID"`
	Public     bool     `json:"public"`
	Aliases    []string `json:"aliases"`
	Names      []string `json:"names"`
	Tags       []string `json:"tags"`
}

func splitName(req CreateRequest) (string, []string, error) {
	name := req.Name
	if name == "" {
		name = req.Alias
	}
	if name == "" {
		return "", nil, invalid("name is required")
	}
	var tags []string
	if n, tag, ok := strings.Cut(name, ":"); ok {
		if strings.Contains(tag, ":") {
			return "", nil, invalid("name %q may contain one ':' tag", name)
		}
		name = n
		tags = append(tags, tag)
	}
	tags = append(tags, req.Tags...)
	if !nameRE.MatchString(name) {
		return "", nil, invalid("name %q must match %s", name, nameRE)
	}
	seen := map[string]bool{}
	var out []string
	for _, t := range tags {
		if !tagRE.MatchString(t) {
			return "", nil, invalid("tag %q must match %s", t, tagRE)
		}
		if !seen[t] {
			seen[t] = true
			out = append(out, t)
		}
	}
	if len(out) == 0 {
		out = []string{"default"}
	}
	return name, out, nil
}

func (c *Catalog) sizes(req CreateRequest, t *store.Template) (cpu, mem, disk int, err error) {
	cpu, mem, disk = c.cfg.CPUCount, c.cfg.MemoryMB, c.cfg.DiskSizeMB
	if t != nil {
		cpu, mem, disk = t.CPUCount, t.MemoryMB, t.DiskSizeMB
	}
	if req.CPUCount != nil {
		if *req.CPUCount < 1 {
			return 0, 0, 0, invalid("cpuCount must be at least 1")
		}
		if *req.CPUCount > c.cfg.MaxCPUCount {
			return 0, 0, 0, invalid("cpuCount %d exceeds the server maximum of %d", *req.CPUCount, c.cfg.MaxCPUCount)
		}
		cpu = *req.CPUCount
	}
	if req.MemoryMB != nil {
		if *req.MemoryMB < 128 {
			return 0, 0, 0, invalid("memoryMB must be at least 128")
		}
		if *req.MemoryMB > c.cfg.MaxMemoryMB {
			return 0, 0, 0, invalid("memoryMB %d exceeds the server maximum of %d", *req.MemoryMB, c.cfg.MaxMemoryMB)
		}
		mem = *req.MemoryMB
	}
	if req.MinFreeDiskMB != nil {
		if *req.MinFreeDiskMB < 0 {
			return 0, 0, 0, invalid("minFreeDiskMb must be >= 0")
		}
		if max := c.cfg.MaxDiskSizeMB; max > 0 && *req.MinFreeDiskMB > max {
			return 0, 0, 0, invalid("minFreeDiskMb %d exceeds the server maximum of %d", *req.MinFreeDiskMB, max)
		}
		if *req.MinFreeDiskMB > disk {
			disk = *req.MinFreeDiskMB
		}
	}
	// A rebuild keeps sizes the maxima may since have been lowered below.
	if cpu > c.cfg.MaxCPUCount {
		return 0, 0, 0, invalid("cpuCount %d exceeds the server maximum of %d", cpu, c.cfg.MaxCPUCount)
	}
	if mem > c.cfg.MaxMemoryMB {
		return 0, 0, 0, invalid("memoryMB %d exceeds the server maximum of %d", mem, c.cfg.MaxMemoryMB)
	}
	if max := c.cfg.MaxDiskSizeMB; max > 0 && disk > max {
		return 0, 0, 0, invalid("diskSizeMB %d exceeds the server maximum of %d", disk, max)
	}
	return cpu, mem, disk, nil
}

func names(primary string, tags []string) []string {
	out := []string{primary}
	for _, t := range tags {
		if t != "default" {
			out = append(out, primary+":"+t)
		}
	}
	return out
}

// Create registers a template, or a rebuild of the template with the same
// primary name (same templateID, new buildID). idemKey, when set, replays
// the first response for the same body.
func (c *Catalog) Create(ctx context.Context, caller Caller, req CreateRequest, idemKey string, body []byte) (*CreateResponse, error) {
	if idemKey == "" {
		return c.create(ctx, caller, req)
	}
	sum := sha256.Sum256(body)
	hash := hex.EncodeToString(sum[:])
	// Keys are per team: another team's key never replays this response.
	key := "templates:" + caller.TeamID + ":" + idemKey
	prev, err := c.st.PutIdempotency(ctx, &store.Idempotency{Key: key, BodyHash: hash})
	if err != nil {
		return nil, err
	}
	if prev.BodyHash != hash {
		return nil, fmt.Errorf("%w: Idempotency-Key %q was used with a different body", ErrConflict, idemKey)
	}
	if prev.Response != "" {
		var r CreateResponse
		if err := json.Unmarshal([]byte(prev.Response), &r); err == nil {
			return &r, nil
		}
	}
	resp, err := c.create(ctx, caller, req)
	if err != nil {
		return nil, err
	}
	js, _ := json.Marshal(resp)
	if err := c.st.SetIdempotencyResponse(ctx, key, string(js)); err != nil {
		c.log.Warn("store idempotent response", "err", err)
	}
	return resp, nil
}

func (c *Catalog) create(ctx context.Context, caller Caller, req CreateRequest) (*CreateResponse, error) {
	name, tags, err := splitName(req)
	if err != nil {
		return nil, err
	}
	if req.TeamID != "" && req.TeamID != caller.TeamID {
		return nil, invalid("teamID %q is not the team of this API key", req.TeamID)
	}
	if contains(builtinNames, name) {
		return nil, fmt.Errorf("%w: %q is a name of a built-in template", ErrConflict, name)
	}
	existing, err := c.st.TemplateByName(ctx, caller.TeamID, name)
	if err != nil && !errors.Is(err, store.ErrNotFound) {
		return nil, err
	}
	if existing != nil && existing.TeamID != caller.TeamID && !caller.system {
		// Another team's public template: this team gets its own, which
		// then shadows the public one for it.
		existing = nil
	}
	if existing != nil && existing.PrimaryName != name {
		return nil, fmt.Errorf("%w: name %q belongs to template %s", ErrConflict, name, existing.ID)
	}
	if existing != nil && builtin(existing.ID) {
		return nil, fmt.Errorf("%w: %q is a built-in template", ErrConflict, name)
	}
	if existing != nil && !caller.mayChange(existing) {
		return nil, fmt.Errorf("%w: template '%s' is public; only admin API keys rebuild it", ErrForbidden, name)
	}
	if existing != nil {
		if err := c.frozen(ctx, existing); err != nil {
			return nil, err
		}
	}
	cpu, mem, disk, err := c.sizes(req, existing)
	if err != nil {
		return nil, err
	}
	contract, err := contractJSON(req.Accelerators)
	if err != nil {
		return nil, err
	}
	b := &store.TemplateBuild{ID: template.NewBuildID(), Status: store.BuildWaiting, CPUCount: cpu, MemoryMB: mem, DiskSizeMB: disk}
	if existing == nil {
		t := &store.Template{ID: NewTemplateID(), TeamID: caller.TeamID, PrimaryName: name, Names: names(name, tags), CPUCount: cpu, MemoryMB: mem, DiskSizeMB: disk,
			LatestBuildID: b.ID, BuildStatus: store.BuildWaiting, BuildCount: 1, Accelerators: contract}
		b.TemplateID = t.ID
		if err := c.st.CreateTemplate(ctx, t, b); err != nil {
			if errors.Is(err, store.ErrConflict) {
				return nil, fmt.Errorf("%w: %v", ErrConflict, err)
			}
			return nil, err
		}
		if err := c.setTags(ctx, t.ID, b.ID, tags); err != nil {
			return nil, err
		}
		return c.response(t, b.ID, tags), nil
	}
	t := existing
	if t.BuildStatus == store.BuildBuilding || t.BuildStatus == store.BuildUploaded {
		return nil, fmt.Errorf("%w: template %s is already building (build %s)", ErrConflict, t.ID, t.LatestBuildID)
	}
	if t.LatestBuildID != "" {
		// The latest build's own row is the truth: the worker moves it to
		// building a moment before it updates the template row.
		if old, err := c.st.GetTemplateBuild(ctx, t.LatestBuildID); err == nil {
			switch {
			case old.Status == store.BuildBuilding || old.Status == store.BuildUploaded:
				return nil, fmt.Errorf("%w: template %s is already building (build %s)", ErrConflict, t.ID, old.ID)
			case old.Status == store.BuildWaiting && old.Spec != "":
				// A waiting build whose start was accepted is queued: as good as building.
				return nil, fmt.Errorf("%w: template %s has a queued build (%s)", ErrConflict, t.ID, old.ID)
			}
		}
	}
	b.TemplateID = t.ID
	prev := t.LatestBuildID
	t.LatestBuildID, t.BuildStatus = b.ID, store.BuildWaiting
	t.CPUCount, t.MemoryMB, t.DiskSizeMB = cpu, mem, disk
	if req.Accelerators != nil {
		// A rebuild that names no contract keeps the old one.
		t.Accelerators = contract
	}
	// The check above is repeated by the store in the insert's
	// transaction (latest build unchanged, not running or queued): of two
	// concurrent rebuilds the second gets 409. A previous build that was
	// never started is superseded there too.
	if err := c.st.AddTemplateBuild(ctx, t, b, prev); err != nil {
		if errors.Is(err, store.ErrConflict) {
			return nil, fmt.Errorf("%w: template %s was rebuilt concurrently: %v", ErrConflict, t.ID, err)
		}
		return nil, err
	}

	all := append([]string{}, t.Names...)
	for _, n := range names(name, tags) {
		if !contains(all, n) {
			all = append(all, n)
		}
	}
	if err := c.st.SetTemplateNames(ctx, t.ID, all); err != nil {
		if errors.Is(err, store.ErrConflict) {
			return nil, fmt.Errorf("%w: %v", ErrConflict, err)
		}
		return nil, err
	}
	if err := c.setTags(ctx, t.ID, b.ID, tags); err != nil {
		return nil, err
	}
	return c.response(t, b.ID, tags), nil
}

// setTags points the request's tags at the new build, with retries; the
// error (a 500) tells the client its tags are not all in place.
func (c *Catalog) setTags(ctx context.Context, templateID, buildID string, tags []string) error {
	for _, tag := range tags {
		if err := c.retry(ctx, "set tag "+tag, buildID, func(ctx context.Context) error { return c.st.SetTemplateTag(ctx, templateID, tag, buildID) }); err != nil {
			return fmt.Errorf("template %s: tag %q: %w", templateID, tag, err)
		}
	}
	return nil
}

func contains(ss []string, s string) bool {
	for _, x := range ss {
		if x == s {
			return true
		}
	}
	return false
}

func (c *Catalog) response(t *store.Template, buildID string, tags []string) *CreateResponse {
	return &CreateResponse{TemplateID: t.ID, BuildID: buildID, Public: t.Public, Aliases: []string{t.PrimaryName},
		Names: names(t.PrimaryName, tags), Tags: tags}
}

// ---- lookups ------------------------------------------------------------------

// Get finds a template the caller sees by ID or any name; one it does not
// see is ErrNotFound, exactly like one that does not exist.
func (c *Catalog) Get(ctx context.Context, caller Caller, ref string) (*store.Template, error) {
	t, err := c.byID(ctx, caller, ref)
	if errors.Is(err, store.ErrNotFound) {
		t, err = c.st.TemplateByName(ctx, caller.TeamID, ref)
	}
	if errors.Is(err, store.ErrNotFound) {
		return nil, notFound(ref)
	}
	return t, err
}

// List pages the templates the caller sees in creation order.
func (c *Catalog) List(ctx context.Context, caller Caller, after string, limit int) ([]*store.Template, error) {
	if caller.system {
		return c.st.ListTemplates(ctx, after, limit)
	}
	return c.st.ListTeamTemplates(ctx, caller.TeamID, after, limit)
}

// Builds lists a template's builds, newest first.
func (c *Catalog) Builds(ctx context.Context, id string) ([]*store.TemplateBuild, error) {
	return c.st.ListTemplateBuilds(ctx, id)
}

// contractJSON validates a contract (registration stage) and encodes it
// for the store; nil or an empty contract is "" (CPU-only).
func contractJSON(c *accel.Contract) (string, error) {
	if c == nil || c.Class == "" && c.Count == 0 && len(c.Labels) == 0 && c.Backend == "" && c.DriverVersion == "" && c.CUDAVersion == "" && c.GuestKernel == "" && c.ModulesImage == "" && !c.PinMemory {
		return "", nil
	}
	if c.Class == "" {
		c.Class = accel.ClassGPU
	}
	if err := accel.ValidateContract(*c); err != nil {
		return "", fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	b, err := json.Marshal(c)
	return string(b), err
}

// Contract decodes a stored template contract (nil for CPU-only templates).
func Contract(t *store.Template) (*accel.Contract, error) {
	if t.Accelerators == "" {
		return nil, nil
	}
	var c accel.Contract
	if err := json.Unmarshal([]byte(t.Accelerators), &c); err != nil {
		return nil, fmt.Errorf("template %s: accelerator contract: %w", t.ID, err)
	}
	return &c, nil
}

// SetAccelerators replaces a template's contract (PATCH); nil clears it.
func (c *Catalog) SetAccelerators(ctx context.Context, caller Caller, ref string, ct *accel.Contract) (*store.Template, error) {
	enc, err := contractJSON(ct)
	if err != nil {
		return nil, err
	}
	t, err := c.Writable(ctx, caller, ref)
	if err != nil {
		return nil, err
	}
	if enc != "" && t.PoolSize > 0 {
		return nil, fmt.Errorf("%w: template %s has a warm pool of %d; accelerator templates cannot have one", ErrConflict, t.ID, t.PoolSize)
	}
	t.Accelerators = enc
	return t, c.st.UpdateTemplate(ctx, t)
}

// SetPublic implements PATCH. Only admin keys publish: a public template
// is resolvable by name from every team, so publishing is the operator's
// call (see docs/tenancy.md).
func (c *Catalog) SetPublic(ctx context.Context, caller Caller, ref string, public bool) (*store.Template, error) {
	t, err := c.Writable(ctx, caller, ref)
	if err != nil {
		return nil, err
	}
	if public && !t.Public && !caller.Admin {
		return nil, fmt.Errorf("%w: only admin API keys make a template public", ErrForbidden)
	}
	t.Public = public
	return t, c.st.UpdateTemplate(ctx, t)
}

// MaxPoolSize bounds a template's warm pool: standbys hold node resources.
const MaxPoolSize = 64

// SetPoolSize sets how many idle standbys the warm pool keeps for the
// template. The size is durable (it survives restarts); the ready hooks are
// told so the pool reconciler acts now rather than on its next tick.
func (c *Catalog) SetPoolSize(ctx context.Context, caller Caller, ref string, n int) (*store.Template, error) {
	if n < 0 || n > MaxPoolSize {
		return nil, invalid("pool size must be between 0 and %d, got %d", MaxPoolSize, n)
	}
	t, err := c.Writable(ctx, caller, ref)
	if err != nil {
		return nil, err
	}
	if n > 0 && t.Accelerators != "" {
		// A standby would hold its devices while idle; GPU templates boot on demand.
		return nil, fmt.Errorf("%w: template %s requests accelerators; accelerator templates cannot have a warm pool", ErrConflict, t.ID)
	}
	if t.PoolSize != n {
		t.PoolSize = n
		if err := c.st.UpdateTemplate(ctx, t); err != nil {
			return nil, err
		}
	}
	c.notifyReady(t.ID)
	return t, nil
}

// InUse reports what keeps a template from being deleted.
type InUse func(ctx context.Context, templateID string) (string, error)

// Delete removes a template unless it is building or in use; force skips
// both checks. Rootfs dirs of its builds are left to the caller's GC.
func (c *Catalog) Delete(ctx context.Context, caller Caller, ref string, force bool, inUse InUse) error {
	t, err := c.Writable(ctx, caller, ref)
	if err != nil {
		return err
	}
	if builtin(t.ID) && !force {
		return fmt.Errorf("%w: the built-in template %s cannot be deleted", ErrConflict, t.ID)
	}
	if !force {
		if t.BuildStatus == store.BuildBuilding || t.BuildStatus == store.BuildUploaded {
			return fmt.Errorf("%w: template %s is building", ErrConflict, t.ID)
		}
		if t.PoolSize > 0 {
			return fmt.Errorf("%w: template %s has a warm pool of %d; set it to 0 first", ErrConflict, t.ID, t.PoolSize)
		}
		if inUse != nil {
			why, err := inUse(ctx, t.ID)
			if err != nil {
				return err
			}
			if why != "" {
				return fmt.Errorf("%w: template %s is in use: %s", ErrConflict, t.ID, why)
			}
		}
	}
	return c.st.DeleteTemplate(ctx, t.ID)
}

// ---- builds -----------------------------------------------------------------------

// Registry is fromImageRegistry (credentials for the base image pull).
type Registry struct {
	Type               string `json:"type"`
	Username           string `json:"username,omitempty"`
	Password           string `json:"password,omitempty"`
	AWSAccessKeyID     string `json:"awsAccessKeyId,omitempty"`
	AWSSecretAccessKey string `json:"awsSecretAccessKey,omitempty"`
	AWSRegion          string `json:"awsRegion,omitempty"`
	ServiceAccountJSON string `json:"serviceAccountJson,omitempty"`
}

// Step is TemplateStep; unknown keys are ignored.
type Step struct {
	Type      string   `json:"type"`
	Args      []string `json:"args"`
	FilesHash string   `json:"filesHash,omitempty"`
	Force     bool     `json:"force"`
}

// StartRequest is TemplateBuildStartV2.
type StartRequest struct {
	FromImage         string    `json:"fromImage,omitempty"`
	FromTemplate      string    `json:"fromTemplate,omitempty"`
	FromImageRegistry *Registry `json:"fromImageRegistry,omitempty"`
	Force             bool      `json:"force"`
	Steps             []Step    `json:"steps"`
	StartCmd          string    `json:"startCmd,omitempty"`
	ReadyCmd          string    `json:"readyCmd,omitempty"`
}

func (r *Registry) secrets() []string {
	if r == nil {
		return nil
	}
	var out []string
	for _, s := range []string{r.Password, r.AWSSecretAccessKey, r.ServiceAccountJSON, r.AWSAccessKeyID} {
		if len(s) >= 4 {
			out = append(out, s)
		}
	}
	return out
}

// StartBuild validates and queues a build (202 at the API).
func (c *Catalog) StartBuild(ctx context.Context, caller Caller, templateID, buildID string, req StartRequest) error {
	t, err := c.byID(ctx, caller, templateID)
	if errors.Is(err, store.ErrNotFound) {
		return notFound(templateID)
	}
	if err != nil {
		return err
	}
	if !caller.mayChange(t) {
		return fmt.Errorf("%w: template '%s' is public; only admin API keys build it", ErrForbidden, templateID)
	}
	b, err := c.st.GetTemplateBuild(ctx, buildID)
	if errors.Is(err, store.ErrNotFound) || (err == nil && b.TemplateID != t.ID) {
		return fmt.Errorf("%w: build '%s' of template '%s'", ErrBuildNotFound, buildID, templateID)
	}
	if err != nil {
		return err
	}
	if b.Status != store.BuildWaiting || b.Spec != "" {
		return fmt.Errorf("%w: build %s is %s", ErrConflict, buildID, b.Status)
	}
	if (req.FromImage == "") == (req.FromTemplate == "") {
		return invalid("exactly one of fromImage and fromTemplate must be set")
	}
	if id := e2bImageTemplate(req.FromImage); id != "" {
		// The SDK's default base (fromBaseImage) and e2b's code
		// interpreter are e2b's own images; here the built-in templates
		// play their role.
		req.FromImage, req.FromTemplate = "", id
	}
	job := Job{TemplateID: t.ID, BuildID: b.ID, TeamID: caller.TeamID, Start: req}
	if req.FromTemplate != "" {
		src, err := c.readyBuildOf(ctx, caller, req.FromTemplate)
		if err != nil {
			return err
		}
		job.FromImage, job.FromRootfs = src.Image, src.Rootfs
	} else {
		job.FromImage = req.FromImage
	}
	if c.cfg.Builder == nil {
		return fmt.Errorf("%w: template builds are not enabled on this server", ErrNotImplemented)
	}
	if err := c.cfg.Builder.Validate(ctx, job); err != nil {
		return err
	}
	return c.queueBuild(ctx, caller, b, req, nil)
}

// queueBuild stores a validated build's start request and queues it; cube is
// the CubeAPI request it was made from, if any.
func (c *Catalog) queueBuild(ctx context.Context, caller Caller, b *store.TemplateBuild, req StartRequest, cube *ImageRequest) error {
	// Credentials never reach the store: only the scrubbed spec is kept.
	c.mu.Lock()
	c.secrets[b.ID] = req.FromImageRegistry.secrets()
	c.mu.Unlock()
	spec := storedSpec{StartRequest: req, Team: caller.TeamID, Admin: caller.Admin, Cube: cube}
	spec.FromImageRegistry = nil
	js, _ := json.Marshal(spec)
	b.Spec = string(js)
	// Conditional: a rebuild may have superseded this build since it was read.
	if err := c.st.StartTemplateBuild(ctx, b.ID, b.Spec); err != nil {
		if errors.Is(err, store.ErrConflict) {
			return fmt.Errorf("%w: %v", ErrConflict, err)
		}
		return err
	}
	c.pending.Store(b.ID, req.FromImageRegistry)
	select {
	case c.queue <- b.ID:
	default:
		return fmt.Errorf("%w: too many queued builds", ErrConflict)
	}
	return nil
}

// storedSpec is a build's start request as the store keeps it: the
// request without credentials, plus who started it (server-side fields a
// client body cannot set: StartRequest has no such keys).
type storedSpec struct {
	StartRequest
	// Team and Admin are the starting key's: the team's uploaded build
	// contexts are what COPY steps read, and fromTemplate resolves as that
	// key sees templates when the queued build runs.
	Team  string `json:"cubicleTeam,omitempty"`
	Admin bool   `json:"cubicleAdmin,omitempty"`
	// Cube is the CubeAPI create request (without its registry password)
	// for templates made from an image: rebuilds repeat it, GET shows it,
	// and its Name is the alias a ready build takes.
	Cube *ImageRequest `json:"cubeRequest,omitempty"`
}

// caller is who started the build (System for specs from before teams).
func (s storedSpec) caller() Caller {
	if s.Team == "" {
		return System()
	}
	return Caller{TeamID: s.Team, Admin: s.Admin}
}

// readyBuildOf resolves fromTemplate, as the caller sees it, to its ready build.
func (c *Catalog) readyBuildOf(ctx context.Context, caller Caller, ref string) (*store.TemplateBuild, error) {
	name, tag, hasTag := strings.Cut(ref, ":")
	t, err := c.Get(ctx, caller, name)
	if err != nil {
		return nil, invalid("fromTemplate %q: %v", ref, err)
	}
	id := t.ReadyBuildID
	if hasTag && tag != "default" && tag != "latest" {
		if id, err = c.taggedBuild(ctx, t.ID, tag); err != nil {
			return nil, err
		}
	}
	if id == "" {
		return nil, invalid("fromTemplate %q is not ready", ref)
	}
	b, err := c.st.GetTemplateBuild(ctx, id)
	if err != nil || b.Status != store.BuildReady {
		return nil, invalid("fromTemplate %q is not ready", ref)
	}
	return b, nil
}

// Status is TemplateBuildInfo.
type Status struct {
	TemplateID string               `json:"templateID"`
	BuildID    string               `json:"buildID"`
	Status     string               `json:"status"`
	Logs       []string             `json:"logs"`
	LogEntries []LogEntry           `json:"logEntries"`
	Reason     *StatusReason        `json:"reason,omitempty"`
	Build      *store.TemplateBuild `json:"-"`
}

// LogEntry is BuildLogEntry.
type LogEntry struct {
	Timestamp time.Time `json:"timestamp"`
	Message   string    `json:"message"`
	Level     string    `json:"level"`
	Step      string    `json:"step,omitempty"`
}

// StatusReason is BuildStatusReason.
type StatusReason struct {
	Message    string     `json:"message"`
	Step       string     `json:"step,omitempty"`
	LogEntries []LogEntry `json:"logEntries"`
}

var levelRank = map[string]int{"debug": 0, "info": 1, "warn": 2, "error": 3}

// APIStatus maps the internal uploaded phase to building: the SDK stops
// polling on any status but waiting/building.
func APIStatus(s string) string {
	if s == store.BuildUploaded {
		return store.BuildBuilding
	}
	return s
}

// templateBuild finds buildID of templateID: ErrNotFound when the template
// is unknown, ErrBuildNotFound when the build is not one of its builds.
func (c *Catalog) templateBuild(ctx context.Context, caller Caller, templateID, buildID string) (*store.TemplateBuild, error) {
	if _, err := c.byID(ctx, caller, templateID); errors.Is(err, store.ErrNotFound) {
		return nil, notFound(templateID)
	} else if err != nil {
		return nil, err
	}
	b, err := c.st.GetTemplateBuild(ctx, buildID)
	if errors.Is(err, store.ErrNotFound) || (err == nil && b.TemplateID != templateID) {
		return nil, fmt.Errorf("%w: build '%s' of template '%s'", ErrBuildNotFound, buildID, templateID)
	}
	return b, err
}

// levelMin is the rank a log level filter keeps (all for "").
func levelMin(level string) (int, error) {
	min, ok := levelRank[level]
	if level != "" && !ok {
		return 0, invalid("level must be one of debug, info, warn, error")
	}
	return min, nil
}

// BuildStatus returns status plus log entries from offset.
func (c *Catalog) BuildStatus(ctx context.Context, caller Caller, templateID, buildID string, offset, limit int, level string) (*Status, error) {
	b, err := c.templateBuild(ctx, caller, templateID, buildID)
	if err != nil {
		return nil, err
	}
	if offset < 0 {
		return nil, invalid("logsOffset must be >= 0")
	}
	if limit <= 0 || limit > 100 {
		limit = 100
	}
	min, err := levelMin(level)
	if err != nil {
		return nil, err
	}
	logs, err := c.st.ListBuildLogs(ctx, buildID, offset, limit)
	if err != nil {
		return nil, err
	}
	st := &Status{TemplateID: templateID, BuildID: buildID, Status: APIStatus(b.Status), Logs: []string{}, LogEntries: []LogEntry{}, Build: b}
	for _, l := range logs {
		// Entries below the level still count for logsOffset (it is an
		// entry index), so filtered ones are skipped, not renumbered.
		if levelRank[l.Level] < min {
			continue
		}
		e := LogEntry{Timestamp: l.Time, Message: l.Message, Level: l.Level, Step: l.Step}
		st.LogEntries = append(st.LogEntries, e)
		st.Logs = append(st.Logs, fmt.Sprintf("[%s] %s", l.Time.Format(time.RFC3339), l.Message))
	}
	if b.Status == store.BuildError {
		st.Reason = &StatusReason{Message: b.Reason, Step: b.Step, LogEntries: []LogEntry{}}
	}
	return st, nil
}

// BuildLogs is GET .../logs (cursor = ms timestamp; direction forward|backward).
func (c *Catalog) BuildLogs(ctx context.Context, caller Caller, templateID, buildID string, cursor time.Time, limit int, backward bool, level string) ([]LogEntry, error) {
	if _, err := c.templateBuild(ctx, caller, templateID, buildID); err != nil {
		return nil, err
	}
	min, err := levelMin(level)
	if err != nil {
		return nil, err
	}
	if limit <= 0 || limit > 100 {
		limit = 100
	}
	var all []LogEntry
	for off := 0; ; off += 100 {
		logs, err := c.st.ListBuildLogs(ctx, buildID, off, 100)
		if err != nil {
			return nil, err
		}
		for _, l := range logs {
			if levelRank[l.Level] < min {
				continue
			}
			if !cursor.IsZero() && ((!backward && l.Time.Before(cursor)) || (backward && l.Time.After(cursor))) {
				continue
			}
			all = append(all, LogEntry{Timestamp: l.Time, Message: l.Message, Level: l.Level, Step: l.Step})
		}
		if len(logs) < 100 {
			break
		}
	}
	if backward {
		sort.SliceStable(all, func(i, j int) bool { return all[i].Timestamp.After(all[j].Timestamp) })
	}
	if len(all) > limit {
		all = all[:limit]
	}
	if all == nil {
		all = []LogEntry{}
	}
	return all, nil
}

// taggedBuild is the build a tag of the template points at ("" if none).
func (c *Catalog) taggedBuild(ctx context.Context, templateID, tag string) (string, error) {
	tags, err := c.st.ListTemplateTags(ctx, templateID)
	if err != nil {
		return "", err
	}
	for _, tg := range tags {
		if tg.Tag == tag {
			return tg.BuildID, nil
		}
	}
	return "", nil
}

// Tags lists a template's tags.
func (c *Catalog) Tags(ctx context.Context, caller Caller, ref string) ([]store.TemplateTag, error) {
	t, err := c.Get(ctx, caller, ref)
	if err != nil {
		return nil, err
	}
	return c.st.ListTemplateTags(ctx, t.ID)
}

// AssignTags points tags at the build target ("name:tag" or "name") names.
func (c *Catalog) AssignTags(ctx context.Context, caller Caller, target string, tags []string) (string, error) {
	name, tag, _ := strings.Cut(target, ":")
	t, err := c.Writable(ctx, caller, name)
	if err != nil {
		return "", err
	}
	if len(tags) == 0 {
		return "", invalid("tags must not be empty")
	}
	if t.PrimaryName == "" {
		return "", invalid("template %s has no name to tag; give it one first (PUT /templates/%s/alias)", t.ID, t.ID)
	}
	buildID := t.ReadyBuildID
	if tag != "" && tag != "default" {
		if buildID, err = c.taggedBuild(ctx, t.ID, tag); err != nil {
			return "", err
		}
	}
	if buildID == "" {
		return "", fmt.Errorf("%w: '%s' has no build to tag", ErrNotFound, target)
	}
	all := append([]string{}, t.Names...)
	for _, tg := range tags {
		if !tagRE.MatchString(tg) {
			return "", invalid("tag %q must match %s", tg, tagRE)
		}
		if err := c.st.SetTemplateTag(ctx, t.ID, tg, buildID); err != nil {
			return "", err
		}
		if n := t.PrimaryName + ":" + tg; tg != "default" && !contains(all, n) {
			all = append(all, n)
		}
	}
	if err := c.st.SetTemplateNames(ctx, t.ID, all); err != nil {
		if errors.Is(err, store.ErrConflict) {
			return "", fmt.Errorf("%w: %v", ErrConflict, err)
		}
		return "", err
	}
	return buildID, nil
}

// RemoveTags deletes tags of the template called name.
func (c *Catalog) RemoveTags(ctx context.Context, caller Caller, name string, tags []string) error {
	t, err := c.Writable(ctx, caller, name)
	if err != nil {
		return err
	}
	var keep []string
	for _, n := range t.Names {
		drop := false
		for _, tg := range tags {
			if n == t.PrimaryName+":"+tg {
				drop = true
			}
		}
		if !drop {
			keep = append(keep, n)
		}
	}
	for _, tg := range tags {
		if err := c.st.DeleteTemplateTag(ctx, t.ID, tg); err != nil && !errors.Is(err, store.ErrNotFound) {
			return err
		}
	}
	return c.st.SetTemplateNames(ctx, t.ID, keep)
}

// e2bImageTemplate maps e2b's own image references (the SDK's
// fromBaseImage default, e2bdev/base, and its code interpreter image) onto
// the built-in template that plays that role; "" for any other image.
func e2bImageTemplate(ref string) string {
	ref = strings.TrimPrefix(ref, "docker.io/")
	name, _, _ := strings.Cut(ref, ":")
	switch name {
	case "e2bdev/base":
		return BaseID
	case "e2bdev/code-interpreter":
		return CodeInterpreterID
	}
	return ""
}
