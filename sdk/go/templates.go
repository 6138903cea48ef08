package cubicle

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// TemplateStep is one build step on the wire (RUN, COPY, ENV, WORKDIR,
// USER). COPY's Args are [src, dest, user?, mode?]; BuildTemplate fills
// FilesHash from the context.
type TemplateStep struct {
	Type      string   `json:"type"`
	Args      []string `json:"args"`
	FilesHash string   `json:"filesHash,omitempty"`
	Force     bool     `json:"force"`
	line      int      // where a parsed recipe wrote it
}

// Line is the recipe line the step came from (0 when not parsed).
func (s TemplateStep) Line() int { return s.line }

// TemplateSpec is a template recipe: a base, steps and the start/ready
// commands, plus the name and resources of the template it builds.
type TemplateSpec struct {
	// Name is NAME or NAME:TAG.
	Name     string
	Tags     []string
	CPUCount int
	MemoryMB int
	// FromImage (an OCI reference) or FromTemplate (a template name) is the base.
	FromImage    string
	FromTemplate string
	Steps        []TemplateStep
	StartCmd     string
	ReadyCmd     string
	// Force rebuilds every step instead of using the cache.
	Force bool
	// ContextDir holds COPY sources (default "."); .dockerignore applies.
	ContextDir string
}

// TemplateBuildRef names one build of a template.
type TemplateBuildRef struct {
	TemplateID string   `json:"templateID"`
	BuildID    string   `json:"buildID"`
	Names      []string `json:"names"`
	Tags       []string `json:"tags"`
}

// BuildLogEntry is one line of a build's log. Step is "base", "finalize"
// or the decimal index of a step.
type BuildLogEntry struct {
	Timestamp time.Time `json:"timestamp"`
	Message   string    `json:"message"`
	Level     string    `json:"level"`
	Step      string    `json:"step,omitempty"`
}

// BuildStatus is a build's state and the log entries after an offset.
type BuildStatus struct {
	TemplateID string          `json:"templateID"`
	BuildID    string          `json:"buildID"`
	Status     string          `json:"status"` // waiting, building, ready, error
	LogEntries []BuildLogEntry `json:"logEntries"`
	Reason     *struct {
		Message string `json:"message"`
		Step    string `json:"step,omitempty"`
	} `json:"reason,omitempty"`
}

// UploadProgress reports a COPY context upload.
type UploadProgress struct {
	Src         string // the COPY source
	Sent, Total int64  // bytes of the archive
	Cached      bool   // the server already had it; nothing is sent
	Done        bool
}

// BuildOptions carries BuildTemplate's callbacks.
type BuildOptions struct {
	// OnCreated runs once the template and build IDs exist.
	OnCreated func(TemplateBuildRef)
	// OnUpload reports each COPY upload as it goes.
	OnUpload func(UploadProgress)
	// OnLog receives every build log entry, in order.
	OnLog func(BuildLogEntry)
	// PollInterval is how often the status is polled (default 200 ms,
	// the e2b SDK's).
	PollInterval time.Duration
}

// BuildError is a build that ended in status error.
type BuildError struct {
	TemplateID, BuildID string
	// Step is where it failed: "base", "finalize" or a step index.
	Step    string
	Message string
}

// Error implements error.
func (e *BuildError) Error() string {
	where := ""
	if e.Step != "" {
		where = " at step " + e.Step
	}
	return fmt.Sprintf("build %s of template %s failed%s: %s", e.BuildID, e.TemplateID, where, e.Message)
}

// StepFilesError is a COPY step whose files could not be read or hashed;
// nothing was sent to the server.
type StepFilesError struct {
	Step int // index into TemplateSpec.Steps
	Err  error
}

// Error implements error.
func (e *StepFilesError) Error() string { return fmt.Sprintf("step %d: %v", e.Step, e.Err) }

// Unwrap returns the cause (*NoFilesError, *FileTypeError, an fs error).
func (e *StepFilesError) Unwrap() error { return e.Err }

// UploadError is a failed PUT of a context archive.
type UploadError struct {
	Src    string
	Status int
	Body   string
}

// Error implements error.
func (e *UploadError) Error() string {
	return fmt.Sprintf("upload of %q failed: %d %s", e.Src, e.Status, strings.TrimSpace(e.Body))
}

// BuildInterruptedError is a cancelled BuildTemplate or WaitTemplateBuild.
// The server keeps (or, when !Started, is left waiting to start) the build.
type BuildInterruptedError struct {
	TemplateBuildRef
	Started bool
	Err     error
}

// Error implements error.
func (e *BuildInterruptedError) Error() string {
	if !e.Started {
		return fmt.Sprintf("interrupted before build %s of template %s was started", e.BuildID, e.TemplateID)
	}
	return fmt.Sprintf("interrupted: stopped following build %s of template %s; the build continues on the server", e.BuildID, e.TemplateID)
}

// Unwrap returns the context's error.
func (e *BuildInterruptedError) Unwrap() error { return e.Err }

// TemplateCreate is what CreateTemplate registers.
type TemplateCreate struct {
	Name     string   `json:"name"`
	Tags     []string `json:"tags,omitempty"`
	CPUCount int      `json:"cpuCount,omitempty"`
	MemoryMB int      `json:"memoryMB,omitempty"`
}

// CreateTemplate registers a template (or a new build of an existing name)
// and returns the build to start.
func (c *Client) CreateTemplate(ctx context.Context, t TemplateCreate) (*TemplateBuildRef, error) {
	var ref TemplateBuildRef
	if _, err := c.do(ctx, request{method: http.MethodPost, path: "/v3/templates", body: t, out: &ref, res: resTemplate}); err != nil {
		return nil, err
	}
	return &ref, nil
}

// FileLink says whether the server has a COPY context and where to put it.
type FileLink struct {
	Present bool              `json:"present"`
	URL     string            `json:"url,omitempty"`
	Headers map[string]string `json:"headers,omitempty"`
}

// TemplateFileLink asks whether the context with hash is cached.
func (c *Client) TemplateFileLink(ctx context.Context, templateID, hash string) (*FileLink, error) {
	var l FileLink
	if _, err := c.do(ctx, request{method: http.MethodGet, path: "/templates/" + seg(templateID) + "/files/" + seg(hash), out: &l, res: resTemplate}); err != nil {
		return nil, err
	}
	return &l, nil
}

// UploadContext archives entries and PUTs them to link.URL with an exact
// Content-Length (the archive is spooled to a temp file, not memory).
func (c *Client) UploadContext(ctx context.Context, src string, link *FileLink, entries []ContextEntry, progress func(UploadProgress)) (int64, error) {
	f, err := os.CreateTemp("", "cubicle-context-*.tar.gz")
	if err != nil {
		return 0, err
	}
	defer os.Remove(f.Name())
	defer f.Close()
	bw := bufio.NewWriter(f)
	if err := WriteContextArchive(bw, entries); err != nil {
		return 0, fmt.Errorf("archive %q: %w", src, err)
	}
	if err := bw.Flush(); err != nil {
		return 0, err
	}
	size, err := f.Seek(0, io.SeekCurrent)
	if err != nil {
		return 0, err
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return 0, err
	}
	var body io.Reader = f
	if progress != nil {
		body = &countingReader{r: f, fn: func(n int64) { progress(UploadProgress{Src: src, Sent: n, Total: size}) }}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, link.URL, io.NopCloser(body))
	if err != nil {
		return 0, err
	}
	for k, v := range link.Headers {
		if !strings.EqualFold(k, "Content-Length") {
			req.Header.Set(k, v)
		}
	}
	req.ContentLength = size // no API key: the URL carries its own authorisation
	resp, err := c.http.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return 0, ctx.Err()
		}
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<14))
		return 0, &UploadError{Src: src, Status: resp.StatusCode, Body: string(b)}
	}
	if progress != nil {
		progress(UploadProgress{Src: src, Sent: size, Total: size, Done: true})
	}
	return size, nil
}

type countingReader struct {
	r    io.Reader
	n    int64
	fn   func(int64)
	last time.Time
}

// Read implements io.Reader.
func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	if now := time.Now(); now.Sub(c.last) > 100*time.Millisecond {
		c.last = now
		c.fn(c.n)
	}
	return n, err
}

// buildStart is TemplateBuildStartV2.
type buildStart struct {
	FromImage    string         `json:"fromImage,omitempty"`
	FromTemplate string         `json:"fromTemplate,omitempty"`
	Force        bool           `json:"force"`
	Steps        []TemplateStep `json:"steps"`
	StartCmd     string         `json:"startCmd,omitempty"`
	ReadyCmd     string         `json:"readyCmd,omitempty"`
}

// StartTemplateBuild starts a created build with spec's base and steps
// (their FilesHash must be set and uploaded).
func (c *Client) StartTemplateBuild(ctx context.Context, ref TemplateBuildRef, spec TemplateSpec) error {
	b := buildStart{FromImage: spec.FromImage, FromTemplate: spec.FromTemplate, Force: spec.Force, Steps: spec.Steps, StartCmd: spec.StartCmd, ReadyCmd: spec.ReadyCmd}
	if b.Steps == nil {
		b.Steps = []TemplateStep{}
	}
	_, err := c.do(ctx, request{method: http.MethodPost, path: "/v2/templates/" + seg(ref.TemplateID) + "/builds/" + seg(ref.BuildID), body: b, res: resTemplate})
	return err
}

// TemplateBuildStatus returns a build's status and its log entries from
// logsOffset on.
func (c *Client) TemplateBuildStatus(ctx context.Context, templateID, buildID string, logsOffset int) (*BuildStatus, error) {
	var st BuildStatus
	q := url.Values{"logsOffset": {strconv.Itoa(logsOffset)}}
	if _, err := c.do(ctx, request{method: http.MethodGet, path: "/templates/" + seg(templateID) + "/builds/" + seg(buildID) + "/status", query: q, out: &st, res: resTemplate}); err != nil {
		return nil, err
	}
	return &st, nil
}

// WaitTemplateBuild follows a build until it ends, like the e2b SDK: poll
// while waiting/building, then drain the log. A failed build returns its
// status and a *BuildError; cancelling ctx a *BuildInterruptedError.
func (c *Client) WaitTemplateBuild(ctx context.Context, templateID, buildID string, onLog func(BuildLogEntry), poll time.Duration) (*BuildStatus, error) {
	if poll <= 0 {
		poll = 200 * time.Millisecond
	}
	interrupted := func(err error) error {
		return &BuildInterruptedError{TemplateBuildRef: TemplateBuildRef{TemplateID: templateID, BuildID: buildID}, Started: true, Err: err}
	}
	offset := 0
	for {
		st, err := c.TemplateBuildStatus(ctx, templateID, buildID, offset)
		if err != nil {
			if ctx.Err() != nil {
				return nil, interrupted(ctx.Err())
			}
			return nil, err
		}
		if onLog != nil {
			for _, e := range st.LogEntries {
				onLog(e)
			}
		}
		offset += len(st.LogEntries)
		switch st.Status {
		case "building", "waiting":
			if err := sleepCtx(ctx, poll); err != nil {
				return nil, interrupted(err)
			}
		case "ready", "error":
			if len(st.LogEntries) > 0 {
				continue // drain the rest of the log first
			}
			if st.Status == "error" {
				e := &BuildError{TemplateID: templateID, BuildID: buildID, Message: "unknown error"}
				if st.Reason != nil {
					e.Step, e.Message = st.Reason.Step, st.Reason.Message
				}
				return st, e
			}
			return st, nil
		default:
			return nil, fmt.Errorf("build %s: unknown status %q", buildID, st.Status)
		}
	}
}

// BuildTemplate runs the whole build: hash every COPY source first (so a
// missing file creates nothing), create the template, upload what the
// server lacks, start the build and follow it to the end.
func (c *Client) BuildTemplate(ctx context.Context, spec TemplateSpec, o *BuildOptions) (*TemplateBuildRef, error) {
	if o == nil {
		o = &BuildOptions{}
	}
	if spec.Name == "" {
		return nil, fmt.Errorf("%w: template name is required", ErrInvalidArgument)
	}
	if (spec.FromImage == "") == (spec.FromTemplate == "") {
		return nil, fmt.Errorf("%w: exactly one of FromImage and FromTemplate is required", ErrInvalidArgument)
	}
	ctxDir := spec.ContextDir
	if ctxDir == "" {
		ctxDir = "."
	}
	ctxDir, err := filepath.Abs(ctxDir)
	if err != nil {
		return nil, err
	}
	spec.Steps = append([]TemplateStep(nil), spec.Steps...)
	files := map[int][]ContextEntry{}
	var ignore []string
	ignoreRead := false
	for i := range spec.Steps {
		st := &spec.Steps[i]
		if st.Type != "COPY" {
			continue
		}
		if len(st.Args) < 2 {
			return nil, &StepFilesError{Step: i, Err: fmt.Errorf("%w: COPY needs a source and a destination", ErrInvalidArgument)}
		}
		if !ignoreRead {
			if ignore, _, err = ReadDockerignore(ctxDir); err != nil {
				return nil, err
			}
			ignoreRead = true
		}
		ents, err := CollectContext(ctxDir, st.Args[0], ignore)
		if err != nil {
			return nil, &StepFilesError{Step: i, Err: err}
		}
		if st.FilesHash, err = FilesHash(st.Args[0], st.Args[1], ents); err != nil {
			return nil, &StepFilesError{Step: i, Err: err}
		}
		files[i] = ents
	}
	ref, err := c.CreateTemplate(ctx, TemplateCreate{Name: spec.Name, Tags: spec.Tags, CPUCount: spec.CPUCount, MemoryMB: spec.MemoryMB})
	if err != nil {
		return nil, err
	}
	if o.OnCreated != nil {
		o.OnCreated(*ref)
	}
	notStarted := func(err error) error {
		if ctx.Err() != nil {
			return &BuildInterruptedError{TemplateBuildRef: *ref, Err: ctx.Err()}
		}
		return err
	}
	sent := map[string]bool{}
	for i, st := range spec.Steps {
		if st.Type != "COPY" || sent[st.FilesHash] {
			continue
		}
		sent[st.FilesHash] = true
		link, err := c.TemplateFileLink(ctx, ref.TemplateID, st.FilesHash)
		if err != nil {
			return ref, notStarted(fmt.Errorf("upload link for %q: %w", st.Args[0], err))
		}
		if link.Present || link.URL == "" {
			if o.OnUpload != nil {
				o.OnUpload(UploadProgress{Src: st.Args[0], Cached: true, Done: true})
			}
			continue
		}
		if _, err := c.UploadContext(ctx, st.Args[0], link, files[i], o.OnUpload); err != nil {
			return ref, notStarted(err)
		}
	}
	if err := c.StartTemplateBuild(ctx, *ref, spec); err != nil {
		return ref, notStarted(fmt.Errorf("start build: %w", err))
	}
	_, err = c.WaitTemplateBuild(ctx, ref.TemplateID, ref.BuildID, o.OnLog, o.PollInterval)
	var ie *BuildInterruptedError
	if errors.As(err, &ie) {
		ie.TemplateBuildRef = *ref
	}
	return ref, err
}

// TemplateBuild is one build in TemplateInfo.Builds.
type TemplateBuild struct {
	BuildID    string     `json:"buildID"`
	Status     string     `json:"status"`
	CreatedAt  time.Time  `json:"createdAt"`
	UpdatedAt  time.Time  `json:"updatedAt"`
	FinishedAt *time.Time `json:"finishedAt,omitempty"`
	CPUCount   int        `json:"cpuCount"`
	MemoryMB   int        `json:"memoryMB"`
	DiskSizeMB int        `json:"diskSizeMB"`
}

// TemplateInfo describes a template.
type TemplateInfo struct {
	TemplateID    string     `json:"templateID"`
	BuildID       string     `json:"buildID"`
	CPUCount      int        `json:"cpuCount"`
	MemoryMB      int        `json:"memoryMB"`
	DiskSizeMB    int        `json:"diskSizeMB"`
	Public        bool       `json:"public"`
	Names         []string   `json:"names"`
	CreatedAt     time.Time  `json:"createdAt"`
	UpdatedAt     time.Time  `json:"updatedAt"`
	LastSpawnedAt *time.Time `json:"lastSpawnedAt"`
	SpawnCount    int64      `json:"spawnCount"`
	BuildCount    int64      `json:"buildCount"`
	BuildStatus   string     `json:"buildStatus"`
	EnvdVersion   string     `json:"envdVersion,omitempty"`
	// PoolSize is the warm pool size (0: none).
	PoolSize int             `json:"poolSize"`
	Builds   []TemplateBuild `json:"builds,omitempty"`
}

// ListTemplates lists every template, across pages.
func (c *Client) ListTemplates(ctx context.Context) ([]TemplateInfo, error) {
	var all []TemplateInfo
	next := ""
	for {
		q := url.Values{"limit": {"100"}}
		if next != "" {
			q.Set("nextToken", next)
		}
		var page []TemplateInfo
		resp, err := c.do(ctx, request{method: http.MethodGet, path: "/v2/templates", query: q, out: &page})
		if err != nil {
			return nil, err
		}
		all = append(all, page...)
		next = resp.header.Get("X-Next-Token")
		if next == "" || len(page) == 0 {
			return all, nil
		}
	}
}

// GetTemplate returns a template by ID or name, with its builds.
func (c *Client) GetTemplate(ctx context.Context, idOrName string) (*TemplateInfo, error) {
	var t TemplateInfo
	if _, err := c.do(ctx, request{method: http.MethodGet, path: "/templates/" + seg(idOrName), out: &t, res: resTemplate}); err != nil {
		return nil, err
	}
	return &t, nil
}

// DeleteTemplate deletes a template; without force the server refuses
// (ErrConflict) while it is building or in use.
func (c *Client) DeleteTemplate(ctx context.Context, idOrName string, force bool) error {
	var q url.Values
	if force {
		q = url.Values{"force": {"true"}}
	}
	_, err := c.do(ctx, request{method: http.MethodDelete, path: "/templates/" + seg(idOrName), query: q, res: resTemplate})
	return err
}

// TemplateAlias is what an alias lookup finds.
type TemplateAlias struct {
	TemplateID string `json:"templateID"`
	Public     bool   `json:"public"`
}

// TemplateByAlias resolves a template name. ErrTemplateNotFound when none
// has it; ErrForbidden when it exists but belongs to another team.
func (c *Client) TemplateByAlias(ctx context.Context, alias string) (*TemplateAlias, error) {
	var a TemplateAlias
	if _, err := c.do(ctx, request{method: http.MethodGet, path: "/templates/aliases/" + seg(alias), out: &a, res: resTemplate}); err != nil {
		return nil, err
	}
	return &a, nil
}

// WarmPool is a template's pool of pre-started sandboxes.
type WarmPool struct {
	TemplateID string   `json:"templateID"`
	PoolSize   int      `json:"poolSize"`
	Ready      int      `json:"ready"`
	Standbys   []string `json:"standbys"`
}

// GetWarmPool reports a template's warm pool.
func (c *Client) GetWarmPool(ctx context.Context, template string) (*WarmPool, error) {
	var p WarmPool
	if _, err := c.do(ctx, request{method: http.MethodGet, path: "/templates/" + seg(template) + "/pool", out: &p, res: resTemplate}); err != nil {
		return nil, err
	}
	return &p, nil
}

// SetWarmPool sets how many sandboxes of template are kept started (0 turns
// the pool off); the pool fills in the background.
func (c *Client) SetWarmPool(ctx context.Context, template string, size int) (*WarmPool, error) {
	var p WarmPool
	if _, err := c.do(ctx, request{method: http.MethodPut, path: "/templates/" + seg(template) + "/pool", body: map[string]int{"size": size}, out: &p, res: resTemplate}); err != nil {
		return nil, err
	}
	return &p, nil
}
