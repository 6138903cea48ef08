// Package kerneltest finds the Python interpreter the interp tests run real
// Jupyter kernels with.
package kerneltest

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/cubicle-dev/cubicle/internal/testenv"
)

// Python returns a python with ipykernel and bash_kernel importable: env
// CUBICLE_TEST_PYTHON, else <repo>/test/e2b-py/.venv/bin/python (created by
// scripts/install). Without one the test is skipped locally, but fails when
// CI=true, since CI must exercise the real kernels.
func Python(t testing.TB) string {
	t.Helper()
	var candidates []string
	if p := os.Getenv("CUBICLE_TEST_PYTHON"); p != "" {
		candidates = append(candidates, p)
	}
	_, file, _, _ := runtime.Caller(0)
	repo := filepath.Join(filepath.Dir(file), "..", "..", "..", "..", "..")
	candidates = append(candidates, filepath.Join(repo, "test", "e2b-py", ".venv", "bin", "python"))
	for _, p := range candidates {
		if err := exec.Command(p, "-c", "import ipykernel, bash_kernel").Run(); err == nil {
			return p
		}
	}
	msg := "no python with ipykernel and bash_kernel: set CUBICLE_TEST_PYTHON or run scripts/install"
	testenv.Skip(t, msg)
	return ""
}
