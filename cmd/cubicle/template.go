package main

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"path"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
)

// ---- errors -------------------------------------------------------------------------

// tplRecipeError is a recipe the CLI cannot translate; Line is 1-based.
type tplRecipeError struct {
	File string
	Line int
	Msg  string
}

func (e *tplRecipeError) Error() string {
	if e.Line > 0 {
		return fmt.Sprintf("%s:%d: %s", e.File, e.Line, e.Msg)
	}
	return fmt.Sprintf("%s: %s", e.File, e.Msg)
}

// tplAPIError is a non-2xx answer from the API.
type tplAPIError struct {
	Status  int
	Message string
}

func (e *tplAPIError) Error() string { return fmt.Sprintf("%d: %s", e.Status, e.Message) }

// tplNoFilesError is a COPY source that matched nothing (the SDK's
// "No files found in ...").
type tplNoFilesError struct{ Src, Context string }

func (e *tplNoFilesError) Error() string {
	return fmt.Sprintf("no files found for COPY source %q in %s", e.Src, e.Context)
}

// tplFileTypeError is a context entry a build context cannot carry.
type tplFileTypeError struct{ Path, Kind string }

func (e *tplFileTypeError) Error() string {
	return fmt.Sprintf("%s is a %s; a build context holds only files, directories and symlinks", e.Path, e.Kind)
}

// tplUploadError is a failed PUT of a context archive.
type tplUploadError struct {
	Src    string
	Status string
	Body   string
}

func (e *tplUploadError) Error() string {
	return fmt.Sprintf("upload of %q failed: %s %s", e.Src, e.Status, strings.TrimSpace(e.Body))
}

// tplBuildFailedError is a build that ended in status error.
type tplBuildFailedError struct {
	TemplateID, BuildID string
	Step, StepDesc      string
	Message             string
}

func (e *tplBuildFailedError) Error() string {
	where := ""
	if e.Step != "" {
		where = " at step " + e.Step
		if e.StepDesc != "" {
			where += " (" + e.StepDesc + ")"
		}
	}
	return fmt.Sprintf("build %s of template %s failed%s: %s", e.BuildID, e.TemplateID, where, e.Message)
}

// tplInterruptedError is Ctrl-C while following a build; the server keeps
// building.
type tplInterruptedError struct {
	TemplateID, BuildID string
	Started             bool
}

func (e *tplInterruptedError) Error() string {
	if !e.Started {
		return fmt.Sprintf("interrupted before build %s of template %s was started; it stays waiting on the server", e.BuildID, e.TemplateID)
	}
	return fmt.Sprintf("interrupted: stopped following build %s of template %s; the build continues on the server (follow it with `cubicle template logs %s %s --follow`)",
		e.BuildID, e.TemplateID, e.TemplateID, e.BuildID)
}

// ---- recipe -------------------------------------------------------------------------

// tplStep is a TemplateStep on the wire; line is where the recipe wrote it.
type tplStep struct {
	Type      string   `json:"type"`
	Args      []string `json:"args"`
	FilesHash string   `json:"filesHash,omitempty"`
	Force     bool     `json:"force"`
	line      int
}

// tplRecipe is a parsed recipe: TemplateBuildStartV2 minus force.
type tplRecipe struct {
	FromImage    string
	FromTemplate string
	Steps        []tplStep
	StartCmd     string
	ReadyCmd     string
	Warnings     []string
}

// tplStartBody is TemplateBuildStartV2.
type tplStartBody struct {
	FromImage    string    `json:"fromImage,omitempty"`
	FromTemplate string    `json:"fromTemplate,omitempty"`
	Force        bool      `json:"force"`
	Steps        []tplStep `json:"steps"`
	StartCmd     string    `json:"startCmd,omitempty"`
	ReadyCmd     string    `json:"readyCmd,omitempty"`
}

// tplLine is one logical instruction after continuations are joined.
type tplLine struct {
	n       int    // first physical line
	keyword string // upper case; "#READY" for a cubicle:ready comment
	rest    string
}

// tplReadyDirective is the comment that sets readyCmd.
const tplReadyDirective = "cubicle:ready"

// tplLines joins `\` continuations and drops comments and blank lines, as
// the Dockerfile parser does (comment lines inside a continuation are
// skipped too).
func tplLines(src string) []tplLine {
	var out []tplLine
	var cur strings.Builder
	start, inCont := 0, false
	phys := strings.Split(strings.ReplaceAll(src, "\r\n", "\n"), "\n")
	flush := func() {
		text := strings.TrimSpace(cur.String())
		cur.Reset()
		inCont = false
		if text == "" {
			return
		}
		kw, rest := text, ""
		if i := strings.IndexAny(text, " \t"); i >= 0 {
			kw, rest = text[:i], text[i+1:]
		}
		out = append(out, tplLine{n: start, keyword: strings.ToUpper(kw), rest: strings.TrimSpace(rest)})
	}
	for i, raw := range phys {
		n := i + 1
		trimmed := strings.TrimSpace(raw)
		if trimmed == "" || strings.HasPrefix(trimmed, "#") {
			if !inCont && strings.HasPrefix(trimmed, "#") {
				c := strings.TrimSpace(strings.TrimPrefix(trimmed, "#"))
				if r, ok := strings.CutPrefix(c, tplReadyDirective); ok && (r == "" || r[0] == ' ' || r[0] == '\t') {
					out = append(out, tplLine{n: n, keyword: "#READY", rest: strings.TrimSpace(r)})
				}
			}
			continue
		}
		if !inCont {
			start = n
		}
		line := strings.TrimRight(raw, " \t")
		if strings.HasSuffix(line, `\`) {
			cur.WriteString(strings.TrimSuffix(line, `\`))
			inCont = true
			continue
		}
		cur.WriteString(line)
		flush()
	}
	if inCont {
		flush() // a trailing `\` at EOF ends the instruction, as in Docker
	}
	return out
}

// tplHeredocRe is BuildKit's heredoc word test (after word splitting).
var tplHeredocRe = regexp.MustCompile(`^(\d*)<<(-?)([^<].*)$`)

// tplWords splits s on blanks, honouring quotes and backslashes, and
// removes the quotes (the Dockerfile word rules, without $ expansion).
func tplWords(s string) ([]string, error) { return tplLex(s, true) }

// tplUnquote removes quotes and escapes but keeps blanks (one word).
func tplUnquote(s string) (string, error) {
	w, err := tplLex(s, false)
	if err != nil || len(w) == 0 {
		return "", err
	}
	return w[0], nil
}

func tplLex(s string, split bool) ([]string, error) {
	var out []string
	var cur strings.Builder
	inWord := false
	var quote rune
	rs := []rune(s)
	for i := 0; i < len(rs); i++ {
		c := rs[i]
		switch {
		case quote == '\'':
			if c == '\'' {
				quote = 0
			} else {
				cur.WriteRune(c)
			}
		case quote == '"':
			if c == '"' {
				quote = 0
			} else if c == '\\' && i+1 < len(rs) && strings.ContainsRune(`"\$`+"`", rs[i+1]) {
				i++
				cur.WriteRune(rs[i])
			} else {
				cur.WriteRune(c)
			}
		case c == '\'' || c == '"':
			quote, inWord = c, true
		case c == '\\' && i+1 < len(rs):
			i++
			cur.WriteRune(rs[i])
			inWord = true
		case split && (c == ' ' || c == '\t' || c == '\n'):
			if inWord {
				out = append(out, cur.String())
				cur.Reset()
				inWord = false
			}
		default:
			cur.WriteRune(c)
			inWord = true
		}
	}
	if quote != 0 {
		return nil, fmt.Errorf("unterminated %c quote", quote)
	}
	if inWord {
		out = append(out, cur.String())
	}
	return out, nil
}

// tplRawWords splits on blanks only, keeping quotes (for heredoc detection
// and flag scanning).
func tplRawWords(s string) []string { return strings.Fields(s) }

// tplJSONArray parses the exec form; ok is false for the shell form.
func tplJSONArray(s string) ([]string, bool) {
	if !strings.HasPrefix(strings.TrimSpace(s), "[") {
		return nil, false
	}
	var a []string
	if json.Unmarshal([]byte(s), &a) != nil {
		return nil, false
	}
	return a, true
}

var tplSafeWordRe = regexp.MustCompile(`^[A-Za-z0-9_@%+=:,./-]+$`)

// tplShellJoin turns an exec-form array into one shell command line,
// quoting what the shell would otherwise split or expand.
func tplShellJoin(a []string) string {
	q := make([]string, len(a))
	for i, w := range a {
		if tplSafeWordRe.MatchString(w) {
			q[i] = w
		} else {
			q[i] = "'" + strings.ReplaceAll(w, "'", `'\''`) + "'"
		}
	}
	return strings.Join(q, " ")
}

// tplFlags strips leading --name[=value] words from rest.
func tplFlags(rest string) (flags [][2]string, remaining string) {
	remaining = strings.TrimSpace(rest)
	for strings.HasPrefix(remaining, "--") {
		word, tail := remaining, ""
		if i := strings.IndexAny(remaining, " \t"); i >= 0 {
			word, tail = remaining[:i], remaining[i+1:]
		}
		name, val, _ := strings.Cut(strings.TrimPrefix(word, "--"), "=")
		flags = append(flags, [2]string{strings.ToLower(name), val})
		remaining = strings.TrimSpace(tail)
	}
	return flags, remaining
}

// tplIgnored are instructions that have no meaning for a sandbox template.
var tplIgnored = map[string]bool{"EXPOSE": true, "VOLUME": true, "LABEL": true, "SHELL": true, "STOPSIGNAL": true, "MAINTAINER": true, "ONBUILD": true}

// parseTplRecipe translates a Dockerfile subset into a build request.
func parseTplRecipe(file, src string) (*tplRecipe, error) {
	r := &tplRecipe{}
	fail := func(n int, format string, a ...any) error {
		return &tplRecipeError{File: file, Line: n, Msg: fmt.Sprintf(format, a...)}
	}
	warn := func(n int, format string, a ...any) {
		r.Warnings = append(r.Warnings, fmt.Sprintf("%s:%d: %s", file, n, fmt.Sprintf(format, a...)))
	}
	var entrypoint, cmd string
	var entryExec, haveFrom, warnedAdd bool
	for _, l := range tplLines(src) {
		if l.keyword != "#READY" && !haveFrom && l.keyword != "FROM" {
			return nil, fail(l.n, "%s before FROM; the recipe must start with FROM", l.keyword)
		}
		switch l.keyword {
		case "RUN", "COPY", "ADD":
			for _, w := range tplRawWords(l.rest) {
				if m := tplHeredocRe.FindStringSubmatch(w); m != nil {
					return nil, fail(l.n, "heredocs (%s) are not supported; put the script in a file and COPY it, or join commands with &&", w)
				}
			}
		}
		switch l.keyword {
		case "#READY":
			if l.rest == "" {
				return nil, fail(l.n, "# %s needs a command", tplReadyDirective)
			}
			r.ReadyCmd = l.rest
		case "FROM":
			if haveFrom {
				return nil, fail(l.n, "a second FROM: multi-stage recipes are not supported")
			}
			haveFrom = true
			flags, rest := tplFlags(l.rest)
			for _, f := range flags {
				warn(l.n, "FROM --%s is ignored", f[0])
			}
			w, err := tplWords(rest)
			if err != nil {
				return nil, fail(l.n, "FROM: %v", err)
			}
			if len(w) != 1 && !(len(w) == 3 && strings.EqualFold(w[1], "AS")) {
				return nil, fail(l.n, "FROM needs one image (optionally `AS name`), got %q", rest)
			}
			if name, ok := strings.CutPrefix(w[0], "template:"); ok {
				if name == "" {
					return nil, fail(l.n, "FROM template: needs a template name")
				}
				r.FromTemplate = name
			} else {
				r.FromImage = w[0]
			}
		case "RUN":
			flags, rest := tplFlags(l.rest)
			if len(flags) > 0 {
				return nil, fail(l.n, "RUN --%s is not supported", flags[0][0])
			}
			cmdline := rest
			if a, ok := tplJSONArray(rest); ok {
				cmdline = tplShellJoin(a)
			}
			if strings.TrimSpace(cmdline) == "" {
				return nil, fail(l.n, "RUN needs a command")
			}
			r.Steps = append(r.Steps, tplStep{Type: "RUN", Args: []string{cmdline}, line: l.n})
		case "COPY", "ADD":
			steps, err := tplCopy(l, fail, warn)
			if err != nil {
				return nil, err
			}
			if l.keyword == "ADD" && !warnedAdd {
				warnedAdd = true
				warn(l.n, "ADD is treated as COPY: no URL download, no archive extraction")
			}
			r.Steps = append(r.Steps, steps...)
		case "ENV":
			args, err := tplEnv(l.rest)
			if err != nil {
				return nil, fail(l.n, "ENV: %v", err)
			}
			r.Steps = append(r.Steps, tplStep{Type: "ENV", Args: args, line: l.n})
		case "WORKDIR":
			w, err := tplWords(l.rest)
			if err != nil {
				return nil, fail(l.n, "WORKDIR: %v", err)
			}
			if len(w) != 1 {
				return nil, fail(l.n, "WORKDIR needs exactly one path")
			}
			r.Steps = append(r.Steps, tplStep{Type: "WORKDIR", Args: w, line: l.n})
		case "USER":
			w, err := tplWords(l.rest)
			if err != nil {
				return nil, fail(l.n, "USER: %v", err)
			}
			if len(w) != 1 {
				return nil, fail(l.n, "USER needs exactly one user[:group]")
			}
			r.Steps = append(r.Steps, tplStep{Type: "USER", Args: w, line: l.n})
		case "CMD", "ENTRYPOINT":
			c, exec := l.rest, false
			if a, ok := tplJSONArray(l.rest); ok {
				c, exec = tplShellJoin(a), true
			}
			if l.keyword == "CMD" {
				cmd = c
			} else {
				entrypoint, entryExec = c, exec
			}
		case "HEALTHCHECK":
			flags, rest := tplFlags(l.rest)
			for _, f := range flags {
				warn(l.n, "HEALTHCHECK --%s is ignored (readyCmd is retried until it succeeds)", f[0])
			}
			kw, body, _ := strings.Cut(rest, " ")
			switch strings.ToUpper(kw) {
			case "NONE":
				r.ReadyCmd = ""
			case "CMD":
				body = strings.TrimSpace(body)
				if a, ok := tplJSONArray(body); ok {
					if len(a) > 0 && a[0] == "CMD-SHELL" {
						body = strings.Join(a[1:], " ")
					} else {
						body = tplShellJoin(a)
					}
				}
				if body == "" {
					return nil, fail(l.n, "HEALTHCHECK CMD needs a command")
				}
				r.ReadyCmd = body
			default:
				return nil, fail(l.n, "HEALTHCHECK must be followed by CMD or NONE")
			}
		case "ARG":
			return nil, fail(l.n, "ARG is not supported (the server rejects ARG steps); write the value in place or use ENV")
		default:
			if tplIgnored[l.keyword] {
				warn(l.n, "%s is ignored", l.keyword)
				continue
			}
			return nil, fail(l.n, "unknown instruction %s", l.keyword)
		}
	}
	if !haveFrom {
		return nil, fail(0, "no FROM instruction")
	}
	// Docker appends CMD to an exec-form ENTRYPOINT; a shell-form one
	// ignores CMD.
	switch {
	case entrypoint != "" && entryExec && cmd != "":
		r.StartCmd = entrypoint + " " + cmd
	case entrypoint != "":
		r.StartCmd = entrypoint
	default:
		r.StartCmd = cmd
	}
	return r, nil
}

// tplCopy turns COPY/ADD into one COPY step per source, as the SDK does.
func tplCopy(l tplLine, fail func(int, string, ...any) error, warn func(int, string, ...any)) ([]tplStep, error) {
	flags, rest := tplFlags(l.rest)
	var user, mode string
	for _, f := range flags {
		switch f[0] {
		case "chown":
			user = f[1]
		case "chmod":
			m, err := strconv.ParseUint(f[1], 8, 32)
			if err != nil || m > 0o7777 {
				return nil, fail(l.n, "%s --chmod=%s: want an octal mode such as 0755", l.keyword, f[1])
			}
			mode = fmt.Sprintf("%04o", m) // the SDK's padOctal
		case "from":
			return nil, fail(l.n, "%s --from is not supported: multi-stage recipes are not supported", l.keyword)
		case "link":
			warn(l.n, "%s --link is ignored", l.keyword)
		default:
			return nil, fail(l.n, "%s --%s is not supported", l.keyword, f[0])
		}
	}
	args, ok := tplJSONArray(rest)
	if !ok {
		var err error
		if args, err = tplWords(rest); err != nil {
			return nil, fail(l.n, "%s: %v", l.keyword, err)
		}
	}
	if len(args) < 2 {
		return nil, fail(l.n, "%s needs at least one source and a destination", l.keyword)
	}
	dest, srcs := args[len(args)-1], args[:len(args)-1]
	if len(srcs) > 1 && !strings.HasSuffix(dest, "/") {
		return nil, fail(l.n, "%s with more than one source needs a destination directory ending in /", l.keyword)
	}
	var out []tplStep
	for _, s := range srcs {
		if strings.Contains(s, "://") || strings.HasPrefix(s, "git@") {
			return nil, fail(l.n, "%s of a URL (%s) is not supported; download it in a RUN step", l.keyword, s)
		}
		if err := tplCheckSrc(s); err != nil {
			return nil, fail(l.n, "%s: %v", l.keyword, err)
		}
		out = append(out, tplStep{Type: "COPY", Args: []string{s, dest, user, mode}, line: l.n})
	}
	return out, nil
}

// tplCheckSrc is the SDK's validateRelativePath.
func tplCheckSrc(s string) error {
	if path.IsAbs(s) {
		return fmt.Errorf("source %q must be relative to the build context", s)
	}
	if c := path.Clean(s); c == ".." || strings.HasPrefix(c, "../") {
		return fmt.Errorf("source %q escapes the build context", s)
	}
	return nil
}

// tplEnv parses `ENV k=v ...` or the legacy `ENV k value with spaces`.
func tplEnv(rest string) ([]string, error) {
	raw := tplRawWords(rest)
	if len(raw) == 0 {
		return nil, errors.New("needs KEY=value")
	}
	if !strings.Contains(raw[0], "=") {
		key := raw[0]
		val := strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(rest), key))
		if val == "" {
			return nil, fmt.Errorf("%s has no value", key)
		}
		// The legacy value is one word: blanks inside it are kept.
		v, err := tplUnquote(val)
		if err != nil {
			return nil, err
		}
		return []string{key, v}, nil
	}
	words, err := tplWords(rest)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, w := range words {
		k, v, ok := strings.Cut(w, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("%q is not KEY=value", w)
		}
		out = append(out, k, v)
	}
	return out, nil
}

// ---- build context: files, hash, archive ---------------------------------------------

// tplEntry is one path a COPY step sends.
type tplEntry struct {
	Rel  string // POSIX path relative to the context; "" is the context itself
	Abs  string
	Info fs.FileInfo // lstat
}

// tplReadDockerignore reads <ctx>/.dockerignore like the SDK (trimmed,
// blank and # lines dropped). A leading "/" is stripped as Docker does.
// "!" exceptions are not supported (the SDK reads them as literal names)
// and are reported in skipped.
func tplReadDockerignore(ctxDir string) (patterns, skipped []string, err error) {
	b, err := os.ReadFile(filepath.Join(ctxDir, ".dockerignore"))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil, nil
	}
	if err != nil {
		return nil, nil, err
	}
	for _, l := range strings.Split(string(b), "\n") {
		l = strings.TrimSpace(l)
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		if strings.HasPrefix(l, "!") {
			skipped = append(skipped, l)
			continue
		}
		l = strings.TrimLeft(l, "/")
		for strings.HasPrefix(l, "./") {
			l = l[2:]
		}
		if l != "" {
			patterns = append(patterns, l)
		}
	}
	return patterns, skipped, nil
}

// tplIgnored says whether rel is excluded: glob's Ignore tests "rel" and
// "rel/" against each pattern.
func tplIsIgnored(patterns []string, rel string) bool {
	if rel == "" {
		rel = "."
	}
	for _, p := range patterns {
		if tplMatch(p, rel) || tplMatch(p, rel+"/") {
			return true
		}
	}
	return false
}

// tplMatch is the subset of minimatch (dot:true) glob and the SDK use:
// "*", "?", "[...]" within a segment, "**" across segments, and {a,b}.
func tplMatch(pattern, name string) bool {
	for _, p := range tplBraces(pattern) {
		if tplMatchSegs(strings.Split(p, "/"), strings.Split(name, "/")) {
			return true
		}
	}
	return false
}

func tplMatchSegs(p, n []string) bool {
	for len(p) > 0 {
		if p[0] == "**" {
			for len(p) > 1 && p[1] == "**" {
				p = p[1:]
			}
			if len(p) == 1 {
				return true
			}
			for i := 0; i <= len(n); i++ {
				if tplMatchSegs(p[1:], n[i:]) {
					return true
				}
			}
			return false
		}
		if len(n) == 0 {
			return false
		}
		ok, err := path.Match(p[0], n[0])
		if err != nil {
			ok = p[0] == n[0]
		}
		if !ok {
			return false
		}
		p, n = p[1:], n[1:]
	}
	return len(n) == 0
}

// tplBraces expands the first {a,b,...} group, recursively.
func tplBraces(p string) []string {
	depth, start := 0, -1
	for i := 0; i < len(p); i++ {
		switch p[i] {
		case '\\':
			i++
		case '{':
			if depth == 0 {
				start = i
			}
			depth++
		case '}':
			if depth == 0 {
				continue
			}
			depth--
			if depth != 0 {
				continue
			}
			var parts []string
			d, last := 0, start+1
			for j := start + 1; j < i; j++ {
				switch p[j] {
				case '{':
					d++
				case '}':
					d--
				case ',':
					if d == 0 {
						parts = append(parts, p[last:j])
						last = j + 1
					}
				}
			}
			parts = append(parts, p[last:i])
			if len(parts) < 2 {
				continue
			}
			var out []string
			for _, part := range parts {
				out = append(out, tplBraces(p[:start]+part+p[i+1:])...)
			}
			return out
		}
	}
	return []string{p}
}

// tplCollect lists what COPY src sends, sorted as the SDK sorts (by full
// path, which is by relative path). A matched directory brings itself and
// everything under it. One deliberate difference from the SDK: an ignored
// directory also hides its contents, as with Docker (the SDK's glob only
// drops the directory entry itself).
func tplCollect(ctxDir, src string, ignore []string) ([]tplEntry, error) {
	clean := path.Clean(src)
	if clean == "." {
		clean = ""
	}
	seen := map[string]tplEntry{}
	add := func(rel string) error {
		abs := ctxDir
		if rel != "" {
			abs = filepath.Join(ctxDir, filepath.FromSlash(rel))
		}
		fi, err := os.Lstat(abs)
		if err != nil {
			return err
		}
		if err := tplCheckType(rel, fi); err != nil {
			return err
		}
		seen[rel] = tplEntry{Rel: rel, Abs: abs, Info: fi}
		if !fi.IsDir() {
			return nil
		}
		return filepath.WalkDir(abs, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if p == abs {
				return nil
			}
			r, _ := filepath.Rel(ctxDir, p)
			r = filepath.ToSlash(r)
			if tplIsIgnored(ignore, r) {
				if d.IsDir() {
					return filepath.SkipDir
				}
				return nil
			}
			fi, err := d.Info()
			if err != nil {
				return err
			}
			if err := tplCheckType(r, fi); err != nil {
				return err
			}
			seen[r] = tplEntry{Rel: r, Abs: p, Info: fi}
			return nil
		})
	}
	if !strings.ContainsAny(clean, "*?[{") {
		fi, err := os.Lstat(filepath.Join(ctxDir, filepath.FromSlash(clean)))
		switch {
		case errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR):
			return nil, &tplNoFilesError{Src: src, Context: ctxDir}
		case err != nil:
			return nil, err
		case strings.HasSuffix(src, "/") && !fi.IsDir():
			return nil, &tplNoFilesError{Src: src, Context: ctxDir}
		case tplIsIgnored(ignore, clean):
			return nil, &tplNoFilesError{Src: src, Context: ctxDir}
		}
		if err := add(clean); err != nil {
			return nil, err
		}
	} else {
		var matches []string
		err := filepath.WalkDir(ctxDir, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if p == ctxDir {
				return nil
			}
			r, _ := filepath.Rel(ctxDir, p)
			r = filepath.ToSlash(r)
			if tplIsIgnored(ignore, r) {
				if d.IsDir() {
					return filepath.SkipDir
				}
				return nil
			}
			if tplMatch(clean, r) && (!strings.HasSuffix(src, "/") || d.IsDir()) {
				matches = append(matches, r)
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
		for _, m := range matches {
			if _, ok := seen[m]; ok {
				continue
			}
			if err := add(m); err != nil {
				return nil, err
			}
		}
	}
	if len(seen) == 0 {
		return nil, &tplNoFilesError{Src: src, Context: ctxDir}
	}
	out := make([]tplEntry, 0, len(seen))
	for _, e := range seen {
		out = append(out, e)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Rel < out[j].Rel })
	return out, nil
}

func tplCheckType(rel string, fi fs.FileInfo) error {
	m := fi.Mode()
	switch {
	case m&fs.ModeNamedPipe != 0:
		return &tplFileTypeError{Path: rel, Kind: "fifo"}
	case m&fs.ModeSocket != 0:
		return &tplFileTypeError{Path: rel, Kind: "socket"}
	case m&fs.ModeDevice != 0:
		return &tplFileTypeError{Path: rel, Kind: "device"}
	case m&fs.ModeIrregular != 0:
		return &tplFileTypeError{Path: rel, Kind: "special file"}
	}
	return nil
}

// tplStMode is the Unix st_mode Node reports as stats.mode.
func tplStMode(m fs.FileMode) uint32 {
	r := uint32(m.Perm())
	if m&fs.ModeSetuid != 0 {
		r |= 0o4000
	}
	if m&fs.ModeSetgid != 0 {
		r |= 0o2000
	}
	if m&fs.ModeSticky != 0 {
		r |= 0o1000
	}
	switch {
	case m&fs.ModeDir != 0:
		r |= 0o040000
	case m&fs.ModeSymlink != 0:
		r |= 0o120000
	case m&fs.ModeNamedPipe != 0:
		r |= 0o010000
	case m&fs.ModeSocket != 0:
		r |= 0o140000
	case m&fs.ModeDevice != 0 && m&fs.ModeCharDevice != 0:
		r |= 0o020000
	case m&fs.ModeDevice != 0:
		r |= 0o060000
	default:
		r |= 0o100000
	}
	return r
}

// tplFilesHash is the SDK's calculateFilesHash with resolveSymlinks off:
// SHA-256 of "COPY <src> <dest>", then per entry its relative path, mode
// and size in decimal, then the link target or the file's bytes.
func tplFilesHash(src, dest string, entries []tplEntry) (string, error) {
	h := sha256.New()
	io.WriteString(h, "COPY "+src+" "+dest)
	for _, e := range entries {
		io.WriteString(h, e.Rel)
		io.WriteString(h, strconv.FormatUint(uint64(tplStMode(e.Info.Mode())), 10))
		io.WriteString(h, strconv.FormatInt(e.Info.Size(), 10))
		switch {
		case e.Info.Mode()&fs.ModeSymlink != 0:
			target, err := os.Readlink(e.Abs)
			if err != nil {
				return "", err
			}
			io.WriteString(h, target)
		case e.Info.Mode().IsRegular():
			f, err := os.Open(e.Abs)
			if err != nil {
				return "", err
			}
			_, err = io.Copy(h, f)
			f.Close()
			if err != nil {
				return "", err
			}
		}
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// tplWriteArchive writes the gzip tar of entries: paths relative to the
// context, directories included, symlinks kept as links.
func tplWriteArchive(w io.Writer, entries []tplEntry) error {
	zw := gzip.NewWriter(w)
	tw := tar.NewWriter(zw)
	for _, e := range entries {
		link := ""
		if e.Info.Mode()&fs.ModeSymlink != 0 {
			t, err := os.Readlink(e.Abs)
			if err != nil {
				return err
			}
			link = t
		}
		hdr, err := tar.FileInfoHeader(e.Info, link)
		if err != nil {
			return err
		}
		hdr.Name = e.Rel
		if e.Rel == "" {
			hdr.Name = "."
		}
		if e.Info.IsDir() {
			hdr.Name += "/"
		}
		hdr.Uname, hdr.Gname = "", ""
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if e.Info.Mode().IsRegular() {
			f, err := os.Open(e.Abs)
			if err != nil {
				return err
			}
			// Exactly hdr.Size bytes: a file that grew meanwhile must not
			// break the archive.
			_, err = io.CopyN(tw, f, hdr.Size)
			f.Close()
			if err != nil {
				return fmt.Errorf("%s: %w", e.Rel, err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	return zw.Close()
}

// ---- API ----------------------------------------------------------------------------

// tplDo is apiClient.do with a context and the response headers.
func tplDo(ctx context.Context, c *apiClient, method, p string, in, out any) (http.Header, error) {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return nil, err
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+p, body)
	if err != nil {
		return nil, err
	}
	req.Header.Set("X-API-Key", c.key)
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.http.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, fmt.Errorf("%w (is `cubicle serve` running at %s?)", err, c.base)
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		var e struct {
			Message string `json:"message"`
		}
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
		if json.Unmarshal(b, &e) != nil || e.Message == "" {
			e.Message = strings.TrimSpace(string(b))
			if e.Message == "" {
				e.Message = http.StatusText(resp.StatusCode)
			}
		}
		return resp.Header, &tplAPIError{Status: resp.StatusCode, Message: e.Message}
	}
	if out != nil {
		if err := json.NewDecoder(resp.Body).Decode(out); err != nil && !errors.Is(err, io.EOF) {
			return resp.Header, fmt.Errorf("%s %s: decode response: %w", method, p, err)
		}
	}
	return resp.Header, nil
}

type tplLogEntry struct {
	Timestamp time.Time `json:"timestamp"`
	Message   string    `json:"message"`
	Level     string    `json:"level"`
	Step      string    `json:"step,omitempty"`
}

type tplStatus struct {
	TemplateID string        `json:"templateID"`
	BuildID    string        `json:"buildID"`
	Status     string        `json:"status"`
	LogEntries []tplLogEntry `json:"logEntries"`
	Reason     *struct {
		Message string `json:"message"`
		Step    string `json:"step,omitempty"`
	} `json:"reason,omitempty"`
}

type tplBuild struct {
	BuildID    string     `json:"buildID"`
	Status     string     `json:"status"`
	CreatedAt  time.Time  `json:"createdAt"`
	UpdatedAt  time.Time  `json:"updatedAt"`
	FinishedAt *time.Time `json:"finishedAt,omitempty"`
	CPUCount   int        `json:"cpuCount"`
	MemoryMB   int        `json:"memoryMB"`
	DiskSizeMB int        `json:"diskSizeMB"`
}

type tplInfo struct {
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
	Builds        []tplBuild `json:"builds,omitempty"`
}

// tplPollInterval is the SDK's logsRefreshFrequency.
var tplPollInterval = 200 * time.Millisecond

// tplProgress prints build log entries with a header when the step changes.
type tplProgress struct {
	out   io.Writer
	descs []string // [0] base, [1..n] steps, [n+1] finalize
	last  string
}

func newTplProgress(out io.Writer, r *tplRecipe) *tplProgress {
	p := &tplProgress{out: out}
	if r == nil {
		return p
	}
	base := "FROM " + r.FromImage
	if r.FromTemplate != "" {
		base = "FROM template:" + r.FromTemplate
	}
	p.descs = append(p.descs, base)
	for _, s := range r.Steps {
		p.descs = append(p.descs, tplStepDesc(s))
	}
	p.descs = append(p.descs, "finalize")
	return p
}

func tplStepDesc(s tplStep) string {
	var d string
	switch s.Type {
	case "COPY":
		d = "COPY " + s.Args[0] + " " + s.Args[1]
	case "ENV":
		var kv []string
		for i := 0; i+1 < len(s.Args); i += 2 {
			kv = append(kv, s.Args[i]+"="+s.Args[i+1])
		}
		d = "ENV " + strings.Join(kv, " ")
	default:
		d = s.Type + " " + strings.Join(s.Args, " ")
	}
	d = strings.Join(strings.Fields(d), " ")
	if r := []rune(d); len(r) > 72 {
		d = string(r[:69]) + "..."
	}
	return d
}

// index maps a wire step ("base", "finalize", "3") to the header position.
func (p *tplProgress) index(step string) (int, bool) {
	if len(p.descs) == 0 {
		return 0, false
	}
	switch step {
	case "base":
		return 0, true
	case "finalize":
		return len(p.descs) - 1, true
	}
	n, err := strconv.Atoi(step)
	if err != nil || n < 0 || n+1 >= len(p.descs)-1 {
		return 0, false
	}
	return n + 1, true
}

func (p *tplProgress) desc(step string) string {
	if i, ok := p.index(step); ok {
		return p.descs[i]
	}
	return ""
}

func (p *tplProgress) entry(e tplLogEntry) {
	if e.Step != "" && e.Step != p.last {
		p.last = e.Step
		if i, ok := p.index(e.Step); ok {
			fmt.Fprintf(p.out, "Step %d/%d: %s\n", i+1, len(p.descs), p.descs[i])
		}
	}
	step := e.Step
	if step == "" {
		step = "build"
	}
	msg := strings.TrimRight(e.Message, "\n")
	if e.Level == "error" || e.Level == "warn" {
		msg = e.Level + ": " + msg
	}
	fmt.Fprintf(p.out, "[%s] %s\n", step, msg)
}

// tplFollow polls the build status like the SDK's waitForBuildFinish:
// every 200 ms while building or waiting, then without pause until a poll
// returns no log entries.
func tplFollow(ctx context.Context, c *apiClient, templateID, buildID string, p *tplProgress) (*tplStatus, error) {
	offset := 0
	for {
		var st tplStatus
		_, err := tplDo(ctx, c, http.MethodGet, fmt.Sprintf("/templates/%s/builds/%s/status?logsOffset=%d",
			url.PathEscape(templateID), url.PathEscape(buildID), offset), nil, &st)
		if err != nil {
			if ctx.Err() != nil {
				return nil, &tplInterruptedError{TemplateID: templateID, BuildID: buildID, Started: true}
			}
			return nil, err
		}
		for _, e := range st.LogEntries {
			p.entry(e)
		}
		offset += len(st.LogEntries)
		switch st.Status {
		case "building", "waiting":
			select {
			case <-ctx.Done():
				return nil, &tplInterruptedError{TemplateID: templateID, BuildID: buildID, Started: true}
			case <-time.After(tplPollInterval):
			}
		case "ready", "error":
			if len(st.LogEntries) == 0 {
				return &st, nil
			}
		default:
			return nil, fmt.Errorf("build %s: unknown status %q", buildID, st.Status)
		}
	}
}

// tplUpload PUTs the archive of entries to the URL the server returned,
// with an exact Content-Length and without the API key.
func tplUpload(ctx context.Context, src, uploadURL string, headers map[string]string, entries []tplEntry) (int64, error) {
	f, err := os.CreateTemp("", "cubicle-context-*.tar.gz")
	if err != nil {
		return 0, err
	}
	defer os.Remove(f.Name())
	defer f.Close()
	bw := bufio.NewWriter(f)
	if err := tplWriteArchive(bw, entries); err != nil {
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
	ctx, cancel := context.WithTimeout(ctx, time.Hour) // the SDK's upload timeout
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, uploadURL, io.NopCloser(f))
	if err != nil {
		return 0, err
	}
	for k, v := range headers {
		if !strings.EqualFold(k, "Content-Length") {
			req.Header.Set(k, v)
		}
	}
	req.ContentLength = size
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<14))
		return 0, &tplUploadError{Src: src, Status: resp.Status, Body: string(b)}
	}
	return size, nil
}

// ---- commands -----------------------------------------------------------------------

func templateCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "template", Aliases: []string{"tpl"}, Short: "Build and manage templates through the API (CUBICLE_API_URL, CUBICLE_API_KEY)"}
	var asJSON bool
	cmd.PersistentFlags().BoolVar(&asJSON, "json", false, "print JSON")
	cmd.AddCommand(tplBuildCmd(&asJSON), tplListCmd(&asJSON), tplGetCmd(&asJSON), tplDeleteCmd(), tplLogsCmd())
	return cmd
}

func tplBuildCmd(asJSON *bool) *cobra.Command {
	var file, name, contextDir string
	var cpu, mem int
	var noCache bool
	build := &cobra.Command{
		Use:   "build -f RECIPE --name NAME[:TAG]",
		Short: "Build a template from a Dockerfile-style recipe",
		Long: `Build a template from a recipe, a subset of the Dockerfile syntax:

  FROM image | FROM template:NAME     the base (one FROM only)
  RUN cmd | RUN ["exe", "arg"]        a shell command
  COPY/ADD [--chown=u] [--chmod=0755] src... dest
                                      files from the context (no URLs)
  ENV K=v ... | ENV K value           build-time environment
  WORKDIR dir, USER user[:group]
  CMD / ENTRYPOINT                    the start command
  HEALTHCHECK CMD cmd                 the ready command, as does
  # cubicle:ready cmd                 this comment
  EXPOSE, VOLUME, LABEL, SHELL...     ignored with a warning

ARG, heredocs and multi-stage recipes are rejected. The context (default:
the recipe's directory) honours .dockerignore.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			src, err := os.ReadFile(file)
			if err != nil {
				return err
			}
			rec, err := parseTplRecipe(file, string(src))
			if err != nil {
				return err
			}
			if contextDir == "" {
				contextDir = filepath.Dir(file)
			}
			if contextDir, err = filepath.Abs(contextDir); err != nil {
				return err
			}
			logOut := cmd.OutOrStdout()
			if *asJSON {
				logOut = cmd.ErrOrStderr()
			}
			for _, w := range rec.Warnings {
				fmt.Fprintln(cmd.ErrOrStderr(), "warning:", w)
			}
			c, err := newAPIClient()
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			if ctx == nil {
				ctx = context.Background()
			}
			ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
			defer stop()

			// Hash every COPY before anything reaches the server, so a
			// missing file leaves no template behind.
			ignore, skipped, err := tplReadDockerignore(contextDir)
			if err != nil {
				return err
			}
			for _, s := range skipped {
				fmt.Fprintf(cmd.ErrOrStderr(), "warning: .dockerignore exception %q is not supported and is skipped\n", s)
			}
			files := map[int][]tplEntry{}
			for i := range rec.Steps {
				st := &rec.Steps[i]
				if st.Type != "COPY" {
					continue
				}
				ents, err := tplCollect(contextDir, st.Args[0], ignore)
				if err != nil {
					return &tplRecipeError{File: file, Line: st.line, Msg: err.Error()}
				}
				if st.FilesHash, err = tplFilesHash(st.Args[0], st.Args[1], ents); err != nil {
					return err
				}
				files[i] = ents
			}

			body := map[string]any{"name": name}
			if cmd.Flags().Changed("cpu") {
				body["cpuCount"] = cpu
			}
			if cmd.Flags().Changed("memory-mb") {
				body["memoryMB"] = mem
			}
			var created struct {
				TemplateID string   `json:"templateID"`
				BuildID    string   `json:"buildID"`
				Names      []string `json:"names"`
				Tags       []string `json:"tags"`
			}
			if _, err := tplDo(ctx, c, http.MethodPost, "/v3/templates", body, &created); err != nil {
				return fmt.Errorf("create template %s: %w", name, err)
			}
			fmt.Fprintf(logOut, "Template %s: ID %s, build %s\n", name, created.TemplateID, created.BuildID)
			interrupted := &tplInterruptedError{TemplateID: created.TemplateID, BuildID: created.BuildID}

			done := map[string]bool{}
			for i, st := range rec.Steps {
				if st.Type != "COPY" || done[st.FilesHash] {
					continue
				}
				done[st.FilesHash] = true
				var link struct {
					Present bool              `json:"present"`
					URL     string            `json:"url"`
					Headers map[string]string `json:"headers"`
				}
				if _, err := tplDo(ctx, c, http.MethodGet, "/templates/"+url.PathEscape(created.TemplateID)+"/files/"+st.FilesHash, nil, &link); err != nil {
					if ctx.Err() != nil {
						return interrupted
					}
					return fmt.Errorf("upload link for %q: %w", st.Args[0], err)
				}
				if link.Present || link.URL == "" {
					fmt.Fprintf(logOut, "Skipping upload of '%s', already cached\n", st.Args[0])
					continue
				}
				n, err := tplUpload(ctx, st.Args[0], link.URL, link.Headers, files[i])
				if err != nil {
					if ctx.Err() != nil {
						return interrupted
					}
					return err
				}
				fmt.Fprintf(logOut, "Uploaded '%s' (%d bytes)\n", st.Args[0], n)
			}

			start := tplStartBody{FromImage: rec.FromImage, FromTemplate: rec.FromTemplate, Force: noCache, Steps: rec.Steps,
				StartCmd: rec.StartCmd, ReadyCmd: rec.ReadyCmd}
			if start.Steps == nil {
				start.Steps = []tplStep{}
			}
			if _, err := tplDo(ctx, c, http.MethodPost, "/v2/templates/"+url.PathEscape(created.TemplateID)+"/builds/"+url.PathEscape(created.BuildID), start, nil); err != nil {
				if ctx.Err() != nil {
					return interrupted
				}
				return fmt.Errorf("start build: %w", err)
			}
			prog := newTplProgress(logOut, rec)
			st, err := tplFollow(ctx, c, created.TemplateID, created.BuildID, prog)
			if err != nil {
				return err
			}
			if st.Status == "error" {
				e := &tplBuildFailedError{TemplateID: created.TemplateID, BuildID: created.BuildID, Message: "unknown error"}
				if st.Reason != nil {
					e.Step, e.Message = st.Reason.Step, st.Reason.Message
					e.StepDesc = prog.desc(e.Step)
				}
				return e
			}
			if *asJSON {
				return json.NewEncoder(cmd.OutOrStdout()).Encode(map[string]any{"templateID": created.TemplateID, "buildID": created.BuildID,
					"status": st.Status, "names": created.Names, "tags": created.Tags})
			}
			fmt.Fprintf(cmd.OutOrStdout(), "Template %s is ready: templateID %s, buildID %s\n", name, created.TemplateID, created.BuildID)
			return nil
		},
	}
	build.Flags().StringVarP(&file, "file", "f", "Dockerfile", "the recipe (a Dockerfile subset)")
	build.Flags().StringVarP(&name, "name", "n", "", "template name, optionally NAME:TAG (required)")
	build.Flags().StringVar(&contextDir, "context", "", "build context directory (default: the recipe's directory)")
	build.Flags().IntVar(&cpu, "cpu", 0, "vCPUs (default: the server's)")
	build.Flags().IntVar(&mem, "memory-mb", 0, "memory in MiB (default: the server's)")
	build.Flags().BoolVar(&noCache, "no-cache", false, "rebuild every step (force)")
	build.MarkFlagRequired("name")
	return build
}

func tplListCmd(asJSON *bool) *cobra.Command {
	return &cobra.Command{
		Use:   "list",
		Short: "List templates",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := newAPIClient()
			if err != nil {
				return err
			}
			var all []json.RawMessage
			next := ""
			for {
				p := "/v2/templates?limit=100"
				if next != "" {
					p += "&nextToken=" + url.QueryEscape(next)
				}
				var page []json.RawMessage
				h, err := tplDo(cmd.Context(), c, http.MethodGet, p, nil, &page)
				if err != nil {
					return err
				}
				all = append(all, page...)
				next = h.Get("X-Next-Token")
				if next == "" || len(page) == 0 {
					break
				}
			}
			if *asJSON {
				if all == nil {
					all = []json.RawMessage{}
				}
				return json.NewEncoder(cmd.OutOrStdout()).Encode(all)
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tNAMES\tSTATUS\tCPU\tMEM\tSPAWNS\tUPDATED")
			for _, raw := range all {
				var t tplInfo
				if err := json.Unmarshal(raw, &t); err != nil {
					return err
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%dMiB\t%d\t%s\n", t.TemplateID, strings.Join(t.Names, ","), t.BuildStatus,
					t.CPUCount, t.MemoryMB, t.SpawnCount, tplTime(t.UpdatedAt))
			}
			return tw.Flush()
		},
	}
}

func tplTime(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.Local().Format("2006-01-02 15:04:05")
}

func tplGetCmd(asJSON *bool) *cobra.Command {
	return &cobra.Command{
		Use:   "get ID|NAME",
		Short: "Show a template and its builds",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := newAPIClient()
			if err != nil {
				return err
			}
			var raw json.RawMessage
			if _, err := tplDo(cmd.Context(), c, http.MethodGet, "/templates/"+url.PathEscape(args[0]), nil, &raw); err != nil {
				return err
			}
			if *asJSON {
				_, err := fmt.Fprintln(cmd.OutOrStdout(), string(raw))
				return err
			}
			var t tplInfo
			if err := json.Unmarshal(raw, &t); err != nil {
				return err
			}
			w := cmd.OutOrStdout()
			last := "-"
			if t.LastSpawnedAt != nil {
				last = tplTime(*t.LastSpawnedAt)
			}
			fmt.Fprintf(w, "ID:           %s\nNames:        %s\nStatus:       %s\nBuild:        %s\nCPU:          %d\nMemory:       %d MiB\nDisk:         %d MiB\nPublic:       %t\nSpawns:       %d (last %s)\nCreated:      %s\nUpdated:      %s\n",
				t.TemplateID, strings.Join(t.Names, ", "), t.BuildStatus, t.BuildID, t.CPUCount, t.MemoryMB, t.DiskSizeMB, t.Public,
				t.SpawnCount, last, tplTime(t.CreatedAt), tplTime(t.UpdatedAt))
			if len(t.Builds) == 0 {
				return nil
			}
			fmt.Fprintln(w, "\nBuilds:")
			tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "BUILD ID\tSTATUS\tCPU\tMEM\tCREATED\tFINISHED")
			for _, b := range t.Builds {
				fin := "-"
				if b.FinishedAt != nil {
					fin = tplTime(*b.FinishedAt)
				}
				fmt.Fprintf(tw, "%s\t%s\t%d\t%dMiB\t%s\t%s\n", b.BuildID, b.Status, b.CPUCount, b.MemoryMB, tplTime(b.CreatedAt), fin)
			}
			return tw.Flush()
		},
	}
}

func tplDeleteCmd() *cobra.Command {
	var force bool
	del := &cobra.Command{
		Use:   "delete ID|NAME...",
		Short: "Delete templates (refused while sandboxes use one, unless --force)",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := newAPIClient()
			if err != nil {
				return err
			}
			var failed []string
			for _, ref := range args {
				p := "/templates/" + url.PathEscape(ref)
				if force {
					p += "?force=true"
				}
				if _, err := tplDo(cmd.Context(), c, http.MethodDelete, p, nil, nil); err != nil {
					fmt.Fprintf(cmd.ErrOrStderr(), "delete %s: %v\n", ref, err)
					failed = append(failed, ref)
					continue
				}
				fmt.Fprintln(cmd.OutOrStdout(), ref)
			}
			if len(failed) > 0 {
				return fmt.Errorf("could not delete %s", strings.Join(failed, ", "))
			}
			return nil
		},
	}
	del.Flags().BoolVar(&force, "force", false, "delete even while building or in use")
	return del
}

func tplLogsCmd() *cobra.Command {
	var follow bool
	logs := &cobra.Command{
		Use:   "logs ID|NAME [BUILD_ID]",
		Short: "Print a build's logs (default: the latest build)",
		Args:  cobra.RangeArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := newAPIClient()
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			if ctx == nil {
				ctx = context.Background()
			}
			ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
			defer stop()
			// The status route wants the template ID, and paging by
			// logsOffset is exact where timestamps may tie.
			var t tplInfo
			if _, err := tplDo(ctx, c, http.MethodGet, "/templates/"+url.PathEscape(args[0]), nil, &t); err != nil {
				return err
			}
			buildID := ""
			if len(args) == 2 {
				buildID = args[1]
			} else if len(t.Builds) > 0 {
				buildID = t.Builds[0].BuildID
			} else {
				return fmt.Errorf("template %s has no builds", args[0])
			}
			prog := newTplProgress(cmd.OutOrStdout(), nil)
			if follow {
				st, err := tplFollow(ctx, c, t.TemplateID, buildID, prog)
				if err != nil {
					return err
				}
				return tplStatusErr(st, prog)
			}
			offset := 0
			for {
				var st tplStatus
				if _, err := tplDo(ctx, c, http.MethodGet, fmt.Sprintf("/templates/%s/builds/%s/status?logsOffset=%d",
					url.PathEscape(t.TemplateID), url.PathEscape(buildID), offset), nil, &st); err != nil {
					return err
				}
				for _, e := range st.LogEntries {
					prog.entry(e)
				}
				if len(st.LogEntries) == 0 {
					fmt.Fprintf(cmd.ErrOrStderr(), "build %s: %s\n", buildID, st.Status)
					return tplStatusErr(&st, prog)
				}
				offset += len(st.LogEntries)
			}
		},
	}
	logs.Flags().BoolVar(&follow, "follow", false, "keep following until the build finishes")
	return logs
}

func tplStatusErr(st *tplStatus, p *tplProgress) error {
	if st.Status != "error" {
		return nil
	}
	e := &tplBuildFailedError{TemplateID: st.TemplateID, BuildID: st.BuildID, Message: "unknown error"}
	if st.Reason != nil {
		e.Step, e.Message, e.StepDesc = st.Reason.Step, st.Reason.Message, p.desc(st.Reason.Step)
	}
	return e
}
