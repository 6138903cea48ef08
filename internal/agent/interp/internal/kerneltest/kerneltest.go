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

// Deno returns the deno binary of the code-interpreter-v1 image
// (scripts/build-code-interpreter puts it in /usr/local/bin; it runs on the
// host too): env CUBICLE_TEST_DENO, else under CUBICLE_IMAGES_DIR or
// /var/lib/cubicle/images. Missing, the test is skipped locally and fails
// under CI.
func Deno(t testing.TB) string {
	t.Helper()
	var candidates []string
	if p := os.Getenv("CUBICLE_TEST_DENO"); p != "" {
		candidates = append(candidates, p)
	}
	images := os.Getenv("CUBICLE_IMAGES_DIR")
	if images == "" {
		images = "/var/lib/cubicle/images"
	}
	candidates = append(candidates, filepath.Join(images, "code-interpreter-v1", "rootfs", "usr", "local", "bin", "deno"))
	for _, p := range candidates {
		if err := exec.Command(p, "--version").Run(); err == nil {
			return p
		}
	}
	testenv.Skip(t, "no deno: set CUBICLE_TEST_DENO or build code-interpreter-v1 (scripts/install)")
	return ""
}
