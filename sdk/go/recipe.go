package cubicle

import (
	"encoding/json"
	"errors"
	"fmt"
	"path"
	"regexp"
	"strconv"
	"strings"
)

// Dockerfile-style recipes: the subset of the Dockerfile syntax that maps
// onto template steps (FROM, RUN, COPY/ADD, ENV, WORKDIR, USER, CMD,
// ENTRYPOINT, HEALTHCHECK and a "# cubicle:ready" comment).

// RecipeError is a recipe that cannot be translated; Line is 1-based
// (0 when the error is about the whole recipe).
type RecipeError struct {
	File string
	Line int
	Msg  string
}

// Error implements error.
func (e *RecipeError) Error() string {
	if e.Line > 0 {
		return fmt.Sprintf("%s:%d: %s", e.File, e.Line, e.Msg)
	}
	return fmt.Sprintf("%s: %s", e.File, e.Msg)
}

// Recipe is a parsed Dockerfile-style recipe: a base, steps and the
// start/ready commands. Spec turns it into a TemplateSpec.
type Recipe struct {
	FromImage    string
	FromTemplate string
	Steps        []TemplateStep
	StartCmd     string
	ReadyCmd     string
	// Warnings lists what was accepted but ignored or reinterpreted
	// (EXPOSE, ADD treated as COPY, ...).
	Warnings []string
}

// Spec is the TemplateSpec that builds r as template name from contextDir.
func (r *Recipe) Spec(name, contextDir string) TemplateSpec {
	return TemplateSpec{Name: name, FromImage: r.FromImage, FromTemplate: r.FromTemplate, Steps: append([]TemplateStep(nil), r.Steps...),
		StartCmd: r.StartCmd, ReadyCmd: r.ReadyCmd, ContextDir: contextDir}
}

// recipeLine is one logical instruction after continuations are joined.
type recipeLine struct {
	n       int    // first physical line
	keyword string // upper case; "#READY" for a cubicle:ready comment
	rest    string
}

// readyDirective is the comment that sets readyCmd.
const readyDirective = "cubicle:ready"

// recipeLines joins `\` continuations and drops comments and blank lines, as
// the Dockerfile parser does (comment lines inside a continuation are
// skipped too).
func recipeLines(src string) []recipeLine {
	var out []recipeLine
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
		out = append(out, recipeLine{n: start, keyword: strings.ToUpper(kw), rest: strings.TrimSpace(rest)})
	}
	for i, raw := range phys {
		n := i + 1
		trimmed := strings.TrimSpace(raw)
		if trimmed == "" || strings.HasPrefix(trimmed, "#") {
			if !inCont && strings.HasPrefix(trimmed, "#") {
				c := strings.TrimSpace(strings.TrimPrefix(trimmed, "#"))
				if r, ok := strings.CutPrefix(c, readyDirective); ok && (r == "" || r[0] == ' ' || r[0] == '\t') {
					out = append(out, recipeLine{n: n, keyword: "#READY", rest: strings.TrimSpace(r)})
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

// heredocRE is BuildKit's heredoc word test (after word splitting).
var heredocRE = regexp.MustCompile(`^(\d*)<<(-?)([^<].*)$`)

// lexWords splits s on blanks, honouring quotes and backslashes, and
// removes the quotes (the Dockerfile word rules, without $ expansion).
func lexWords(s string) ([]string, error) { return lex(s, true) }

// unquote removes quotes and escapes but keeps blanks (one word).
func unquote(s string) (string, error) {
	w, err := lex(s, false)
	if err != nil || len(w) == 0 {
		return "", err
	}
	return w[0], nil
}

func lex(s string, split bool) ([]string, error) {
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

// rawWords splits on blanks only, keeping quotes (for heredoc detection
// and flag scanning).
func rawWords(s string) []string { return strings.Fields(s) }

// jsonArray parses the exec form; ok is false for the shell form.
func jsonArray(s string) ([]string, bool) {
	if !strings.HasPrefix(strings.TrimSpace(s), "[") {
		return nil, false
	}
	var a []string
	if json.Unmarshal([]byte(s), &a) != nil {
		return nil, false
	}
	return a, true
}

var safeWordRE = regexp.MustCompile(`^[A-Za-z0-9_@%+=:,./-]+$`)

// ShellQuote turns an exec-form array into one shell command line,
// quoting what the shell would otherwise split or expand.
func ShellQuote(a []string) string {
	q := make([]string, len(a))
	for i, w := range a {
		if safeWordRE.MatchString(w) {
			q[i] = w
		} else {
			q[i] = "'" + strings.ReplaceAll(w, "'", `'\''`) + "'"
		}
	}
	return strings.Join(q, " ")
}

// instrFlags strips leading --name[=value] words from rest.
func instrFlags(rest string) (flags [][2]string, remaining string) {
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

// ignoredInstr are instructions that have no meaning for a sandbox template.
var ignoredInstr = map[string]bool{"EXPOSE": true, "VOLUME": true, "LABEL": true, "SHELL": true, "STOPSIGNAL": true, "MAINTAINER": true, "ONBUILD": true}

// ParseRecipe translates a Dockerfile subset into a Recipe; file names the
// source in errors. Anything it cannot translate faithfully (ARG, heredocs,
// multi-stage builds, URLs in ADD) is a *RecipeError naming the line.
func ParseRecipe(file, src string) (*Recipe, error) {
	r := &Recipe{}
	fail := func(n int, format string, a ...any) error {
		return &RecipeError{File: file, Line: n, Msg: fmt.Sprintf(format, a...)}
	}
	warn := func(n int, format string, a ...any) {
		r.Warnings = append(r.Warnings, fmt.Sprintf("%s:%d: %s", file, n, fmt.Sprintf(format, a...)))
	}
	var entrypoint, cmd string
	var entryExec, haveFrom, warnedAdd bool
	for _, l := range recipeLines(src) {
		if l.keyword != "#READY" && !haveFrom && l.keyword != "FROM" {
			return nil, fail(l.n, "%s before FROM; the recipe must start with FROM", l.keyword)
		}
		switch l.keyword {
		case "RUN", "COPY", "ADD":
			for _, w := range rawWords(l.rest) {
				if m := heredocRE.FindStringSubmatch(w); m != nil {
					return nil, fail(l.n, "heredocs (%s) are not supported; put the script in a file and COPY it, or join commands with &&", w)
				}
			}
		}
		switch l.keyword {
		case "#READY":
			if l.rest == "" {
				return nil, fail(l.n, "# %s needs a command", readyDirective)
			}
			r.ReadyCmd = l.rest
		case "FROM":
			if haveFrom {
				return nil, fail(l.n, "a second FROM: multi-stage recipes are not supported")
			}
			haveFrom = true
			flags, rest := instrFlags(l.rest)
			for _, f := range flags {
				warn(l.n, "FROM --%s is ignored", f[0])
			}
			w, err := lexWords(rest)
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
			flags, rest := instrFlags(l.rest)
			if len(flags) > 0 {
				return nil, fail(l.n, "RUN --%s is not supported", flags[0][0])
			}
			cmdline := rest
			if a, ok := jsonArray(rest); ok {
				cmdline = ShellQuote(a)
			}
			if strings.TrimSpace(cmdline) == "" {
				return nil, fail(l.n, "RUN needs a command")
			}
			r.Steps = append(r.Steps, TemplateStep{Type: "RUN", Args: []string{cmdline}, line: l.n})
		case "COPY", "ADD":
			steps, err := copySteps(l, fail, warn)
			if err != nil {
				return nil, err
			}
			if l.keyword == "ADD" && !warnedAdd {
				warnedAdd = true
				warn(l.n, "ADD is treated as COPY: no URL download, no archive extraction")
			}
			r.Steps = append(r.Steps, steps...)
		case "ENV":
			args, err := envPairs(l.rest)
			if err != nil {
				return nil, fail(l.n, "ENV: %v", err)
			}
			r.Steps = append(r.Steps, TemplateStep{Type: "ENV", Args: args, line: l.n})
		case "WORKDIR":
			w, err := lexWords(l.rest)
			if err != nil {
				return nil, fail(l.n, "WORKDIR: %v", err)
			}
			if len(w) != 1 {
				return nil, fail(l.n, "WORKDIR needs exactly one path")
			}
			r.Steps = append(r.Steps, TemplateStep{Type: "WORKDIR", Args: w, line: l.n})
		case "USER":
			w, err := lexWords(l.rest)
			if err != nil {
				return nil, fail(l.n, "USER: %v", err)
			}
			if len(w) != 1 {
				return nil, fail(l.n, "USER needs exactly one user[:group]")
			}
			r.Steps = append(r.Steps, TemplateStep{Type: "USER", Args: w, line: l.n})
		case "CMD", "ENTRYPOINT":
			c, exec := l.rest, false
			if a, ok := jsonArray(l.rest); ok {
				c, exec = ShellQuote(a), true
			}
			if l.keyword == "CMD" {
				cmd = c
			} else {
				entrypoint, entryExec = c, exec
			}
		case "HEALTHCHECK":
			flags, rest := instrFlags(l.rest)
			for _, f := range flags {
				warn(l.n, "HEALTHCHECK --%s is ignored (readyCmd is retried until it succeeds)", f[0])
			}
			kw, body, _ := strings.Cut(rest, " ")
			switch strings.ToUpper(kw) {
			case "NONE":
				r.ReadyCmd = ""
			case "CMD":
				body = strings.TrimSpace(body)
				if a, ok := jsonArray(body); ok {
					if len(a) > 0 && a[0] == "CMD-SHELL" {
						body = strings.Join(a[1:], " ")
					} else {
						body = ShellQuote(a)
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
			if ignoredInstr[l.keyword] {
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

// copySteps turns COPY/ADD into one COPY step per source, as the SDK does.
func copySteps(l recipeLine, fail func(int, string, ...any) error, warn func(int, string, ...any)) ([]TemplateStep, error) {
	flags, rest := instrFlags(l.rest)
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
	args, ok := jsonArray(rest)
	if !ok {
		var err error
		if args, err = lexWords(rest); err != nil {
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
	var out []TemplateStep
	for _, s := range srcs {
		if strings.Contains(s, "://") || strings.HasPrefix(s, "git@") {
			return nil, fail(l.n, "%s of a URL (%s) is not supported; download it in a RUN step", l.keyword, s)
		}
		if err := checkCopySrc(s); err != nil {
			return nil, fail(l.n, "%s: %v", l.keyword, err)
		}
		out = append(out, TemplateStep{Type: "COPY", Args: []string{s, dest, user, mode}, line: l.n})
	}
	return out, nil
}

// checkCopySrc is the SDK's validateRelativePath.
func checkCopySrc(s string) error {
	if path.IsAbs(s) {
		return fmt.Errorf("source %q must be relative to the build context", s)
	}
	if c := path.Clean(s); c == ".." || strings.HasPrefix(c, "../") {
		return fmt.Errorf("source %q escapes the build context", s)
	}
	return nil
}

// envPairs parses `ENV k=v ...` or the legacy `ENV k value with spaces`.
func envPairs(rest string) ([]string, error) {
	raw := rawWords(rest)
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
		v, err := unquote(val)
		if err != nil {
			return nil, err
		}
		return []string{key, v}, nil
	}
	words, err := lexWords(rest)
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
