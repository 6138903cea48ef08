package interp_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"testing"

	"github.com/cubicle-dev/cubicle/internal/agent/interp"
	"github.com/cubicle-dev/cubicle/internal/agent/interp/internal/kerneltest"
)

// denoEnv is an interpreter with python's fallback kernels and Deno's, from a
// kernelspec like the image's.
func denoEnv(t *testing.T) *env {
	deno := kerneltest.Deno(t)
	dir := t.TempDir()
	spec := map[string]any{
		"argv":     []string{deno, "jupyter", "--kernel", "--conn", "{connection_file}"},
		"language": "typescript",
		"env":      map[string]string{"NO_COLOR": "1", "DENO_NO_UPDATE_CHECK": "1", "DENO_DIR": filepath.Join(dir, "cache")},
	}
	b, _ := json.Marshal(spec)
	if err := os.MkdirAll(filepath.Join(dir, "deno"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "deno", "kernel.json"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	return newEnv(t, func(c *interp.Config) { c.KernelSpecDirs = []string{dir} })
}

// TestDenoResults: Deno publishes an execution's result from an async task,
// sometimes after its idle status; the fence makes every run carry its own.
// A string result is its text, as e2b's JavaScript kernel shows it.
func TestDenoResults(t *testing.T) {
	e := denoEnv(t)
	for i := range 40 {
		lines := e.run(fmt.Sprintf("%d + 1", i), "language", "js")
		endsCleanly(t, lines)
		if got := mainResult(t, lines)["text"]; got != fmt.Sprint(i+1) {
			t.Fatalf("run %d: result %v, lines %v", i, got, lines)
		}
	}
	lines := e.run("await Promise.resolve('Hello World!')", "language", "ts")
	if got := mainResult(t, lines)["text"]; got != "Hello World!" {
		t.Fatalf("string result %q", got)
	}
	lines = e.run(`({ s: "in object" })`, "language", "js")
	if got := mainResult(t, lines)["text"]; got != `{ s: "in object" }` {
		t.Fatalf("object result %q (strings inside keep quotes, no colours)", got)
	}
	lines = e.run(`console.log("%o", "logged")`, "language", "js")
	if got := stdout(lines); got != "\"logged\"\n" {
		t.Fatalf("console.log is untouched: %q", got)
	}
	lines = e.run("process.env.RUN_ONLY", "language", "js", "env_vars", map[string]string{"RUN_ONLY": "x"})
	if got := mainResult(t, lines)["text"]; got != "x" {
		t.Fatalf("run env %q", got)
	}
}

// TestJavaScriptDefaultContextIsListedBeforeItsKernel: as e2b's server, the
// list has a javascript context from the start, but no kernel runs for it
// until it is used.
func TestJavaScriptDefaultContextIsListedBeforeItsKernel(t *testing.T) {
	e := denoEnv(t)
	if err := e.srv.Warm(t.Context()); err != nil {
		t.Fatal(err)
	}
	status, b := e.do(http.MethodGet, "/contexts", nil)
	if status != http.StatusOK {
		t.Fatalf("list: %d %s", status, b)
	}
	var list []interp.Context
	if err := json.Unmarshal(b, &list); err != nil {
		t.Fatal(err)
	}
	var js *interp.Context
	for i, c := range list {
		if c.Language == "javascript" {
			if js != nil {
				t.Fatalf("two javascript contexts: %v", list)
			}
			js = &list[i]
		}
	}
	if js == nil || len(list) != 2 || list[0].Language != "python" {
		t.Fatalf("contexts %v: want python then javascript", list)
	}
	if n := kernelProcesses(t, "deno"); n != 0 {
		t.Fatalf("%d deno kernels before any javascript ran", n)
	}
	lines := e.run("globalThis.x = 41; x + 1", "context_id", js.ID)
	if got := mainResult(t, lines)["text"]; got != "42" {
		t.Fatalf("result %v", lines)
	}
	// language js is the same context.
	if got := mainResult(t, e.run("x", "language", "js"))["text"]; got != "41" {
		t.Fatalf("language js ran elsewhere: %v", got)
	}
	if n := kernelProcesses(t, "deno"); n != 1 {
		t.Fatalf("%d deno kernels after the first run, want 1", n)
	}
}

// kernelProcesses counts this process's children whose executable is name.
func kernelProcesses(t *testing.T, name string) int {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	self := fmt.Sprint(os.Getpid())
	n := 0
	for _, e := range entries {
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		var pid int
		var comm, state string
		var ppid int
		if _, err := fmt.Sscanf(string(stat), "%d %s %s %d", &pid, &comm, &state, &ppid); err != nil {
			continue
		}
		if comm == "("+name+")" && fmt.Sprint(ppid) == self {
			n++
		}
	}
	return n
}
