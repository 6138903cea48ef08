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
	a := agent.New(agent.Config{AccessToken: token, Logger: quietLogger()})
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
	a := agent.New(agent.Config{AccessToken: token, Logger: quietLogger()})
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
		req, _ := http.NewRequest("POST", ts.URL+path, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-Access-Token", token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusInternalServerError || !strings.Contains(string(b), "exited with code 3") || !strings.Contains(string(b), "boom") {
			t.Fatalf("%s: %d %s", path, resp.StatusCode, b)
		}
	}
	if err := srv.Warm(context.Background()); !errors.Is(err, interp.ErrKernelStart) {
		t.Fatalf("warm: err = %v, want ErrKernelStart", err)
	}
	resp, err := http.Get(ts.URL + "/health")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusInternalServerError || !strings.Contains(string(b), "the default kernel failed to start") || !strings.Contains(string(b), "exited with code 3") {
		t.Fatalf("health after a failed warm: %d %s", resp.StatusCode, b)
	}
	if files, _ := os.ReadDir(cfg.RuntimeDir); len(files) != 0 {
		t.Fatalf("connection files left: %v", files)
	}
}

// fakePython writes an executable at path that records each run in the
// returned file, prints out and exits 0 when out is not empty, and fails
// otherwise: Discover must not need it where the filesystem answers.
func fakePython(t *testing.T, path, out string) (runs string) {
	t.Helper()
	runs = path + ".runs"
	script := "#!/bin/sh\necho run >> '" + runs + "'\n"
	if out != "" {
		script += "cat <<'EOF'\n" + out + "\nEOF\n"
	} else {
		script += "exit 1\n"
	}
	mkdirs(t, filepath.Dir(path))
	if err := os.WriteFile(path, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return runs
}

func mkdirs(t *testing.T, dirs ...string) {
	t.Helper()
	for _, d := range dirs {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
}

// installPackages puts ipykernel (and bash_kernel) into a site-packages
// directory, as pip lays them out.
func installPackages(t *testing.T, site string, bashKernel bool) {
	t.Helper()
	files := []string{"ipykernel/__init__.py", "ipykernel_launcher.py"}
	if bashKernel {
		files = append(files, "bash_kernel/__init__.py", "bash_kernel/__main__.py")
	}
	for _, f := range files {
		mkdirs(t, filepath.Dir(filepath.Join(site, f)))
		if err := os.WriteFile(filepath.Join(site, f), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func ran(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

func TestDiscoverReadsPythonPackagesWithoutRunningPython(t *testing.T) {
	a := agent.New(agent.Config{AccessToken: token, Logger: quietLogger()})
	ctx := context.Background()
	discover := func(python string) (*interp.Catalog, error) {
		return interp.Discover(ctx, a, interp.Config{Python: python, KernelSpecDirs: []string{}, Logger: quietLogger()})
	}

	// A prefix install (python.org, Docker's python images, conda).
	prefix := t.TempDir()
	runs := fakePython(t, filepath.Join(prefix, "bin", "python3.12"), "")
	if err := os.Symlink("python3.12", filepath.Join(prefix, "bin", "python3")); err != nil {
		t.Fatal(err)
	}
	installPackages(t, filepath.Join(prefix, "lib", "python3.12", "site-packages"), true)
	python := filepath.Join(prefix, "bin", "python3")
	cat, err := discover(python)
	if err != nil {
		t.Fatal(err)
	}
	if s, _ := cat.Spec("python"); s.Name != "fallback-python" || s.Argv[0] != python || s.Argv[2] != "ipykernel_launcher" {
		t.Fatalf("python spec = %+v", s)
	}
	if s, ok := cat.Spec("bash"); !ok || s.Argv[0] != python {
		t.Fatalf("bash spec = %+v", s)
	}
	if ran(runs) {
		t.Fatal("python was run though its site-packages has ipykernel")
	}

	// A venv with ipykernel of its own: the venv's python runs the kernel.
	venv := t.TempDir()
	cfg := "home = " + filepath.Join(prefix, "bin") + "\ninclude-system-site-packages = false\nversion = 3.12.1\n"
	mkdirs(t, filepath.Join(venv, "bin"))
	if err := os.WriteFile(filepath.Join(venv, "pyvenv.cfg"), []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(prefix, "bin", "python3"), filepath.Join(venv, "bin", "python")); err != nil {
		t.Fatal(err)
	}
	installPackages(t, filepath.Join(venv, "lib", "python3.12", "site-packages"), false)
	cat, err = discover(filepath.Join(venv, "bin", "python"))
	if err != nil {
		t.Fatal(err)
	}
	if s, _ := cat.Spec("python"); s.Argv[0] != filepath.Join(venv, "bin", "python") {
		t.Fatalf("venv python spec = %+v", s)
	}
	if _, ok := cat.Spec("bash"); ok {
		t.Fatal("bash from the base python's bash_kernel, which the venv does not see")
	}
	if ran(runs) {
		t.Fatal("python was run though the venv has ipykernel")
	}

	// Packages of another version do not count: python is asked, and
	// (failing here) there is no kernel.
	stale := t.TempDir()
	runs = fakePython(t, filepath.Join(stale, "bin", "python3.13"), "")
	installPackages(t, filepath.Join(stale, "lib", "python3.12", "site-packages"), false)
	if _, err := discover(filepath.Join(stale, "bin", "python3.13")); !errors.Is(err, interp.ErrNoKernels) {
		t.Fatalf("python3.13 with python3.12's ipykernel: err = %v, want ErrNoKernels", err)
	}
	if !ran(runs) {
		t.Fatal("python was not asked where the filesystem could not tell")
	}

	// A layout the filesystem cannot place (a pyenv shim, say): python is
	// run to ask.
	shimDir := t.TempDir()
	shim := filepath.Join(shimDir, "python3")
	runs = fakePython(t, shim, `{"executable": "`+shim+`", "prefix": "`+shimDir+`", "ipykernel": true, "bash_kernel": false}`)
	cat, err = discover(shim)
	if err != nil {
		t.Fatal(err)
	}
	if s, _ := cat.Spec("python"); s.Argv[0] != shim || !ran(runs) {
		t.Fatalf("shim: spec %+v, ran %v", s, ran(runs))
	}
}
