// Package builder turns template build requests into images and rootfs
// directories: a request without steps is a pull/unpack of its base from the
// local image store (or fromTemplate's rootfs); one with steps is rendered
// to a Dockerfile and solved by BuildKit against the local registry.
package builder

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/cubicle-dev/cubicle/internal/cacerts"
	"github.com/cubicle-dev/cubicle/internal/image"
	"github.com/cubicle-dev/cubicle/internal/template/catalog"
	"github.com/cubicle-dev/cubicle/internal/template/contextstore"
	"github.com/cubicle-dev/cubicle/internal/template/recipe"
)

// SolveError is a failed build at a Dockerfile line (1-based; 0 unknown).
type SolveError struct {
	Line int
	Err  error
}

func (e *SolveError) Error() string { return e.Err.Error() }
func (e *SolveError) Unwrap() error { return e.Err }

// unknownUser is implemented by a Solver's error (errors.As) when an
// instruction ran as a user the image does not have
// (buildkit.UnknownUserError).
type unknownUser interface{ UnknownUser() string }

// RunUserError: a RUN step ran as a user the image does not have. Its text
// is e2b's for the same failure, where envd refuses to start the process
// (orchestrator template/build/commands/run.go and sandboxtools/command.go
// around envd's "invalid username: '%s'"), since build logs and the SDK's
// BuildError show it to users.
type RunUserError struct {
	Command, User string
	Err           error
}

func (e *RunUserError) Error() string {
	return fmt.Sprintf("failed to run command '%s': command failed: unauthenticated: invalid username: '%s'", e.Command, e.User)
}

func (e *RunUserError) Unwrap() error { return e.Err }

// e2bSolveError gives a Solver failure of step (an index into job's steps,
// as the build's reason names it) e2b's wording where e2b has one.
func e2bSolveError(job catalog.Job, step string, err error) error {
	var uu unknownUser
	if !errors.As(err, &uu) {
		return err
	}
	i, aerr := strconv.Atoi(step)
	if aerr != nil || i < 0 || i >= len(job.Start.Steps) {
		return err
	}
	st := job.Start.Steps[i]
	if !strings.EqualFold(st.Type, "RUN") || len(st.Args) == 0 {
		return err
	}
	return &RunUserError{Command: st.Args[0], User: uu.UnknownUser(), Err: err}
}

// Solver runs a Dockerfile build and pushes the result (BuildKit). log
// gets the Dockerfile line (1-based, 0 unknown) each message belongs to.
type Solver interface {
	Solve(ctx context.Context, dockerfile []byte, contextDir string, noCache bool, push string, secrets map[string][]byte,
		log func(level, msg string, line int)) error
}

// Availability is a Solver that can be without a builder for a while (a
// cluster's builder nodes): Available says why a build cannot start now.
type Availability interface {
	Available(ctx context.Context) error
}

// Config wires the builder.
type Config struct {
	Images   *image.Store
	Contexts *contextstore.Store
	// Registry is host:port of the registry view of Images that the
	// Solver pulls FROM and pushes to.
	Registry  string
	Solver    Solver // nil: recipes with steps are refused (501)
	RootfsDir string // <dir>/<buildID>/rootfs
	WorkDir   string // scratch for build contexts
	// CACerts, when set, are trusted by every RUN step (caOptions).
	CACerts *cacerts.Set
}

// Builder implements catalog.Builder.
type Builder struct{ cfg Config }

var _ catalog.Builder = (*Builder)(nil)

// New validates the config.
func New(cfg Config) (*Builder, error) {
	if cfg.Images == nil || cfg.RootfsDir == "" || cfg.WorkDir == "" {
		return nil, errors.New("builder: Images, RootfsDir and WorkDir are required")
	}
	for _, d := range []string{cfg.RootfsDir, cfg.WorkDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, err
		}
	}
	return &Builder{cfg: cfg}, nil
}

// contexts is the build-context store of the team that started the job:
// only its own uploads are present for it.
func (b *Builder) contexts(job catalog.Job) (*contextstore.Store, error) {
	if b.cfg.Contexts == nil {
		return nil, errors.New("builder: no build-context store")
	}
	return b.cfg.Contexts.Team(job.TeamID)
}

func (b *Builder) haveTar(job catalog.Job) func(string) bool {
	return func(h string) bool {
		cs, err := b.contexts(job)
		return err == nil && cs.Has(h)
	}
}

func steps(job catalog.Job) recipe.BuildStart {
	req := recipe.BuildStart{FromImage: job.Start.FromImage, FromTemplate: job.Start.FromTemplate, Force: job.Start.Force,
		StartCmd: job.Start.StartCmd, ReadyCmd: job.Start.ReadyCmd}
	for _, s := range job.Start.Steps {
		req.Steps = append(req.Steps, recipe.Step{Type: s.Type, Args: s.Args, FilesHash: s.FilesHash, Force: s.Force})
	}
	return req
}

// localRef is the base image's name in the local store, or "" when absent.
func (b *Builder) localRef(ref string) string {
	name, err := image.NormalizeRef(ref)
	if err != nil {
		return ""
	}
	if _, err := b.cfg.Images.Get(name); err != nil {
		return ""
	}
	return name
}

// Validate rejects what would fail before any work: a bad recipe, a missing
// context, a base image that is nowhere, or steps without a builder.
func (b *Builder) Validate(ctx context.Context, job catalog.Job) error {
	if len(job.Start.Steps) == 0 {
		if job.FromRootfs != "" || b.localRef(job.FromImage) != "" {
			return nil
		}
		// Otherwise BuildKit pulls it, if there is one to run now.
		if b.cfg.Solver != nil {
			err := b.available(ctx)
			if err == nil {
				return nil
			}
			return fmt.Errorf("%w: image %q is not in the local image store, and no builder can pull it: %v", catalog.ErrInvalid, job.FromImage, err)
		}
		return fmt.Errorf("%w: image %q is not in the local image store (add it with `cubicle image import`)", catalog.ErrInvalid, job.FromImage)
	}
	if b.cfg.Solver == nil {
		return fmt.Errorf("%w: builds with steps need BuildKit, which is not running on this server", catalog.ErrNotImplemented)
	}
	if err := b.available(ctx); err != nil {
		return fmt.Errorf("%w: builds with steps: %v", catalog.ErrNotImplemented, err)
	}
	if _, err := recipe.Render(steps(job), "base", job.BuildID, b.haveTar(job)); err != nil {
		return fmt.Errorf("%w: %v", catalog.ErrInvalid, err)
	}
	return nil
}

// available is nil when the Solver can run a build now.
func (b *Builder) available(ctx context.Context) error {
	if a, ok := b.cfg.Solver.(Availability); ok {
		return a.Available(ctx)
	}
	return nil
}

// Build implements catalog.Builder.
func (b *Builder) Build(ctx context.Context, job catalog.Job, log catalog.LogFunc) (catalog.Output, error) {
	dest := filepath.Join(b.cfg.RootfsDir, job.BuildID, "rootfs")
	if err := os.MkdirAll(filepath.Dir(dest), 0o755); err != nil {
		return catalog.Output{}, err
	}
	if len(job.Start.Steps) == 0 {
		return b.noSteps(ctx, job, dest, log)
	}
	return b.withSteps(ctx, job, dest, log)
}

func (b *Builder) noSteps(ctx context.Context, job catalog.Job, dest string, log catalog.LogFunc) (catalog.Output, error) {
	if job.FromRootfs != "" {
		// Same filesystem as the source template's ready build: share it.
		log("info", "using the ready image of template "+job.Start.FromTemplate, "base")
		return catalog.Output{Image: job.FromImage, ImageDigest: job.FromImageDigest, Rootfs: job.FromRootfs}, nil
	}
	ref := b.localRef(job.FromImage)
	if ref == "" {
		if b.cfg.Solver == nil {
			return catalog.Output{}, &catalog.BuildError{Step: "base", Err: fmt.Errorf("image %q is not in the local image store", job.FromImage)}
		}
		// Let BuildKit pull it from its registry.
		return b.withSteps(ctx, job, dest, log)
	}
	log("info", "unpacking image "+ref, "base")
	if err := b.cfg.Images.Unpack(ref, dest); err != nil {
		return catalog.Output{}, &catalog.BuildError{Step: "base", Err: fmt.Errorf("unpack %s: %v", ref, err)}
	}
	digest, err := b.digestOf(ref)
	if err != nil {
		return catalog.Output{}, &catalog.BuildError{Step: "base", Err: err}
	}
	return catalog.Output{Image: ref, ImageDigest: digest, Rootfs: dest}, nil
}

// digestOf is the manifest digest of ref in the local store, recorded in
// the build's row so that every replica names the image by digest.
func (b *Builder) digestOf(ref string) (string, error) {
	d, err := b.cfg.Images.Resolve(ref)
	if err != nil {
		return "", fmt.Errorf("image %s: %v", ref, err)
	}
	return d.Digest.String(), nil
}

func (b *Builder) withSteps(ctx context.Context, job catalog.Job, dest string, log catalog.LogFunc) (catalog.Output, error) {
	if b.cfg.Solver == nil {
		return catalog.Output{}, &catalog.BuildError{Step: "base", Err: errors.New("BuildKit is not running on this server")}
	}
	work := filepath.Join(b.cfg.WorkDir, job.BuildID)
	if err := os.MkdirAll(work, 0o700); err != nil {
		return catalog.Output{}, err
	}
	defer os.RemoveAll(work)
	base := job.FromImage
	if base == "" && job.FromRootfs != "" {
		// fromTemplate of a template that has a rootfs but no image (the
		// seeded ones): make it an image once so BuildKit can start FROM it.
		ref, err := rootfsRef(job.FromRootfs)
		if err != nil {
			return catalog.Output{}, &catalog.BuildError{Step: "base", Err: fmt.Errorf("base rootfs %s: %v", job.FromRootfs, err)}
		}
		if b.localRef(ref) == "" {
			log("info", "importing the base rootfs into the image store", "base")
			if err := b.importRootfs(ref, job.FromRootfs, work); err != nil {
				return catalog.Output{}, &catalog.BuildError{Step: "base", Err: fmt.Errorf("import %s: %v", job.FromRootfs, err)}
			}
		}
		base = ref
	}
	baseLocal := b.localRef(base)
	if baseLocal != "" {
		base = b.cfg.Registry + "/" + baseLocal
	}
	ctxDir := filepath.Join(work, "context")
	if err := os.MkdirAll(ctxDir, 0o700); err != nil {
		return catalog.Output{}, err
	}
	opts, err := caOptions(b.cfg.CACerts, ctxDir)
	if err != nil {
		return catalog.Output{}, err
	}
	res, err := recipe.RenderWith(steps(job), base, job.BuildID, b.haveTar(job), opts)
	if err != nil {
		return catalog.Output{}, &catalog.BuildError{Step: "base", Err: err}
	}
	for _, h := range res.Hashes {
		cs, err := b.contexts(job)
		if err == nil {
			err = cs.Extract(h, ctxDir)
		}
		if err != nil {
			return catalog.Output{}, &catalog.BuildError{Step: "base", Err: fmt.Errorf("unpack build context %s: %v", h, err)}
		}
	}
	push := fmt.Sprintf("%s/%s:%s", b.cfg.Registry, ImageRepository(job.TemplateID), job.BuildID)
	secrets := map[string][]byte{}
	if r := job.Start.FromImageRegistry; r != nil && r.Username != "" {
		secrets["registry-username"], secrets["registry-password"] = []byte(r.Username), []byte(r.Password)
	}
	log("info", "building with BuildKit", "base")
	lastStep := "base"
	err = b.cfg.Solver.Solve(ctx, res.Dockerfile, ctxDir, res.NoCache, push, secrets, func(level, msg string, line int) {
		step := ""
		if i, ok := res.StepOfLine[line]; ok {
			step = strconv.Itoa(i)
			lastStep = step
		}
		log(level, msg, step)
	})
	if err != nil {
		var se *SolveError
		if errors.As(err, &se) {
			if i, ok := res.StepOfLine[se.Line]; ok {
				lastStep = strconv.Itoa(i)
			}
		}
		return catalog.Output{}, &catalog.BuildError{Step: lastStep, Err: e2bSolveError(job, lastStep, err)}
	}
	name, _ := image.NormalizeRef(push)
	log("info", "unpacking the built image", "finalize")
	rootfs, err := b.unpack(name, baseLocal, job.FromRootfs, dest)
	if err != nil {
		return catalog.Output{}, &catalog.BuildError{Step: "finalize", Err: fmt.Errorf("unpack %s: %v", name, err)}
	}
	digest, err := b.digestOf(name)
	if err != nil {
		return catalog.Output{}, &catalog.BuildError{Step: "finalize", Err: err}
	}
	runAs := res.User
	return catalog.Output{Image: name, ImageDigest: digest, Rootfs: rootfs, RunAs: runAs, Workdir: res.Workdir}, nil
}
