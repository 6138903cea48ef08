package interp

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"
)

// pythonProbe is what Discover learns of the sandbox's python: from the
// filesystem (inspectPython) or, where that says nothing, by running it
// (probeOne), which imports nothing heavy (find_spec only locates modules).
type pythonProbe struct {
	Executable string `json:"executable"`
	Prefix     string `json:"prefix"`
	IPyKernel  bool   `json:"ipykernel"`
	BashKernel bool   `json:"bash_kernel"`
}

const probeScript = `import json, sys
from importlib.util import find_spec
print(json.dumps({"executable": sys.executable, "prefix": sys.prefix,
                  "ipykernel": find_spec("ipykernel") is not None,
                  "bash_kernel": find_spec("bash_kernel") is not None}))`

// pythonCandidates is cfg.Python as found on the sandbox's PATH and then on
// the agent's own PATH (the image's ENV PATH, which may name another python,
// a conda one say), each once; err is the first lookup's failure.
func pythonCandidates(cfg Config, env map[string]string) (found []string, err error) {
	for _, path := range []string{env["PATH"], os.Getenv("PATH")} {
		python, lerr := lookPath(cfg.Python, path)
		if lerr != nil {
			if err == nil {
				err = lerr
			}
			continue
		}
		if abs, aerr := filepath.Abs(python); aerr == nil {
			python = abs
		}
		if !slices.Contains(found, python) {
			found = append(found, python)
		}
	}
	return found, err
}

// findPython answers the probe from the filesystem, without starting a
// process (a python start costs 100 ms warm and seconds in a cold VM): the
// first candidate whose packages include ipykernel, as probePython would
// pick. nil means the filesystem cannot tell (no candidate has ipykernel
// where inspectPython looks, or one before it has a layout inspectPython
// does not know); only then is python run, which also sees .pth files, eggs
// and editable installs.
func findPython(candidates []string, env map[string]string) *pythonProbe {
	for _, python := range candidates {
		p := inspectPython(python, env)
		if p == nil {
			return nil
		}
		if p.IPyKernel {
			return p
		}
	}
	return nil
}

var versionedPython = regexp.MustCompile(`^python(3\.[0-9]+)$`)

// inspectPython finds python's package directories as its getpath and site
// modules would, for the layouts images have: a venv (pyvenv.cfg beside or
// above the executable), a prefix install (python.org builds, Docker's
// python images, conda: <prefix>/lib/python3.N/site-packages), Debian's
// python (/usr/lib/python3/dist-packages and /usr/local/lib/python3.N/
// dist-packages), the kernel user's site (~/.local/lib/python3.N/
// site-packages) and $PYTHONPATH. Only directories of python's own version
// count, so a stale python3.9 tree does not make a python3.11 look ready.
// nil when the version cannot be told (a pyenv shim, say).
func inspectPython(python string, env map[string]string) *pythonProbe {
	real, err := filepath.EvalSymlinks(python)
	if err != nil {
		return nil
	}
	venv, venvCfg := findVenv(python)
	base := filepath.Dir(filepath.Dir(real))
	if home := venvCfg["home"]; home != "" {
		base = filepath.Dir(filepath.Clean(home))
	}
	version := ""
	if m := versionedPython.FindStringSubmatch(filepath.Base(real)); m != nil {
		version = m[1]
	} else if v := cmp.Or(venvCfg["version_info"], venvCfg["version"]); v != "" {
		if parts := strings.Split(v, "."); len(parts) >= 2 {
			version = parts[0] + "." + parts[1]
		}
	} else if m, _ := filepath.Glob(filepath.Join(base, "lib", "python3.*", "os.py")); len(m) == 1 {
		version = strings.TrimPrefix(filepath.Base(filepath.Dir(m[0])), "python")
	}
	if !strings.HasPrefix(version, "3.") {
		return nil
	}
	pyV := "python" + version
	var dirs []string
	for _, d := range filepath.SplitList(env["PYTHONPATH"]) {
		if d != "" {
			dirs = append(dirs, d)
		}
	}
	prefix := base
	if venv != "" {
		prefix = venv
		dirs = append(dirs, filepath.Join(venv, "lib", pyV, "site-packages"), filepath.Join(venv, "lib64", pyV, "site-packages"))
	}
	if venv == "" || strings.EqualFold(venvCfg["include-system-site-packages"], "true") {
		if home := env["HOME"]; home != "" && env["PYTHONNOUSERSITE"] == "" {
			dirs = append(dirs, filepath.Join(home, ".local", "lib", pyV, "site-packages"))
		}
		dirs = append(dirs, filepath.Join(base, "lib", pyV, "site-packages"), filepath.Join(base, "lib64", pyV, "site-packages"))
		if base == "/usr" { // Debian and Ubuntu
			dirs = append(dirs, "/usr/local/lib/"+pyV+"/dist-packages", "/usr/lib/python3/dist-packages", "/usr/lib/"+pyV+"/dist-packages")
		}
	}
	p := &pythonProbe{Executable: python, Prefix: prefix}
	for _, d := range dirs {
		// ipykernel_launcher is the module the fallback kernel runs.
		if isFile(filepath.Join(d, "ipykernel", "__init__.py")) && isFile(filepath.Join(d, "ipykernel_launcher.py")) {
			p.IPyKernel = true
		}
		if isFile(filepath.Join(d, "bash_kernel", "__main__.py")) {
			p.BashKernel = true
		}
	}
	return p
}

// findVenv returns the venv python belongs to and its pyvenv.cfg, which
// python looks for beside its executable and one directory up.
func findVenv(python string) (string, map[string]string) {
	for _, dir := range []string{filepath.Dir(python), filepath.Dir(filepath.Dir(python))} {
		f, err := os.Open(filepath.Join(dir, "pyvenv.cfg"))
		if err != nil {
			continue
		}
		defer f.Close()
		cfg := map[string]string{}
		sc := bufio.NewScanner(io.LimitReader(f, 64<<10))
		for sc.Scan() {
			if k, v, ok := strings.Cut(sc.Text(), "="); ok {
				cfg[strings.ToLower(strings.TrimSpace(k))] = strings.TrimSpace(v)
			}
		}
		return dir, cfg
	}
	return "", nil
}

func isFile(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.Mode().IsRegular()
}

// probePython runs each candidate python (see pythonCandidates) to ask it
// for ipykernel. The first with ipykernel wins, else the first that ran;
// lookErr is the error when there was no candidate.
func probePython(ctx context.Context, host Host, cfg Config, env map[string]string, candidates []string, lookErr error) (*pythonProbe, error) {
	var first *pythonProbe
	var runErr error
	for _, python := range candidates {
		p, err := probeOne(ctx, host, cfg, env, python)
		switch {
		case err != nil:
			runErr = cmp.Or(runErr, err)
		case p.IPyKernel:
			return p, nil
		case first == nil:
			first = p
		}
	}
	if first != nil {
		return first, nil
	}
	return nil, cmp.Or(runErr, lookErr)
}

func probeOne(ctx context.Context, host Host, cfg Config, env map[string]string, python string) (*pythonProbe, error) {
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	defer r.Close()
	pid, exited, err := host.Spawn(cfg.User, []string{python, "-c", probeScript}, "/", envList(env), w)
	w.Close()
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	outc := make(chan []byte, 1)
	go func() {
		b, _ := io.ReadAll(io.LimitReader(r, 64<<10))
		outc <- b
	}()
	select {
	case ws := <-exited:
		out := <-outc
		if !ws.Exited() || ws.ExitStatus() != 0 {
			return nil, fmt.Errorf("%s: %s: %s", python, exitText(ws), bytes.TrimSpace(out))
		}
		var p pythonProbe
		// The last line: a sitecustomize may print before it.
		lines := bytes.Split(bytes.TrimSpace(out), []byte("\n"))
		if err := json.Unmarshal(lines[len(lines)-1], &p); err != nil || p.Executable == "" {
			return nil, fmt.Errorf("%s: unexpected probe output %q", python, out)
		}
		return &p, nil
	case <-ctx.Done():
		killGroup(pid)
		<-exited
		return nil, fmt.Errorf("%s: probe: %w", python, ctx.Err())
	}
}
