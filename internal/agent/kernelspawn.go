package agent

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"maps"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Service processes are what the agent's other in-sandbox servers (the code
// interpreter's Jupyter kernels) run. They are not process-service processes:
// an SDK's commands.list() never shows them. Like every child they are reaped
// through Agent.reaper, each runs in its own process group, and
// Agent.Shutdown terminates the groups still running. The methods below are
// the whole surface those servers see of the agent, so they never depend on
// its internals.

// Spawn starts argv[0] (a path, or a name looked up in env's PATH) with argv
// in dir with exactly env, stdin /dev/null and stdout+stderr on output (nil:
// /dev/null), in a new process group. user is a passwd name the process runs
// as when the agent is root; "" keeps the agent's identity. The returned
// channel receives the wait status once. On error nothing was started.
func (a *Agent) Spawn(user string, argv []string, dir string, env []string, output *os.File) (int, <-chan unix.WaitStatus, error) {
	if len(argv) == 0 {
		return 0, nil, fmt.Errorf("spawn: empty argv")
	}
	sys := &syscall.SysProcAttr{Setpgid: true}
	if user != "" && os.Geteuid() == 0 {
		u, err := a.lookupUser(user)
		if err != nil {
			return 0, nil, err
		}
		sys.Credential = &syscall.Credential{Uid: u.UID, Gid: u.GID, Groups: u.Groups}
	}
	path, err := lookPath(argv[0], env)
	if err != nil {
		return 0, nil, err
	}
	null, err := os.Open(os.DevNull)
	if err != nil {
		return 0, nil, err
	}
	defer null.Close()
	out := null
	if output != nil {
		out = output
	}
	attr := &syscall.ProcAttr{Dir: dir, Env: env, Files: []uintptr{null.Fd(), out.Fd(), out.Fd()}, Sys: sys}
	pid, waitc, err := a.reaper.spawn(func() (int, error) { return a.forkExec(path, argv, attr) })
	if err != nil {
		return 0, nil, fmt.Errorf("spawn %s: %w", argv[0], err)
	}
	done := make(chan struct{})
	a.services.add(pid, done)
	exited := make(chan unix.WaitStatus, 1)
	go func() {
		ws := <-waitc
		a.services.remove(pid)
		close(done)
		exited <- ws
	}()
	return pid, exited, nil
}

// runOutput runs argv to its end as a service process (Spawn: reaped by
// the agent's one reaper, in its own process group, with the agent's
// environment) and returns its stdout and stderr, at most limit bytes,
// and its wait status. When ctx ends first its group is killed and ctx's
// error comes back with what it printed. Nothing in the agent may wait
// for a child itself (exec.Cmd): the reaper would take its status first.
func (a *Agent) runOutput(ctx context.Context, argv []string, limit int64) ([]byte, unix.WaitStatus, error) {
	r, w, err := os.Pipe()
	if err != nil {
		return nil, 0, err
	}
	defer r.Close()
	pid, exited, err := a.Spawn("", argv, "", os.Environ(), w)
	w.Close()
	if err != nil {
		return nil, 0, err
	}
	outc := make(chan []byte, 1)
	go func() {
		var buf bytes.Buffer
		io.CopyN(&buf, r, limit)
		io.Copy(io.Discard, r)
		outc <- buf.Bytes()
	}()
	var ws unix.WaitStatus
	select {
	case ws = <-exited:
	case <-ctx.Done():
		unix.Kill(-pid, unix.SIGKILL)
		ws = <-exited
		err = ctx.Err()
	}
	// A grandchild may still hold the pipe: wait a second for it, as
	// exec.Cmd's WaitDelay would, then stop reading.
	select {
	case out := <-outc:
		return out, ws, err
	case <-time.After(time.Second):
		r.Close()
		return <-outc, ws, err
	}
}

// ProcessEnv is the environment a process started as user gets: the user's
// HOME, USER and LOGNAME and the default PATH, overlaid with the sandbox's
// env vars as they are now (POST /init may change them at any time). user ""
// is the agent's own identity.
func (a *Agent) ProcessEnv(user string) (map[string]string, error) {
	u, err := a.serviceUser(user)
	if err != nil {
		return nil, err
	}
	a.mu.RLock()
	vars := maps.Clone(a.envVars)
	a.mu.RUnlock()
	env := map[string]string{}
	for _, kv := range userEnv(u, vars, nil) {
		if k, v, ok := strings.Cut(kv, "="); ok {
			env[k] = v
		}
	}
	return env, nil
}

// AccessToken is the current envd access token ("" when none is set).
func (a *Agent) AccessToken() string { return a.currentToken() }

func (a *Agent) serviceUser(name string) (*sysUser, error) {
	if name != "" {
		return a.lookupUser(name)
	}
	uid := uint32(os.Geteuid())
	if u, err := a.lookupUID(uid); err == nil {
		return u, nil
	}
	// An identity without a passwd entry (a test runner's uid, say).
	u := &sysUser{Name: os.Getenv("USER"), UID: uid, GID: uint32(os.Getegid()), Home: os.Getenv("HOME")}
	if u.Name == "" {
		u.Name = strconv.FormatUint(uint64(uid), 10)
	}
	if u.Home == "" {
		u.Home = "/"
	}
	return u, nil
}

// serviceTable tracks running service processes for Shutdown.
type serviceTable struct {
	mu    sync.Mutex
	procs map[int]chan struct{}
}

func newServiceTable() *serviceTable { return &serviceTable{procs: map[int]chan struct{}{}} }

func (t *serviceTable) add(pid int, done chan struct{}) {
	t.mu.Lock()
	t.procs[pid] = done
	t.mu.Unlock()
}

func (t *serviceTable) remove(pid int) {
	t.mu.Lock()
	delete(t.procs, pid)
	t.mu.Unlock()
}

// terminateAll sends SIGTERM to every running group, then SIGKILL to those
// still running after terminateGrace, and waits (bounded) for them to end.
func (t *serviceTable) terminateAll() {
	t.mu.Lock()
	procs := maps.Clone(t.procs)
	t.mu.Unlock()
	for pid := range procs {
		signalGroup(pid, unix.SIGTERM)
	}
	deadline := time.After(terminateGrace)
	for pid, done := range procs {
		select {
		case <-done:
		case <-deadline:
			signalGroup(pid, unix.SIGKILL)
		}
	}
	for _, done := range procs {
		select {
		case <-done:
		case <-time.After(terminateGrace):
		}
	}
}
