// Package testenv decides what a test does when the host lacks something it
// needs (root, a program, a kernel feature): on a developer's machine it is
// skipped with the reason; under CI=true it fails with the same reason,
// since CI installs everything and a skipped test there proves nothing.
package testenv

import (
	"fmt"
	"os"
	"os/exec"
	"testing"
)

// CI reports whether the tests run under CI (CI=true), where every test
// must run.
func CI() bool { return os.Getenv("CI") == "true" }

// Skip skips t with the reason, or fails it under CI=true.
func Skip(t testing.TB, args ...any) {
	t.Helper()
	if CI() {
		t.Fatal(append([]any{"cannot run under CI=true:"}, args...)...)
	}
	t.Skip(args...)
}

// Skipf is Skip with a format.
func Skipf(t testing.TB, format string, args ...any) {
	t.Helper()
	Skip(t, fmt.Sprintf(format, args...))
}

// RequireRoot skips t (fails it under CI=true) unless it runs as root; why
// says what needs root.
func RequireRoot(t testing.TB, why string) {
	t.Helper()
	if os.Geteuid() != 0 {
		Skipf(t, "needs root (%s)", why)
	}
}

// LookPath returns the path of program, or skips t (fails it under
// CI=true) when it is not installed.
func LookPath(t testing.TB, program string) string {
	t.Helper()
	p, err := exec.LookPath(program)
	if err != nil {
		Skipf(t, "%s not installed (scripts/install installs it): %v", program, err)
	}
	return p
}

// DirNames lists the names in dir, failing t when it cannot be read.
func DirNames(t testing.TB, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	out := make([]string, 0, len(ents))
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out
}
