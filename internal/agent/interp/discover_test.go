package interp_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cubicle-dev/cubicle/internal/agent"
	"github.com/cubicle-dev/cubicle/internal/agent/interp"
	"github.com/cubicle-dev/cubicle/internal/agent/interp/internal/kerneltest"
)

func TestDiscoverReadsKernelSpecs(t *testing.T) {
	python := kerneltest.Python(t)
	a := agent.New(agent.Config{Logger: quietLogger()})
	dir := t.TempDir()
	write := func(name, body string) {
		if err := os.MkdirAll(filepath.Join(dir, name), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name, "kernel.json"), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("mypython", `{"argv": ["python", "-m", "ipykernel_launcher", "-f", "{connection_file}"], "language": "Python", "display_name": "x"}`)
	write("node", `{"argv": ["/nonexistent/node", "{connection_file}"], "language": "javascript"}`)
	write("broken", `{"argv": [`)
	write("noconn", `{"argv": ["/bin/sh"], "language": "sh"}`)
	ctx := context.Background()
	cat, err := interp.Discover(ctx, a, interp.Config{Python: python, KernelSpecDirs: []string{dir}, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(cat.Languages(), ","); got != "bash,python" {
		t.Fatalf("languages = %s", got)
	}
	spec, _ := cat.Spec("python")
	if spec.Name != "mypython" || !spec.IPython || spec.InterruptMode != "signal" || spec.Argv[0] == "python" {
		t.Fatalf("python spec = %+v", spec)
	}
	if spec, _ := cat.Spec("bash"); spec.Name != "fallback-bash" {
		t.Fatalf("bash spec = %+v", spec)
	}

	_, err = interp.Discover(ctx, a, interp.Config{Python: filepath.Join(dir, "no-python"), KernelSpecDirs: []string{}, Logger: quietLogger()})
	if !errors.Is(err, interp.ErrNoKernels) {
		t.Fatalf("without python: err = %v, want ErrNoKernels", err)
	}
}

func TestKernelThatFailsToStartIsReported(t *testing.T) {
	python := kerneltest.Python(t)
	a := agent.New(agent.Config{Logger: quietLogger()})
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "bad"), 0o755); err != nil {
		t.Fatal(err)
	}
	spec := `{"argv": ["/bin/sh", "-c", "echo boom >&2; exit 3", "{connection_file}"], "language": "python"}`
	if err := os.WriteFile(filepath.Join(dir, "bad", "kernel.json"), []byte(spec), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := interp.Config{Python: python, KernelSpecDirs: []string{dir}, RuntimeDir: filepath.Join(t.TempDir(), "k"), DefaultCwd: t.TempDir(), Logger: quietLogger()}
	cat, err := interp.Discover(context.Background(), a, cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := interp.New(a, cat, cfg)
	defer srv.Close()
	ts := httptest.NewServer(srv.Handler())
	defer ts.Close()
	for path, body := range map[string]string{"/contexts": `{}`, "/execute": `{"code": "1"}`} {
		resp, err := http.Post(ts.URL+path, "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusInternalServerError || !strings.Contains(string(b), "exited with code 3") || !strings.Contains(string(b), "boom") {
			t.Fatalf("%s: %d %s", path, resp.StatusCode, b)
		}
	}
	if files, _ := os.ReadDir(cfg.RuntimeDir); len(files) != 0 {
		t.Fatalf("connection files left: %v", files)
	}
}
