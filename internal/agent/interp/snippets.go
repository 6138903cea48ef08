package interp

import (
	_ "embed"
	"encoding/json"
	"maps"
	"regexp"
	"slices"
	"strings"
)

// pythonSetup registers e2b's display formatters in a new python kernel.
//
//go:embed pysetup.py
var pythonSetup string

// denoSetup makes Deno's kernel show a string result as its text, as e2b's
// JavaScript kernel does.
//
//go:embed denosetup.js
var denoSetup string

// envChange is one variable to set (Value non-nil) or unset (nil).
type envChange struct {
	Name  string
	Value *string
}

// envDiff lists what turns from into to, sorted by name.
func envDiff(from, to map[string]string) []envChange {
	var out []envChange
	for k, v := range to {
		if old, ok := from[k]; !ok || old != v {
			out = append(out, envChange{Name: k, Value: &v})
		}
	}
	for k := range from {
		if _, ok := to[k]; !ok {
			out = append(out, envChange{Name: k})
		}
	}
	slices.SortFunc(out, func(a, b envChange) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// setEnvChanges lists vars as changes, sorted.
func setEnvChanges(vars map[string]string) []envChange {
	out := make([]envChange, 0, len(vars))
	for _, k := range slices.Sorted(maps.Keys(vars)) {
		v := vars[k]
		out = append(out, envChange{Name: k, Value: &v})
	}
	return out
}

// restoreEnvChanges undoes a run's vars: back to base's value, or unset.
func restoreEnvChanges(vars, base map[string]string) []envChange {
	out := make([]envChange, 0, len(vars))
	for _, k := range slices.Sorted(maps.Keys(vars)) {
		c := envChange{Name: k}
		if v, ok := base[k]; ok {
			c.Value = &v
		}
		out = append(out, c)
	}
	return out
}

// validEnvName reports whether a process environment can hold the name.
func validEnvName(k string) bool {
	return k != "" && !strings.ContainsAny(k, "=\x00")
}

var shellName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// envSnippet is code that applies changes in a kernel of language; "" when
// there is nothing to do or the language has no way to. Names and values
// never become code: they are encoded as string literals (JSON, whose
// string syntax Python, JavaScript and R read alike; single quotes for
// bash), so no value can break out of them.
func envSnippet(language string, changes []envChange) string {
	if len(changes) == 0 {
		return ""
	}
	switch language {
	case "python":
		// os.environ, not os.putenv, so both the process environment
		// (subprocesses) and os.environ (the code) change.
		return "(lambda os, changes: [os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v) for k, v in changes])" +
			"(__import__('os'), __import__('json').loads(" + jsonString(changesJSON(changes)) + "))"
	case "javascript", "typescript":
		return "(() => { const changes = JSON.parse(" + jsonString(changesJSON(changes)) + "); " +
			"const env = globalThis.process ? globalThis.process.env : null; " +
			"for (const [k, v] of changes) { if (env) { if (v === null) delete env[k]; else env[k] = v; } " +
			"else if (globalThis.Deno) { if (v === null) Deno.env.delete(k); else Deno.env.set(k, v); } } })();"
	case "bash":
		var b strings.Builder
		for _, c := range changes {
			if !shellName.MatchString(c.Name) {
				continue // bash cannot hold it; its children still get it at start
			}
			if c.Value == nil {
				b.WriteString("unset " + c.Name + "\n")
			} else {
				b.WriteString("export " + c.Name + "=" + shellQuote(*c.Value) + "\n")
			}
		}
		return strings.TrimSuffix(b.String(), "\n")
	case "r":
		var lines []string
		for _, c := range changes {
			if c.Value == nil {
				lines = append(lines, "invisible(Sys.unsetenv("+jsonString(c.Name)+"))")
			} else {
				lines = append(lines, "invisible(do.call(Sys.setenv, setNames(list("+jsonString(*c.Value)+"), "+jsonString(c.Name)+")))")
			}
		}
		return strings.Join(lines, "\n")
	case "java":
		// A JVM cannot change its environment; e2b sets system properties.
		var lines []string
		for _, c := range changes {
			if c.Value == nil {
				lines = append(lines, "System.clearProperty("+jsonString(c.Name)+");")
			} else {
				lines = append(lines, "System.setProperty("+jsonString(c.Name)+", "+jsonString(*c.Value)+");")
			}
		}
		return strings.Join(lines, "\n")
	}
	return ""
}

// changesJSON encodes changes as [[name, value-or-null], ...].
func changesJSON(changes []envChange) string {
	pairs := make([][2]*string, len(changes))
	for i, c := range changes {
		pairs[i] = [2]*string{&c.Name, c.Value}
	}
	b, _ := json.Marshal(pairs)
	return string(b)
}

// jsonString is s as a JSON string literal (ASCII-safe: json.Marshal escapes
// <, >, &, U+2028 and U+2029 too).
func jsonString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// shellQuote single-quotes s for bash: nothing inside single quotes is
// special except the quote itself, written as '\”.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
