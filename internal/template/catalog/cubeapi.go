package catalog

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"regexp"
	"strconv"
	"strings"

	"github.com/cubicle-dev/cubicle/internal/agentapi"
	"github.com/cubicle-dev/cubicle/internal/store"
	"github.com/cubicle-dev/cubicle/internal/template"
)

// CubeSandbox's template API (CubeAPI) beside e2b's: a template is made
// from an image reference in one call, gets an ID of its own ("tpl-" and
// 24 hex characters, CubeAPI's form) and no name, and is known by an alias
// that moves between templates. Each create is a new template; an alias
// named at create moves to it once its build is ready, unless a template
// created later holds it by then ("the newest ready one"), so clients that
// rebuild by re-creating with the same alias switch over only to a
// working build.

// envKeyRE is a variable name; maxTemplateEnv bounds a template's env
// (a create may add up to its own limit on top).
var envKeyRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

const maxTemplateEnv = 128

// env is the request's env as a map (nil for none).
func (r *ImageRequest) env() map[string]string {
	if r == nil || len(r.Env) == 0 {
		return nil
	}
	out := make(map[string]string, len(r.Env))
	for _, kv := range r.Env {
		k, v, _ := strings.Cut(kv, "=")
		out[k] = v
	}
	return out
}

// buildEnv is the runtime env a ready build's CubeAPI request gave it.
func buildEnv(b *store.TemplateBuild) map[string]string {
	if b.Spec == "" || !strings.Contains(b.Spec, `"cubeRequest"`) {
		return nil // the common case costs no JSON decode on the create path
	}
	var spec storedSpec
	if json.Unmarshal([]byte(b.Spec), &spec) != nil {
		return nil
	}
	return spec.Cube.env()
}

// aliasRE is CubeAPI's alias rule.
var aliasRE = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,63}$`)

// reservedPrefixes are CubeAPI's ID prefixes: no alias set through CubeAPI
// starts with one, so it never reads as a template's or snapshot's ID.
// (e2b's names may: its users name snapshots "snap-..." freely.)
var reservedPrefixes = []string{"tpl-", "snap-"}

// ReservedName reports whether s starts with one of CubeAPI's ID prefixes.
func ReservedName(s string) bool {
	for _, p := range reservedPrefixes {
		if strings.HasPrefix(s, p) {
			return true
		}
	}
	return false
}

// ValidAlias reports whether s may be an alias set through CubeAPI.
func ValidAlias(s string) bool { return aliasRE.MatchString(s) && !ReservedName(s) }

func checkAlias(s string) error {
	if !ValidAlias(s) {
		return invalid("alias %q must match %s and not start with tpl- or snap-", s, aliasRE)
	}
	if contains(builtinNames, s) {
		return fmt.Errorf("%w: %q is a name of a built-in template", ErrConflict, s)
	}
	return nil
}

// NewImageTemplateID is CubeAPI's template ID form: tpl- and 24 hex.
func NewImageTemplateID() string { return "tpl-" + randHex(12) }

// ImageRequest is CubeAPI's POST /templates body. Every field is either
// honoured or refused (400): none is accepted and dropped.
type ImageRequest struct {
	Image string `json:"image"`
	// Name is the alias the template takes once ready.
	Name string `json:"name,omitempty"`
	// CPU is in millicores, rounded up to whole CPUs (Cubicle sizes
	// templates in CPUs).
	CPU *int `json:"cpu,omitempty"`
	// Memory is in MiB.
	Memory *int `json:"memory,omitempty"`
	// WritableLayerSize ("1G", "512Mi": binary units) is the sandbox's disk.
	WritableLayerSize string `json:"writableLayerSize,omitempty"`
	// Env is KEY=VALUE, baked into the template (ENV steps).
	Env []string `json:"env,omitempty"`
	// Command and Args replace the image's entrypoint and command: they
	// become the template's start command. Without them nothing of the
	// image's own runs (the agent is the sandbox's init), as with e2b's
	// fromImage.
	Command []string `json:"command,omitempty"`
	Args    []string `json:"args,omitempty"`
	// ExposedPorts are recorded; every port of a sandbox is reachable
	// through the proxy anyway.
	ExposedPorts []int `json:"exposedPorts,omitempty"`
	// ProbePort and ProbePath are an HTTP readiness probe: the build's
	// check and every sandbox's create wait for a 200-399 answer.
	ProbePort *int   `json:"probePort,omitempty"`
	ProbePath string `json:"probePath,omitempty"`
	// RegistryUsername and RegistryPassword pull a private image; the
	// password never reaches the store.
	RegistryUsername string `json:"registryUsername,omitempty"`
	RegistryPassword string `json:"registryPassword,omitempty"`
	// AllowInternetAccess true is what every sandbox has unless its create
	// says otherwise; false is refused (network policy is per sandbox).
	AllowInternetAccess *bool `json:"allowInternetAccess,omitempty"`

	// CubeMaster settings with no Cubicle counterpart: refused when set.
	InstanceType  string          `json:"instanceType,omitempty"`
	NetworkType   string          `json:"networkType,omitempty"`
	Nodes         []string        `json:"nodes,omitempty"`
	DNS           []string        `json:"dns,omitempty"`
	AllowOut      []string        `json:"allowOut,omitempty"`
	DenyOut       []string        `json:"denyOut,omitempty"`
	EnableIvshmem *bool           `json:"enableIvshmem,omitempty"`
	QoS           json.RawMessage `json:"qos,omitempty"`
}

func (r *ImageRequest) unsupported() error {
	var bad []string
	if r.InstanceType != "" {
		bad = append(bad, "instanceType")
	}
	if r.NetworkType != "" {
		bad = append(bad, "networkType")
	}
	if len(r.Nodes) > 0 {
		bad = append(bad, "nodes (the scheduler places sandboxes)")
	}
	if len(r.DNS) > 0 {
		bad = append(bad, "dns")
	}
	if len(r.AllowOut) > 0 || len(r.DenyOut) > 0 {
		bad = append(bad, "allowOut/denyOut (give each sandbox its network policy at create)")
	}
	if r.AllowInternetAccess != nil && !*r.AllowInternetAccess {
		bad = append(bad, "allowInternetAccess=false (give each sandbox allowInternetAccess at create)")
	}
	if r.EnableIvshmem != nil && *r.EnableIvshmem {
		bad = append(bad, "enableIvshmem")
	}
	if len(r.QoS) > 0 && string(r.QoS) != "null" {
		bad = append(bad, "qos")
	}
	if len(bad) > 0 {
		return invalid("not supported by this server: %s", strings.Join(bad, ", "))
	}
	return nil
}

// parseSize reads a writable layer size: a number with an optional K, M,
// G or T suffix (with or without "i"; both are binary units) into MiB.
func parseSize(s string) (int, error) {
	t := strings.TrimSuffix(strings.TrimSpace(s), "i")
	t = strings.TrimSuffix(t, "B")
	mul := 1.0 / (1 << 20) // bytes
	if n := len(t); n > 0 {
		switch t[n-1] {
		case 'K', 'k':
			mul, t = 1.0/1024, t[:n-1]
		case 'M', 'm':
			mul, t = 1, t[:n-1]
		case 'G', 'g':
			mul, t = 1024, t[:n-1]
		case 'T', 't':
			mul, t = 1024*1024, t[:n-1]
		}
	}
	v, err := strconv.ParseFloat(t, 64)
	if err != nil || v <= 0 || math.IsInf(v, 0) || math.IsNaN(v) {
		return 0, invalid("writableLayerSize %q is not a size (e.g. 1G, 512Mi)", s)
	}
	mib := math.Ceil(v * mul)
	if mib > math.MaxInt32 {
		return 0, invalid("writableLayerSize %q is too large", s)
	}
	return int(mib), nil
}

func shellQuote(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-./=:,@%+") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// plan checks the request and turns it into the template's sizes and its
// build's start request.
func (c *Catalog) plan(r *ImageRequest) (cpu, mem, disk int, start StartRequest, err error) {
	fail := func(e error) (int, int, int, StartRequest, error) { return 0, 0, 0, StartRequest{}, e }
	r.Image = strings.TrimSpace(r.Image)
	if r.Image == "" {
		return fail(invalid("image is required"))
	}
	if err := r.unsupported(); err != nil {
		return fail(err)
	}
	if r.Name != "" {
		if err := checkAlias(r.Name); err != nil {
			return fail(err)
		}
	}
	var sz CreateRequest
	if r.CPU != nil {
		if *r.CPU < 1 {
			return fail(invalid("cpu is in millicores and must be positive"))
		}
		n := (*r.CPU + 999) / 1000
		sz.CPUCount = &n
	}
	sz.MemoryMB = r.Memory
	if cpu, mem, disk, err = c.sizes(sz, nil); err != nil {
		return fail(err)
	}
	if r.WritableLayerSize != "" {
		if disk, err = parseSize(r.WritableLayerSize); err != nil {
			return fail(err)
		}
		if max := c.cfg.MaxDiskSizeMB; max > 0 && disk > max {
			return fail(invalid("writableLayerSize %s (%d MiB) exceeds the server maximum of %d MiB", r.WritableLayerSize, disk, max))
		}
	}
	start = StartRequest{FromImage: r.Image}
	if r.RegistryUsername != "" || r.RegistryPassword != "" {
		start.FromImageRegistry = &Registry{Type: "registry", Username: r.RegistryUsername, Password: r.RegistryPassword}
	}
	if len(r.Env) > maxTemplateEnv {
		return fail(invalid("at most %d env entries", maxTemplateEnv))
	}
	for _, kv := range r.Env {
		// Runtime env, as a container's: kept in the build's request
		// and given to every sandbox (template.Template.Env).
		if k, _, ok := strings.Cut(kv, "="); !ok || !envKeyRE.MatchString(k) {
			return fail(invalid("env entry %q is not KEY=VALUE with a valid name", kv))
		}
	}
	if len(r.Args) > 0 && len(r.Command) == 0 {
		return fail(invalid("args need a command: the image's own entrypoint does not run here"))
	}
	if len(r.Command) > 0 {
		words := make([]string, 0, len(r.Command)+len(r.Args))
		for _, w := range append(append([]string{}, r.Command...), r.Args...) {
			words = append(words, shellQuote(w))
		}
		start.StartCmd = strings.Join(words, " ")
	}
	for _, p := range r.ExposedPorts {
		if p < 1 || p > 65535 {
			return fail(invalid("exposedPorts: %d is not a port", p))
		}
	}
	switch {
	case r.ProbePort != nil:
		if *r.ProbePort < 1 || *r.ProbePort > 65535 {
			return fail(invalid("probePort %d is not a port", *r.ProbePort))
		}
		path := r.ProbePath
		if path == "" {
			path = "/"
		}
		if !strings.HasPrefix(path, "/") || strings.ContainsAny(path, " \t\r\n\x00") {
			return fail(invalid("probePath %q must be an absolute URL path", r.ProbePath))
		}
		start.ReadyCmd = agentapi.HTTPProbeCommand(*r.ProbePort, path)
	case r.ProbePath != "":
		return fail(invalid("probePath needs probePort"))
	}
	return cpu, mem, disk, start, nil
}

// ImageBuild is what CubeAPI answers a create or rebuild with.
type ImageBuild struct {
	TemplateID string `json:"templateID"`
	BuildID    string `json:"buildID"`
	// JobID is the same build: CubeAPI's clients read either name.
	JobID  string `json:"jobID"`
	Status string `json:"status"`
}

// CreateFromImage registers a new unnamed template and queues its build
// from r.Image; r.Name moves to it once the build is ready.
func (c *Catalog) CreateFromImage(ctx context.Context, caller Caller, r ImageRequest) (*ImageBuild, error) {
	cpu, mem, disk, start, err := c.plan(&r)
	if err != nil {
		return nil, err
	}
	if c.cfg.Builder == nil {
		return nil, fmt.Errorf("%w: template builds are not enabled on this server", ErrNotImplemented)
	}
	if r.Name != "" {
		// An alias held by a template this key may not change (another
		// team's names are not in its namespace at all) or by a snapshot
		// is refused now, not at the end of the build.
		if err := c.mayTakeAlias(ctx, caller, r.Name, ""); err != nil {
			return nil, err
		}
	}
	b := &store.TemplateBuild{ID: template.NewBuildID(), Status: store.BuildWaiting, CPUCount: cpu, MemoryMB: mem, DiskSizeMB: disk}
	t := &store.Template{ID: NewImageTemplateID(), TeamID: caller.TeamID, CPUCount: cpu, MemoryMB: mem, DiskSizeMB: disk,
		LatestBuildID: b.ID, BuildStatus: store.BuildWaiting, BuildCount: 1}
	b.TemplateID = t.ID
	if err := c.st.CreateTemplate(ctx, t, b); err != nil {
		if errors.Is(err, store.ErrConflict) {
			return nil, fmt.Errorf("%w: %v", ErrConflict, err)
		}
		return nil, err
	}
	if err := c.startImageBuild(ctx, caller, t, b, r, start); err != nil {
		// Nothing was queued: the template would only ever show a failed
		// build, so it goes.
		_ = c.st.DeleteTemplate(context.WithoutCancel(ctx), t.ID)
		return nil, err
	}
	return &ImageBuild{TemplateID: t.ID, BuildID: b.ID, JobID: b.ID, Status: "WAITING"}, nil
}

func (c *Catalog) startImageBuild(ctx context.Context, caller Caller, t *store.Template, b *store.TemplateBuild, r ImageRequest, start StartRequest) error {
	job := Job{TemplateID: t.ID, BuildID: b.ID, TeamID: caller.TeamID, Start: start, FromImage: start.FromImage}
	if err := c.cfg.Builder.Validate(ctx, job); err != nil {
		return err
	}
	r.RegistryPassword = "" // never stored
	return c.queueBuild(ctx, caller, b, start, &r)
}

// ImageRequestOf is the CubeAPI request a template's latest build was
// made from (nil: the template was not made by CubeAPI's create); the
// registry password is not kept.
func (c *Catalog) ImageRequestOf(ctx context.Context, t *store.Template) (*ImageRequest, error) {
	builds, err := c.st.ListTemplateBuilds(ctx, t.ID)
	if err != nil {
		return nil, err
	}
	for _, b := range builds {
		var spec storedSpec
		if b.Spec != "" && json.Unmarshal([]byte(b.Spec), &spec) == nil && spec.Cube != nil {
			return spec.Cube, nil
		}
	}
	return nil, nil
}

// RebuildFromImage builds a template made by CreateFromImage again from
// its stored request (the image reference is pulled again, so a moved tag
// is picked up), as a new build of the same template.
func (c *Catalog) RebuildFromImage(ctx context.Context, caller Caller, ref string) (*ImageBuild, error) {
	t, err := c.Writable(ctx, caller, ref)
	if err != nil {
		return nil, err
	}
	r, err := c.ImageRequestOf(ctx, t)
	if err != nil {
		return nil, err
	}
	if r == nil {
		return nil, invalid("template %s was not created from an image; rebuild it through POST /v3/templates with its name", t.ID)
	}
	if r.RegistryUsername != "" {
		return nil, invalid("template %s pulls a private image and its password is not kept; create it again with the credentials", t.ID)
	}
	if t.ReadyBuildID != "" {
		// The first ready build moved the alias (or lost it to a newer
		// template, or it was changed since): a rebuild leaves it be.
		r.Name = ""
	}
	cpu, mem, disk, start, err := c.plan(r)
	if err != nil {
		return nil, err
	}
	if c.cfg.Builder == nil {
		return nil, fmt.Errorf("%w: template builds are not enabled on this server", ErrNotImplemented)
	}
	b := &store.TemplateBuild{ID: template.NewBuildID(), TemplateID: t.ID, Status: store.BuildWaiting, CPUCount: cpu, MemoryMB: mem, DiskSizeMB: disk}
	prev := t.LatestBuildID
	t.LatestBuildID, t.BuildStatus = b.ID, store.BuildWaiting
	if err := c.st.AddTemplateBuild(ctx, t, b, prev); err != nil {
		if errors.Is(err, store.ErrConflict) {
			return nil, fmt.Errorf("%w: template %s is already building", ErrConflict, t.ID)
		}
		return nil, err
	}
	// A rebuild keeps the alias where it is: the template holds it, or
	// its first build's move is still to come.
	if err := c.startImageBuild(ctx, caller, t, b, *r, start); err != nil {
		return nil, err
	}
	return &ImageBuild{TemplateID: t.ID, BuildID: b.ID, JobID: b.ID, Status: "WAITING"}, nil
}

// mayTakeAlias refuses an alias held by a template the caller may not
// take it from: a built-in, a snapshot, or one it may not change.
func (c *Catalog) mayTakeAlias(ctx context.Context, caller Caller, alias, self string) error {
	holder, err := c.st.TemplateByName(ctx, caller.TeamID, alias)
	if errors.Is(err, store.ErrNotFound) || (err == nil && (holder.ID == self || holder.TeamID != caller.TeamID)) {
		// Free in this team (a public template of another team under the
		// same name is shadowed, as e2b names are).
		return nil
	}
	if err != nil {
		return err
	}
	if builtin(holder.ID) {
		return fmt.Errorf("%w: %q is a name of a built-in template", ErrConflict, alias)
	}
	if !caller.mayChange(holder) {
		return fmt.Errorf("%w: alias %q is held by template %s, which only admin API keys change", ErrForbidden, alias, holder.ID)
	}
	if _, err := c.st.GetSnapshot(ctx, holder.ID); err == nil {
		return fmt.Errorf("%w: %q names snapshot %s", ErrConflict, alias, holder.ID)
	}
	return nil
}

// SetAlias gives the template ref the alias (taking it from the team's
// template that holds it) or, with "", removes its names. It answers the
// template as it is afterwards.
func (c *Catalog) SetAlias(ctx context.Context, caller Caller, ref, alias string) (*store.Template, error) {
	if alias != "" {
		if err := checkAlias(alias); err != nil {
			return nil, err
		}
	}
	t, err := c.Writable(ctx, caller, ref)
	if err != nil {
		return nil, err
	}
	if builtin(t.ID) {
		return nil, fmt.Errorf("%w: the names of built-in templates do not change", ErrConflict)
	}
	if alias != "" {
		if err := c.mayTakeAlias(ctx, caller, alias, t.ID); err != nil {
			return nil, err
		}
	}
	if _, err := c.st.SetTemplateAlias(ctx, t.ID, alias, false); err != nil {
		if errors.Is(err, store.ErrConflict) {
			return nil, fmt.Errorf("%w: %v", ErrConflict, err)
		}
		if errors.Is(err, store.ErrNotFound) {
			return nil, notFound(ref)
		}
		return nil, err
	}
	return c.st.GetTemplate(ctx, t.ID)
}

// claimAlias moves a ready build's pending alias to its template unless a
// newer template holds it; a holder that may no longer give it up (it
// became a snapshot's name meanwhile) keeps it.
func (c *Catalog) claimAlias(ctx context.Context, caller Caller, templateID, buildID, alias string) {
	if err := c.mayTakeAlias(ctx, caller, alias, templateID); err != nil {
		c.logf(ctx, buildID, "warn", "finalize", "alias %s stays where it is: %v", alias, err)
		return
	}
	took, err := c.st.SetTemplateAlias(ctx, templateID, alias, true)
	switch {
	case err != nil:
		c.logf(ctx, buildID, "error", "finalize", "alias %s was not moved to template %s: %v", alias, templateID, err)
	case took:
		c.logf(ctx, buildID, "info", "finalize", "alias %s now names template %s", alias, templateID)
	default:
		c.logf(ctx, buildID, "info", "finalize", "alias %s stays with a newer template", alias)
	}
}
