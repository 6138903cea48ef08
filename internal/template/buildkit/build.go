package buildkit

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"time"

	bkclient "github.com/moby/buildkit/client"
	"github.com/moby/buildkit/frontend/dockerfile/parser"
	"github.com/moby/buildkit/session"
	"github.com/moby/buildkit/session/secrets/secretsprovider"
	"github.com/moby/buildkit/solver/errdefs"
	"github.com/tonistiigi/fsutil"
	"golang.org/x/sync/errgroup"
)

// ErrBuildFailed: the Dockerfile did not build (a step failed, bad syntax, a
// base image missing, the push refused). errors.As to *BuildError for the step.
var ErrBuildFailed = errors.New("buildkit: build failed")

// BuildError says which instruction failed. Is(ErrBuildFailed) holds; Unwrap
// gives BuildKit's own error.
type BuildError struct {
	Step        int    // zero-based Dockerfile instruction index, -1 if unknown
	Instruction string // e.g. "RUN false", "" if unknown
	Err         error
}

func (e *BuildError) Error() string {
	if e.Step >= 0 {
		return fmt.Sprintf("build failed at step %d (%s): %v", e.Step, e.Instruction, e.Err)
	}
	return fmt.Sprintf("build failed: %v", e.Err)
}

func (e *BuildError) Is(target error) bool { return target == ErrBuildFailed }
func (e *BuildError) Unwrap() error        { return e.Err }

// UnknownUserError: an instruction ran as a user the image's passwd file
// does not have (USER u before a RUN). errors.As from a Build error; its
// message is BuildKit's.
type UnknownUserError struct {
	User string
	Err  error
}

func (e *UnknownUserError) Error() string { return e.Err.Error() }
func (e *UnknownUserError) Unwrap() error { return e.Err }

// UnknownUser names the user; it lets callers that see BuildKit only through
// an interface check for this failure without importing this package.
func (e *UnknownUserError) UnknownUser() string { return e.User }

// unknownUserRe matches the error BuildKit's executor returns from
// github.com/moby/sys/user (GetExecUser: "unable to find user %s: %w" with
// ErrNoPasswdEntries). The typed error does not survive BuildKit's gRPC
// boundary, which carries only its text, so this is the one place that
// reads it.
var unknownUserRe = regexp.MustCompile(`unable to find user ([^\s:]+): no matching entries in passwd file`)

// classify gives a solve error a type where BuildKit's text is the only
// evidence of what failed.
func classify(err error) error {
	if m := unknownUserRe.FindStringSubmatch(err.Error()); m != nil {
		return &UnknownUserError{User: m[1], Err: err}
	}
	return err
}

// BuildRequest is one Dockerfile build.
type BuildRequest struct {
	Dockerfile []byte
	ContextDir string // build context; COPY sources are relative to it
	NoCache    bool
	// Push is the reference to push to, in the local registry, e.g.
	// 127.0.0.1:PORT/cubicle/tpl_x:bld_y. Its host must be in
	// Config.InsecureRegistries.
	Push    string
	Secrets map[string][]byte // RUN --mount=type=secret,id=KEY
}

// Log is one line of build progress.
type Log struct {
	Time    time.Time
	Level   string // "info", "error"
	Message string
	Step    int // zero-based Dockerfile instruction index if known, else -1
}

// Build runs req on the daemon and returns the pushed manifest digest.
// onLog (optional) gets progress: a line per step as it starts, finishes or
// is cached, and the step's output lines. It is called from one goroutine.
func (d *Daemon) Build(ctx context.Context, req BuildRequest, onLog func(Log)) (string, error) {
	return build(ctx, d.client, d.cfg.RegistryAuth, req, onLog)
}

// Remote is a buildkitd elsewhere (a cluster's builder node), reached by
// Dial. Its builds run as a Daemon's do: the session (context, secrets,
// registry credentials) is served from this process over that connection.
type Remote struct {
	// Dial opens a connection to buildkitd's gRPC endpoint; it is called
	// once per build.
	Dial func(ctx context.Context) (net.Conn, error)
	// RegistryAuth are the credentials each build presents to a registry
	// (by host:port, as buildkitd names it), through its session.
	RegistryAuth map[string]Credentials
}

// Build is Daemon.Build on the remote buildkitd.
func (r *Remote) Build(ctx context.Context, req BuildRequest, onLog func(Log)) (string, error) {
	connect := func(ctx context.Context) (*bkclient.Client, error) {
		return bkclient.New(ctx, "", bkclient.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return r.Dial(ctx) }))
	}
	return build(ctx, connect, r.RegistryAuth, req, onLog)
}

// build runs req on the buildkitd connect reaches.
func build(ctx context.Context, connect func(context.Context) (*bkclient.Client, error), creds map[string]Credentials, req BuildRequest, onLog func(Log)) (string, error) {
	if req.Push == "" {
		return "", errors.New("buildkit: BuildRequest.Push is required")
	}
	if onLog == nil {
		onLog = func(Log) {}
	}
	insts, err := parseInstructions(req.Dockerfile)
	if err != nil {
		return "", &BuildError{Step: -1, Err: err}
	}
	dfDir, err := os.MkdirTemp("", "cubicle-dockerfile-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(dfDir)
	if err := os.WriteFile(filepath.Join(dfDir, "Dockerfile"), req.Dockerfile, 0o600); err != nil {
		return "", err
	}
	ctxDir := req.ContextDir
	if ctxDir == "" {
		// An empty context: FROM/RUN-only recipes need none.
		ctxDir = dfDir + "/empty"
		if err := os.Mkdir(ctxDir, 0o700); err != nil {
			return "", err
		}
	}
	ctxFS, err := fsutil.NewFS(ctxDir)
	if err != nil {
		return "", err
	}
	dfFS, err := fsutil.NewFS(dfDir)
	if err != nil {
		return "", err
	}
	attrs := map[string]string{"filename": "Dockerfile"}
	if req.NoCache {
		attrs["no-cache"] = ""
	}
	opt := bkclient.SolveOpt{
		Frontend:      "dockerfile.v0",
		FrontendAttrs: attrs,
		LocalMounts:   map[string]fsutil.FS{"context": ctxFS, "dockerfile": dfFS},
		Exports: []bkclient.ExportEntry{{
			Type: bkclient.ExporterImage,
			Attrs: map[string]string{
				"name":              req.Push,
				"push":              "true",
				"registry.insecure": "true",
				"oci-mediatypes":    "true",
			},
		}},
		Session: []session.Attachable{secretsprovider.FromMap(req.Secrets), &registryAuth{creds: creds}},
	}

	c, err := connect(ctx)
	if err != nil {
		return "", err
	}
	defer c.Close()

	tr := newTracker(insts, onLog)
	ch := make(chan *bkclient.SolveStatus)
	var resp *bkclient.SolveResponse
	eg, ectx := errgroup.WithContext(ctx)
	eg.Go(func() error {
		var err error
		resp, err = c.Solve(ectx, nil, opt, ch) // closes ch when done
		return err
	})
	eg.Go(func() error {
		for st := range ch {
			tr.status(st)
		}
		return nil
	})
	if err := eg.Wait(); err != nil {
		if ctx.Err() != nil {
			return "", ctx.Err()
		}
		be := tr.failure(err)
		onLog(Log{Time: time.Now(), Level: "error", Message: be.Error(), Step: be.Step})
		return "", be
	}
	dgst := resp.ExporterResponse["containerimage.digest"]
	if dgst == "" {
		return "", &BuildError{Step: -1, Err: errors.New("no image digest in exporter response")}
	}
	return dgst, nil
}

type instruction struct {
	text       string // original text, first word upper-cased
	start, end int    // 1-based lines
}

func parseInstructions(df []byte) ([]instruction, error) {
	res, err := parser.Parse(bytes.NewReader(df))
	if err != nil {
		return nil, err
	}
	var out []instruction
	for _, n := range res.AST.Children {
		out = append(out, instruction{text: upperFirst(strings.TrimSpace(n.Original)), start: n.StartLine, end: n.EndLine})
	}
	return out, nil
}

func upperFirst(s string) string {
	i := strings.IndexAny(s, " \t")
	if i < 0 {
		return strings.ToUpper(s)
	}
	return strings.ToUpper(s[:i]) + s[i:]
}

// vertexPrefix matches BuildKit's "[2/3] " or "[stage-0 2/3] " name prefix.
var vertexPrefix = regexp.MustCompile(`^\[[^\]]*\d+/\d+\]\s+`)

// tracker turns the status stream into Log lines and remembers which step
// each vertex is.
type tracker struct {
	insts []instruction
	onLog func(Log)
	mu    sync.Mutex
	steps map[string]int // vertex digest -> step
	names map[string]string
	state map[string]string // vertex digest -> last reported state
	errV  string            // first vertex that reported an error
}

func newTracker(insts []instruction, onLog func(Log)) *tracker {
	return &tracker{insts: insts, onLog: onLog, steps: map[string]int{}, names: map[string]string{}, state: map[string]string{}}
}

// stepOf maps a vertex name ("[2/3] RUN echo hi") to an instruction index by
// its text. Names whose text BuildKit rewrote (ARG/ENV expansion) and
// internal vertices ("load build context") map to -1.
func (t *tracker) stepOf(name string) int {
	loc := vertexPrefix.FindStringIndex(name)
	if loc == nil {
		return -1
	}
	text := strings.TrimSpace(name[loc[1]:])
	for i, in := range t.insts {
		if in.text == text || strings.Join(strings.Fields(in.text), " ") == strings.Join(strings.Fields(text), " ") {
			return i
		}
	}
	// FROM is rendered "FROM <resolved name>"; match on the keyword if only
	// one FROM exists.
	if strings.HasPrefix(text, "FROM ") {
		idx := -1
		for i, in := range t.insts {
			if strings.HasPrefix(in.text, "FROM ") {
				if idx >= 0 {
					return -1
				}
				idx = i
			}
		}
		return idx
	}
	return -1
}

func (t *tracker) status(st *bkclient.SolveStatus) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, v := range st.Vertexes {
		k := v.Digest.String()
		if _, ok := t.steps[k]; !ok {
			t.steps[k] = t.stepOf(v.Name)
			t.names[k] = v.Name
		}
		step := t.steps[k]
		var state, level = "", "info"
		switch {
		case v.Error != "":
			state, level = "error", "error"
			if t.errV == "" {
				t.errV = k
			}
		case v.Cached:
			state = "cached"
		case v.Completed != nil:
			state = "done"
		case v.Started != nil:
			state = "started"
		}
		if state == "" || t.state[k] == state {
			continue
		}
		t.state[k] = state
		ts := time.Now()
		msg := v.Name
		switch state {
		case "cached":
			msg = "CACHED " + v.Name
		case "done":
			if v.Started != nil {
				msg = fmt.Sprintf("DONE %s (%.1fs)", v.Name, v.Completed.Sub(*v.Started).Seconds())
			} else {
				msg = "DONE " + v.Name
			}
			ts = *v.Completed
		case "error":
			msg = "ERROR " + v.Name + ": " + v.Error
		case "started":
			ts = *v.Started
		}
		t.onLog(Log{Time: ts, Level: level, Message: msg, Step: step})
	}
	for _, l := range st.Logs {
		step, ok := t.steps[l.Vertex.String()]
		if !ok {
			step = -1
		}
		for _, line := range strings.Split(strings.TrimRight(string(l.Data), "\n"), "\n") {
			if line == "" {
				continue
			}
			t.onLog(Log{Time: l.Timestamp, Level: "info", Message: line, Step: step})
		}
	}
	for _, w := range st.Warnings {
		step, ok := t.steps[w.Vertex.String()]
		if !ok {
			step = -1
		}
		t.onLog(Log{Time: time.Now(), Level: "warn", Message: string(w.Short), Step: step})
	}
}

// failure builds the BuildError for err: the step comes from the error's
// Dockerfile source range if BuildKit attached one, else from the vertex
// that reported the error.
func (t *tracker) failure(err error) *BuildError {
	t.mu.Lock()
	defer t.mu.Unlock()
	be := &BuildError{Step: -1, Err: classify(err)}
	for _, src := range errdefs.Sources(err) {
		for _, r := range src.Ranges {
			if r.Start == nil {
				continue
			}
			line := int(r.Start.Line)
			for i, in := range t.insts {
				if line >= in.start && line <= in.end {
					be.Step, be.Instruction = i, in.text
					return be
				}
			}
		}
	}
	if t.errV != "" {
		if s := t.steps[t.errV]; s >= 0 {
			be.Step, be.Instruction = s, t.insts[s].text
		}
	}
	return be
}
