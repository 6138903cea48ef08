// Package recipe validates an E2B template build request (TemplateBuildStartV2)
// and renders it into the Dockerfile the image builder runs.
//
// Step semantics follow CEP-0019 "BuildKit translation". The renderer never
// emits an image ENV and never lets a step argument start a new Dockerfile
// instruction: every value that reaches the file is either checked against a
// narrow character set or escaped for the Dockerfile word lexer.
package recipe

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"path"
	"regexp"
	"strconv"
	"strings"
)

// Step is one TemplateStep. Unknown JSON keys (forceUpload, resolveSymlinks,
// gzip from the JS SDK) are ignored by encoding/json.
type Step struct {
	Type      string   `json:"type"`
	Args      []string `json:"args"`
	FilesHash string   `json:"filesHash,omitempty"`
	Force     bool     `json:"force"`
}

// Registry is the FromImageRegistry oneOf, flattened; Type is "registry",
// "aws" or "gcp".
type Registry struct {
	Type               string `json:"type"`
	Username           string `json:"username,omitempty"`
	Password           string `json:"password,omitempty"`
	AWSAccessKeyID     string `json:"awsAccessKeyId,omitempty"`
	AWSSecretAccessKey string `json:"awsSecretAccessKey,omitempty"`
	AWSRegion          string `json:"awsRegion,omitempty"`
	ServiceAccountJSON string `json:"serviceAccountJson,omitempty"`
}

// BuildStart is TemplateBuildStartV2.
type BuildStart struct {
	FromImage         string    `json:"fromImage,omitempty"`
	FromTemplate      string    `json:"fromTemplate,omitempty"`
	FromImageRegistry *Registry `json:"fromImageRegistry,omitempty"`
	Force             bool      `json:"force"`
	Steps             []Step    `json:"steps"`
	StartCmd          string    `json:"startCmd,omitempty"`
	ReadyCmd          string    `json:"readyCmd,omitempty"`
}

// Result is a rendered build.
type Result struct {
	Dockerfile []byte
	// Hashes are the distinct filesHash values COPY steps use, in first-use
	// order; the caller unpacks each under <context>/<hash>/.
	Hashes []string
	// RunAsUser, RunAsGroup and RunAsUsername come from the last USER step
	// (see ParseUser); all unset when there is none.
	RunAsUser     *int64
	RunAsGroup    *int64
	RunAsUsername string
	// User is the last USER step's argument, verbatim ("" when none).
	User string
	// Workdir is the last WORKDIR, made absolute against the previous ones
	// ("" when none).
	Workdir string
	// NoCache is the request-level force: build with --no-cache.
	NoCache bool
	// StepOfLine maps a 1-based Dockerfile line to the 0-based index in
	// BuildStart.Steps that produced it. Lines absent from the map (FROM)
	// belong to the base image, E2B's "base" step.
	StepOfLine map[int]int
}

// CacheBustArg is the only ARG the rendered Dockerfile declares.
const CacheBustArg = "CUBICLE_CACHEBUST"

// ErrInvalid is wrapped by every validation error (HTTP 400).
var ErrInvalid = errors.New("invalid template build")

// Error is a validation error; errors.Is(err, ErrInvalid) holds.
type Error struct {
	// Step is the 0-based index into BuildStart.Steps, or -1 when the
	// request as a whole (fromImage/fromTemplate) is at fault.
	Step   int
	Reason string
}

func (e *Error) Error() string {
	if e.Step < 0 {
		return "invalid template build: " + e.Reason
	}
	return fmt.Sprintf("invalid template build: step %d: %s", e.Step, e.Reason)
}

func (e *Error) Unwrap() error { return ErrInvalid }

func invalid(step int, format string, a ...any) error {
	return &Error{Step: step, Reason: fmt.Sprintf(format, a...)}
}

var (
	hashRe = regexp.MustCompile(`^[0-9a-f]{64}$`)
	modeRe = regexp.MustCompile(`^[0-7]{3,4}$`)
	// envKeyRe keeps keys valid for `export`; anything else would be a
	// shell syntax error or an injection into the RUN line.
	envKeyRe = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
	// userRe covers names, uids and user:group. USER/--chown values are
	// copied unchanged, so they must not need escaping: no whitespace,
	// quotes, '$' or '\'.
	userRe = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.@-]*(:[A-Za-z0-9_][A-Za-z0-9_.@-]*)?$`)
	// buildIDRe keeps the cache-bust ARG a single token.
	buildIDRe = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]*$`)
)

// workspace is the sandbox's own volume; a template must not put files there.
const workspace = "/workspace"

// Render validates req and renders its Dockerfile. base is the resolved FROM
// image reference (fromImage, or the fromTemplate's ready image). buildID
// seeds the per-step cache bust. haveTar reports whether the context tar for
// a filesHash is stored; nil skips that check.
//
// Force handling: request-level force sets NoCache. A step with force emits
// `ARG CUBICLE_CACHEBUST=<buildID>` right before its first line. BuildKit
// adds an in-scope ARG to the environment of every later RUN, so that RUN and
// all RUNs after it miss the cache (buildID is new on every build), and any
// instruction after a re-run RUN misses too because its parent layer changed.
// Instructions between the ARG and the next RUN (COPY, WORKDIR, USER) may
// still hit the cache, but their output is a pure function of the parent
// layer and the content-addressed context, so a hit yields the same bytes a
// rebuild would. E2B's skipCache exists for non-deterministic RUNs, which are
// always re-run. A force on an ENV step (no Dockerfile line) moves to the
// next emitted instruction.
func Render(req BuildStart, base, buildID string, haveTar func(hash string) bool) (*Result, error) {
	return RenderWith(req, base, buildID, haveTar, Options{})
}

// Options are the server's additions to every RUN step.
type Options struct {
	// RunMount is a --mount flag value every RUN gets (the extra CA bundle:
	// `type=bind,source=...,target=...`); "" for none.
	RunMount string
	// RunEnv is exported before every RUN's command, before the template's
	// own ENV steps (which may override it).
	RunEnv [][2]string
}

// RenderWith is Render with server options.
func RenderWith(req BuildStart, base, buildID string, haveTar func(hash string) bool, opts Options) (*Result, error) {
	if strings.ContainsFunc(opts.RunMount, isSpaceOrControl) {
		return nil, invalid(-1, "RUN mount %q is not a single token", opts.RunMount)
	}
	for _, kv := range opts.RunEnv {
		if !envKeyRe.MatchString(kv[0]) {
			return nil, invalid(-1, "RUN env key %q is not a shell variable name", kv[0])
		}
	}
	if (req.FromImage == "") == (req.FromTemplate == "") {
		return nil, invalid(-1, "exactly one of fromImage and fromTemplate must be set")
	}
	if base == "" || strings.ContainsFunc(base, isSpaceOrControl) {
		return nil, invalid(-1, "base image reference %q is not a single token", base)
	}

	if strings.ContainsRune(req.StartCmd, 0) || strings.ContainsRune(req.ReadyCmd, 0) {
		return nil, invalid(-1, "startCmd and readyCmd must not contain a NUL byte")
	}
	secrets := registrySecrets(req.FromImageRegistry)

	r := &renderer{
		res:     &Result{NoCache: req.Force, StepOfLine: map[int]int{}},
		buildID: buildID,
		haveTar: haveTar,
		seen:    map[string]bool{},
		workdir: "/",
		opts:    opts,
	}
	r.line(-1, "FROM "+base)
	for i, st := range req.Steps {
		for _, a := range st.Args {
			for _, sec := range secrets {
				if strings.Contains(a, sec) {
					// The Dockerfile lands in build logs and image history.
					return nil, invalid(i, "%s argument contains the fromImageRegistry credential", st.Type)
				}
			}
		}
		if err := r.step(i, st); err != nil {
			return nil, err
		}
	}
	r.res.Dockerfile = r.buf.Bytes()
	return r.res, nil
}

type renderer struct {
	res     *Result
	buf     bytes.Buffer
	lines   int
	buildID string
	haveTar func(string) bool
	seen    map[string]bool

	envKeys []string
	envVals map[string]string

	// user is the last USER step's argument; userSet says one was seen.
	user    string
	userSet bool
	// workdir is the absolute working directory relative WORKDIR and COPY
	// destinations resolve against. The base image's WORKDIR is unknown,
	// so "/" (the Docker default) is assumed until a WORKDIR step.
	workdir string

	pendingBust bool
	opts        Options
}

// minSecretLen keeps a trivially short credential from matching ordinary
// step text.
const minSecretLen = 4

// registrySecrets are the pull-credential values that must never appear in
// a step (CEP: "rejects a step whose args contain a registry password").
func registrySecrets(reg *Registry) []string {
	if reg == nil {
		return nil
	}
	var out []string
	for _, v := range []string{reg.Password, reg.AWSSecretAccessKey, reg.ServiceAccountJSON} {
		if len(v) >= minSecretLen {
			out = append(out, v)
		}
	}
	return out
}

func (r *renderer) line(step int, s string) {
	r.lines++
	r.buf.WriteString(s)
	r.buf.WriteByte('\n')
	if step >= 0 {
		r.res.StepOfLine[r.lines] = step
	}
}

// begin starts the lines of step i, placing a pending cache bust first.
func (r *renderer) begin(i int, force bool) error {
	if force || r.pendingBust {
		if !buildIDRe.MatchString(r.buildID) {
			return fmt.Errorf("recipe: build id %q cannot be used as a cache-bust value", r.buildID)
		}
		r.line(i, "ARG "+CacheBustArg+"="+r.buildID)
		r.pendingBust = false
	}
	return nil
}

func (r *renderer) step(i int, st Step) error {
	for _, a := range st.Args {
		if strings.ContainsRune(a, 0) {
			return invalid(i, "%s argument contains a NUL byte", st.Type)
		}
	}
	switch strings.ToUpper(st.Type) {
	case "ENV":
		return r.env(i, st)
	case "WORKDIR":
		return r.workdirStep(i, st)
	case "USER":
		return r.userStep(i, st)
	case "COPY", "ADD":
		// ADD is accepted as COPY: no URL fetch, no archive auto-extract.
		return r.copyStep(i, st)
	case "RUN":
		return r.run(i, st)
	case "ARG":
		return invalid(i, "ARG steps are not supported")
	case "":
		return invalid(i, "step type is empty")
	default:
		return invalid(i, "unknown step type %q", st.Type)
	}
}

func (r *renderer) env(i int, st Step) error {
	if len(st.Args)%2 != 0 {
		return invalid(i, "ENV needs key/value pairs, got %d arguments", len(st.Args))
	}
	if r.envVals == nil {
		r.envVals = map[string]string{}
	}
	for j := 0; j < len(st.Args); j += 2 {
		k, v := st.Args[j], st.Args[j+1]
		if !envKeyRe.MatchString(k) {
			return invalid(i, "ENV key %q is not a valid variable name", k)
		}
		if _, ok := r.envVals[k]; !ok {
			r.envKeys = append(r.envKeys, k)
		}
		r.envVals[k] = v
	}
	// ENV has no Dockerfile line; carry its force to the next instruction.
	if st.Force {
		r.pendingBust = true
	}
	return nil
}

func (r *renderer) workdirStep(i int, st Step) error {
	if len(st.Args) != 1 || st.Args[0] == "" {
		return invalid(i, "WORKDIR needs exactly one non-empty path")
	}
	p := st.Args[0]
	if strings.ContainsFunc(p, isControlNotTab) {
		return invalid(i, "WORKDIR path contains a control character")
	}
	if strings.TrimSpace(p) != p {
		// The parser trims the line, so the path would silently change.
		return invalid(i, "WORKDIR path has leading or trailing whitespace")
	}
	abs := r.resolve(p)
	if underWorkspace(abs) {
		return invalid(i, "WORKDIR %q is on /workspace, which is the sandbox's own volume", p)
	}
	if err := r.begin(i, st.Force); err != nil {
		return err
	}
	// WORKDIR takes the rest of the line as one word, so spaces are fine;
	// escaping makes '$', quotes and '\' literal, as E2B treats the path.
	r.line(i, "WORKDIR "+escapeWord(p))
	r.workdir = abs
	r.res.Workdir = abs
	return nil
}

func (r *renderer) userStep(i int, st Step) error {
	if len(st.Args) != 1 {
		return invalid(i, "USER needs exactly one argument")
	}
	u := st.Args[0]
	if !userRe.MatchString(u) {
		return invalid(i, "USER %q is not a user, uid or user:group", u)
	}
	if err := r.begin(i, st.Force); err != nil {
		return err
	}
	r.line(i, "USER "+u)
	r.user, r.userSet = u, true
	r.res.User = u
	r.res.RunAsUser, r.res.RunAsGroup, r.res.RunAsUsername = ParseUser(u)
	return nil
}

func (r *renderer) copyStep(i int, st Step) error {
	if len(st.Args) != 2 && len(st.Args) != 4 {
		return invalid(i, "%s needs [src, dest] or [src, dest, user, mode], got %d arguments", st.Type, len(st.Args))
	}
	src, dest := st.Args[0], st.Args[1]
	var owner, mode string
	if len(st.Args) == 4 {
		owner, mode = st.Args[2], st.Args[3]
	}
	if src == "" || dest == "" {
		return invalid(i, "%s source and destination must be non-empty", st.Type)
	}
	if strings.ContainsFunc(src, isControlNotTab) || strings.ContainsFunc(dest, isControlNotTab) {
		return invalid(i, "%s path contains a control character", st.Type)
	}
	if path.IsAbs(src) {
		return invalid(i, "%s source %q must be relative to the build context", st.Type, src)
	}
	if hasDotDot(src) {
		return invalid(i, "%s source %q must not contain '..'", st.Type, src)
	}
	if underWorkspace(r.resolve(dest)) {
		return invalid(i, "%s destination %q is on /workspace, which is the sandbox's own volume", st.Type, dest)
	}
	if owner != "" && !userRe.MatchString(owner) {
		return invalid(i, "%s user %q is not a user, uid or user:group", st.Type, owner)
	}
	if mode != "" && !modeRe.MatchString(mode) {
		return invalid(i, "%s mode %q must be 3 or 4 octal digits", st.Type, mode)
	}
	if st.FilesHash == "" {
		return invalid(i, "missing context for COPY step %d", i)
	}
	if !hashRe.MatchString(st.FilesHash) {
		return invalid(i, "filesHash %q must be 64 lowercase hex characters", st.FilesHash)
	}
	if r.haveTar != nil && !r.haveTar(st.FilesHash) {
		return invalid(i, "missing context for COPY step %d", i)
	}
	if !r.seen[st.FilesHash] {
		r.seen[st.FilesHash] = true
		r.res.Hashes = append(r.res.Hashes, st.FilesHash)
	}

	if err := r.begin(i, st.Force); err != nil {
		return err
	}
	var b strings.Builder
	b.WriteString("COPY ")
	if owner != "" {
		b.WriteString("--chown=" + owner + " ")
	}
	if mode != "" {
		b.WriteString("--chmod=" + mode + " ")
	}
	// Glob characters stay live on purpose: the SDK globs src too, and the
	// tar holds exactly what matched.
	s, d := escapeWord(st.FilesHash+"/"+src), escapeWord(dest)
	if strings.ContainsFunc(s+d, isSpace) {
		// The plain form splits on whitespace; the JSON form does not.
		b.WriteString(jsonArray(s, d))
	} else {
		b.WriteString(s + " " + d)
	}
	r.line(i, b.String())
	return nil
}

func (r *renderer) run(i int, st Step) error {
	if len(st.Args) != 1 && len(st.Args) != 2 {
		return invalid(i, "RUN needs [command] or [command, user], got %d arguments", len(st.Args))
	}
	cmd := st.Args[0]
	if strings.TrimSpace(cmd) == "" {
		return invalid(i, "RUN command is empty")
	}
	var u string
	if len(st.Args) == 2 {
		u = st.Args[1]
		if u != "" && !userRe.MatchString(u) {
			return invalid(i, "RUN user %q is not a user, uid or user:group", u)
		}
	}

	var b strings.Builder
	for _, kv := range r.opts.RunEnv {
		b.WriteString("export " + kv[0] + "=" + shellQuote(kv[1]) + "; ")
	}
	for _, k := range r.envKeys {
		b.WriteString("export " + k + "=" + shellQuote(r.envVals[k]) + "; ")
	}
	b.WriteString(cmd)
	full := b.String()

	if err := r.begin(i, st.Force); err != nil {
		return err
	}
	if u != "" {
		r.line(i, "USER "+u)
	}
	mount := ""
	if r.opts.RunMount != "" {
		mount = "--mount=" + r.opts.RunMount + " "
	}
	r.line(i, "RUN "+mount+runForm(full))
	if u != "" {
		// The CEP omits the restore when no USER step was seen, which would
		// leave every later instruction running as u. Base images default
		// to root, so restoring to root keeps Docker semantics. Caveat: a
		// base whose image config sets a non-root USER is restored to root.
		prev := "root"
		if r.userSet {
			prev = r.user
		}
		r.line(i, "USER "+prev)
	}
	return nil
}

// runForm renders a shell command as the RUN argument. Shell form is used
// when the Dockerfile parser would hand the text to /bin/sh -c unchanged;
// otherwise the exec form ["/bin/sh","-c",cmd], which is what shell form
// means with the default SHELL, so the semantics are identical. Exec form is
// needed for newlines (a new instruction), a trailing '\' (line
// continuation), "<<" (a heredoc in dockerfile >= 1.4) and a leading '['
// (parsed as JSON).
func runForm(cmd string) string {
	trimmed := strings.TrimSpace(cmd)
	safe := trimmed == cmd &&
		!strings.ContainsFunc(cmd, isControlNotTab) &&
		!strings.Contains(cmd, "<<") &&
		!strings.HasPrefix(cmd, "[") &&
		!strings.HasSuffix(cmd, `\`)
	if safe {
		return cmd
	}
	return jsonArray("/bin/sh", "-c", cmd)
}

func jsonArray(elems ...string) string {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false) // readability only; both forms decode the same
	_ = enc.Encode(elems)    // []string cannot fail
	return strings.TrimSuffix(b.String(), "\n")
}

// escapeWord makes s literal for the Dockerfile word lexer, which expands
// $VAR and strips quotes and '\' in COPY and WORKDIR arguments.
func escapeWord(s string) string {
	if !strings.ContainsAny(s, "\\$'\"") {
		return s
	}
	var b strings.Builder
	for _, c := range s {
		if c == '\\' || c == '$' || c == '\'' || c == '"' {
			b.WriteByte('\\')
		}
		b.WriteRune(c)
	}
	return b.String()
}

// shellQuote is POSIX single quoting: nothing inside '...' is special except
// the closing quote, which is closed, backslash-escaped and reopened.
func shellQuote(v string) string {
	return "'" + strings.ReplaceAll(v, "'", `'\''`) + "'"
}

func (r *renderer) resolve(p string) string {
	if path.IsAbs(p) {
		return path.Clean(p)
	}
	return path.Join(r.workdir, p)
}

func underWorkspace(abs string) bool {
	return abs == workspace || strings.HasPrefix(abs, workspace+"/")
}

func hasDotDot(p string) bool {
	for _, part := range strings.Split(p, "/") {
		if part == ".." {
			return true
		}
	}
	return false
}

func isControl(c rune) bool        { return c < 0x20 || c == 0x7f }
func isControlNotTab(c rune) bool  { return c != '\t' && isControl(c) }
func isSpace(c rune) bool          { return c == ' ' || c == '\t' }
func isSpaceOrControl(c rune) bool { return isSpace(c) || isControl(c) }

// ParseUser reads a USER argument the way the template record stores it:
// "1000" sets uid, "0" sets uid 0 (root, distinct from unset), "1000:1000"
// sets uid and gid, and any other value is a name left for podd to resolve
// inside the image, with both pointers nil. "name:1000" and "1000:group" are
// names too: a half-numeric pair cannot be applied without the image's
// passwd/group files.
func ParseUser(arg string) (uid, gid *int64, name string) {
	if arg == "" {
		return nil, nil, ""
	}
	u, g, hasGroup := strings.Cut(arg, ":")
	uv, uerr := parseID(u)
	if !hasGroup {
		if uerr != nil {
			return nil, nil, arg
		}
		return &uv, nil, ""
	}
	gv, gerr := parseID(g)
	if uerr != nil || gerr != nil {
		return nil, nil, arg
	}
	return &uv, &gv, ""
}

// parseID accepts plain decimal ids that fit in 32 bits, as Linux does.
func parseID(s string) (int64, error) {
	if s == "" || strings.IndexFunc(s, func(c rune) bool { return c < '0' || c > '9' }) >= 0 {
		return 0, strconv.ErrSyntax
	}
	v, err := strconv.ParseUint(s, 10, 32)
	return int64(v), err
}
