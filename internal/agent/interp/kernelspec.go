package interp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// KernelSpec is a kernel the interpreter can start for a language.
type KernelSpec struct {
	Name     string // kernelspec directory name, or "fallback-<language>"
	Language string // normalized: python, bash, javascript, ...
	// Argv runs the kernel; "{connection_file}" and "{resource_dir}" are
	// substituted at start. Argv[0] is resolved to a path.
	Argv []string
	// ResourceDir is the kernelspec's directory ("" for a fallback).
	ResourceDir string
	// InterruptMode is "signal" (SIGINT to the kernel's process group) or
	// "message" (interrupt_request on the control channel).
	InterruptMode string
	// Env is the kernelspec's extra environment.
	Env map[string]string
	// IPython marks an ipykernel kernel, which gets IPython options and the
	// display formatters of pysetup.py.
	IPython bool
	// Deno marks Deno's built-in kernel (`deno jupyter --kernel`). It gets
	// denosetup.js, and its executions end with a fence (kernel.fence):
	// Deno publishes an execution's execute_result from an async task that
	// can lose the race with its own idle status.
	Deno bool
}

// Catalog maps a normalized language to the kernel that runs it.
type Catalog struct {
	specs map[string]*KernelSpec
}

// Languages lists the available languages, sorted.
func (c *Catalog) Languages() []string {
	out := make([]string, 0, len(c.specs))
	for l := range c.specs {
		out = append(out, l)
	}
	slices.Sort(out)
	return out
}

// Spec returns the kernel for a normalized language.
func (c *Catalog) Spec(language string) (*KernelSpec, bool) {
	s, ok := c.specs[language]
	return s, ok
}

// NormalizeLanguage maps a request's language to a catalog key as e2b
// does: lower case, trimmed, "" is python, js and ts are aliases.
func NormalizeLanguage(l string) string {
	l = strings.ToLower(strings.TrimSpace(l))
	switch l {
	case "":
		return "python"
	case "js":
		return "javascript"
	case "ts":
		return "typescript"
	}
	return l
}

// Discover finds the kernels this sandbox can run. Kernelspecs (kernel.json)
// are read from, in Jupyter's order of precedence: $JUPYTER_PATH/kernels,
// ~/.local/share/jupyter/kernels of the kernel user, <python sys.prefix>/
// share/jupyter/kernels, /usr/local/share/jupyter/kernels and
// /usr/share/jupyter/kernels (cfg.KernelSpecDirs replaces the list). Without
// a python kernelspec, python runs "python3 -m ipykernel_launcher" when
// ipykernel is importable; without a bash one, bash runs "python3 -m
// bash_kernel" when bash_kernel is. Whether python has them is read from
// its package directories (findPython); python is run to ask only where
// they do not tell. ErrNoKernels means python cannot run.
func Discover(ctx context.Context, host Host, cfg Config) (*Catalog, error) {
	cfg = cfg.withDefaults()
	env, err := host.ProcessEnv(cfg.User)
	if err != nil {
		return nil, err
	}
	candidates, lookErr := pythonCandidates(cfg, env)
	probe := findPython(candidates, env)
	if probe == nil {
		var perr error
		if probe, perr = probePython(ctx, host, cfg, env, candidates, lookErr); perr != nil {
			cfg.Logger.Info("code interpreter: python probe failed", "python", cfg.Python, "err", perr)
		}
	}
	dirs := cfg.KernelSpecDirs
	if dirs == nil {
		dirs = kernelSpecDirs(env, probe)
	}
	cat := &Catalog{specs: map[string]*KernelSpec{}}
	for _, s := range readKernelSpecs(dirs) {
		if _, taken := cat.specs[s.Language]; taken {
			continue
		}
		if resolveArgv0(s, env, probe) {
			cat.specs[s.Language] = s
		}
	}
	if probe != nil {
		if _, ok := cat.specs["python"]; !ok && probe.IPyKernel {
			cat.specs["python"] = &KernelSpec{Name: "fallback-python", Language: "python", InterruptMode: "signal", IPython: true,
				Argv: []string{probe.Executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"}}
		}
		if _, ok := cat.specs["bash"]; !ok && probe.BashKernel {
			if _, err := lookPath("bash", env["PATH"]); err == nil {
				cat.specs["bash"] = &KernelSpec{Name: "fallback-bash", Language: "bash", InterruptMode: "signal",
					Argv: []string{probe.Executable, "-m", "bash_kernel", "-f", "{connection_file}"}}
			}
		}
	}
	// e2b runs typescript on its javascript kernel; a Deno kernel
	// (language typescript) runs javascript as well.
	if s, ok := cat.specs["javascript"]; ok && cat.specs["typescript"] == nil {
		cat.specs["typescript"] = s
	}
	if s, ok := cat.specs["typescript"]; ok && cat.specs["javascript"] == nil {
		cat.specs["javascript"] = s
	}
	if _, ok := cat.specs["python"]; !ok {
		return cat, ErrNoKernels
	}
	return cat, nil
}

func kernelSpecDirs(env map[string]string, probe *pythonProbe) []string {
	var dirs []string
	for _, d := range filepath.SplitList(env["JUPYTER_PATH"]) {
		if d != "" {
			dirs = append(dirs, filepath.Join(d, "kernels"))
		}
	}
	if home := env["HOME"]; home != "" {
		dirs = append(dirs, filepath.Join(home, ".local", "share", "jupyter", "kernels"))
	}
	if probe != nil && probe.Prefix != "" {
		dirs = append(dirs, filepath.Join(probe.Prefix, "share", "jupyter", "kernels"))
	}
	dirs = append(dirs, "/usr/local/share/jupyter/kernels", "/usr/share/jupyter/kernels")
	var out []string
	for _, d := range dirs {
		if !slices.Contains(out, d) {
			out = append(out, d)
		}
	}
	return out
}

// kernelJSON is the part of a kernelspec's kernel.json the interpreter uses.
type kernelJSON struct {
	Argv          []string          `json:"argv"`
	Language      string            `json:"language"`
	InterruptMode string            `json:"interrupt_mode"`
	Env           map[string]string `json:"env"`
}

// readKernelSpecs returns the valid kernelspecs in dirs, in precedence
// order (dirs order, then name); a name seen earlier shadows later ones.
func readKernelSpecs(dirs []string) []*KernelSpec {
	seen := map[string]bool{}
	var out []*KernelSpec
	for _, dir := range dirs {
		entries, err := os.ReadDir(dir)
		if err != nil {
			continue
		}
		for _, e := range entries {
			name := e.Name()
			if seen[name] {
				continue
			}
			s, err := readKernelSpec(filepath.Join(dir, name), name)
			if err != nil {
				continue
			}
			seen[name] = true
			out = append(out, s)
		}
	}
	return out
}

func readKernelSpec(dir, name string) (*KernelSpec, error) {
	b, err := os.ReadFile(filepath.Join(dir, "kernel.json"))
	if err != nil {
		return nil, err
	}
	var kj kernelJSON
	if err := json.Unmarshal(b, &kj); err != nil {
		return nil, err
	}
	if len(kj.Argv) == 0 || kj.Language == "" || !slices.ContainsFunc(kj.Argv, func(a string) bool { return strings.Contains(a, "{connection_file}") }) {
		return nil, errors.New("incomplete kernelspec")
	}
	mode := kj.InterruptMode
	if mode != "message" {
		mode = "signal"
	}
	return &KernelSpec{
		Name:          name,
		Language:      NormalizeLanguage(kj.Language),
		Argv:          kj.Argv,
		ResourceDir:   dir,
		InterruptMode: mode,
		Env:           kj.Env,
		IPython:       slices.ContainsFunc(kj.Argv, func(a string) bool { return strings.HasPrefix(a, "ipykernel") }),
		Deno:          filepath.Base(kj.Argv[0]) == "deno" && slices.Contains(kj.Argv, "jupyter"),
	}, nil
}

// resolveArgv0 makes s.Argv[0] a path, reporting whether it exists. A bare
// "python"/"python3" means the python that owns the kernelspec, as for
// jupyter_client; that is the probed one.
func resolveArgv0(s *KernelSpec, env map[string]string, probe *pythonProbe) bool {
	argv0 := s.Argv[0]
	if !strings.Contains(argv0, "/") && strings.HasPrefix(argv0, "python") && probe != nil {
		s.Argv = append([]string{probe.Executable}, s.Argv[1:]...)
		return true
	}
	p, err := lookPath(argv0, env["PATH"])
	if err != nil {
		return false
	}
	s.Argv = append([]string{p}, s.Argv[1:]...)
	return true
}

// lookPath resolves cmd against path as a shell would.
func lookPath(cmd, path string) (string, error) {
	if strings.Contains(cmd, "/") {
		if isExecutable(cmd) {
			return cmd, nil
		}
		return "", fmt.Errorf("%s is not an executable file", cmd)
	}
	for _, dir := range filepath.SplitList(path) {
		if dir == "" {
			continue
		}
		if p := filepath.Join(dir, cmd); isExecutable(p) {
			return p, nil
		}
	}
	return "", fmt.Errorf("%q not found in PATH", cmd)
}

func isExecutable(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0
}

func envList(env map[string]string) []string {
	out := make([]string, 0, len(env))
	for k, v := range env {
		out = append(out, k+"="+v)
	}
	slices.Sort(out)
	return out
}
