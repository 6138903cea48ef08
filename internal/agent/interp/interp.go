// Package interp is the sandbox's e2b-compatible code interpreter: the HTTP
// API of e2b's code-interpreter server (port 49999: /execute, /contexts,
// /health), served from inside cubicle-agent. It speaks the Jupyter
// messaging protocol directly to the kernels it starts (package jupyter);
// there is no Jupyter Server process. A context is one kernel process with
// a language and a working directory; executions on a context run one at a
// time, in arrival order, and stream their output as newline-delimited JSON.
// In the agent a Service serves it from the agent's start: requests wait
// while kernels are discovered, and the port is freed where none can run.
package interp

import (
	"errors"
	"log/slog"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// Port is the e2b code interpreter's well-known port.
const Port = 49999

// Host is what the interpreter needs from the agent it runs in; *agent.Agent
// implements it. The interpreter never reaches into the agent otherwise.
type Host interface {
	// Spawn starts argv in dir with exactly env, stdin /dev/null and
	// stdout+stderr on output (nil: /dev/null), in its own process group,
	// as user ("" keeps the host's identity). The channel receives the
	// wait status once; the host reaps the process. On error nothing runs.
	Spawn(user string, argv []string, dir string, env []string, output *os.File) (pid int, exited <-chan unix.WaitStatus, err error)
	// ProcessEnv is the environment a process started as user gets now:
	// identity and PATH defaults overlaid with the sandbox's env vars,
	// which may change at any time.
	ProcessEnv(user string) (map[string]string, error)
	// AccessToken is the sandbox's current access token ("" when none).
	AccessToken() string
}

// Errors of the interpreter's operations; the HTTP layer maps them to
// statuses.
var (
	ErrNoKernels       = errors.New("interp: no Jupyter kernel can run in this sandbox")
	ErrContextNotFound = errors.New("interp: context not found")
	ErrUnknownLanguage = errors.New("interp: unknown language")
	ErrTooManyContexts = errors.New("interp: too many contexts")
	ErrInvalidCwd      = errors.New("interp: cwd is not a directory")
	ErrKernelStart     = errors.New("interp: kernel failed to start")
	ErrKernelDied      = errors.New("interp: kernel died")
	ErrContextRemoved  = errors.New("interp: context was removed")
	ErrSilentRunFailed = errors.New("interp: helper code failed in the kernel")
)

// Config configures a Server. The zero value is usable.
type Config struct {
	// User the kernels run as; "" keeps the agent's identity. The agent
	// passes "root": e2b's Jupyter runs its kernels as root, and user code
	// written for e2b (pip install into the system, apt) expects it.
	User string
	// Python is the interpreter that is probed for ipykernel and runs the
	// fallback kernels (default "python3", looked up on the kernels' PATH).
	Python string
	// KernelSpecDirs replaces the kernelspec search path (see Discover).
	KernelSpecDirs []string
	// RuntimeDir holds the kernels' connection files (default
	// /run/cubicle-kernels, or /tmp/.cubicle-kernels where /run is absent).
	RuntimeDir string
	// DefaultCwd is a context's directory when none is given (default
	// /home/user, e2b's).
	DefaultCwd string
	// MaxContexts caps live contexts (default 32): each is a kernel
	// process of tens of MiB.
	MaxContexts int
	// StartTimeout bounds a kernel's start (default 60s).
	StartTimeout time.Duration
	// DiscoveryWait bounds how long a request to a Service waits for kernel
	// discovery to end (default 30s); it then gets 503.
	DiscoveryWait time.Duration
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

func (c Config) withDefaults() Config {
	if c.Python == "" {
		c.Python = "python3"
	}
	if c.DefaultCwd == "" {
		c.DefaultCwd = "/home/user"
	}
	if c.MaxContexts <= 0 {
		c.MaxContexts = 32
	}
	if c.StartTimeout <= 0 {
		c.StartTimeout = 60 * time.Second
	}
	if c.DiscoveryWait <= 0 {
		c.DiscoveryWait = 30 * time.Second
	}
	if c.RuntimeDir == "" {
		c.RuntimeDir = "/run/cubicle-kernels"
		if _, err := os.Stat("/run"); err != nil {
			c.RuntimeDir = "/tmp/.cubicle-kernels"
		}
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}
