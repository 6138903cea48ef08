package interp

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cubicle-dev/cubicle/internal/agent/interp/jupyter"
)

// ipythonArgs turn off ANSI colours in tracebacks (the SDKs show them as
// text) and stop IPython from truncating long sequences in text/plain, as
// e2b's kernel config does. IPython 7 and 8 take the scheme name
// case-insensitively, 9 only in lower case.
var ipythonArgs = []string{"--InteractiveShell.colors=nocolor", "--PlainTextFormatter.max_seq_length=0"}

// kernel is one running kernel process and the client connected to it.
type kernel struct {
	spec   *KernelSpec
	pid    int
	client *jupyter.Client
	log    *outputTail

	done   chan struct{} // closed once the process was reaped
	status string        // how it ended; set before done is closed

	// env is the environment the kernel's code sees: what it was started
	// with plus the sandbox env changes applied since. Only the context's
	// execution (which holds its turn) reads or writes it.
	env map[string]string
}

// startKernel starts spec's kernel in cwd and returns it connected and
// ready. On error nothing is left running. A kernel that exits while
// starting is tried once more: its ports are picked free but bound only
// later, so another process can take one in between (the kernel then fails
// with "address already in use").
func (s *Server) startKernel(ctx context.Context, spec *KernelSpec, cwd string) (*kernel, error) {
	k, exited, err := s.startKernelOnce(ctx, spec, cwd)
	if err != nil && exited && ctx.Err() == nil {
		s.log.Warn("code interpreter: kernel exited while starting; retrying", "kernel", spec.Name, "err", err)
		k, _, err = s.startKernelOnce(ctx, spec, cwd)
	}
	return k, err
}

// startKernelOnce is one start attempt; exited reports a kernel process
// that ended by itself before it was ready.
func (s *Server) startKernelOnce(ctx context.Context, spec *KernelSpec, cwd string) (_ *kernel, exited bool, _ error) {
	env, err := s.host.ProcessEnv(s.cfg.User)
	if err != nil {
		return nil, false, err
	}
	maps.Copy(env, spec.Env)
	info, err := jupyter.NewConnectionInfo("127.0.0.1")
	if err != nil {
		return nil, false, err
	}
	info.KernelName = spec.Name
	if err := ensurePrivateDir(s.cfg.RuntimeDir); err != nil {
		return nil, false, err
	}
	connFile := filepath.Join(s.cfg.RuntimeDir, "kernel-"+jupyter.NewID()+".json")
	if err := info.WriteFile(connFile); err != nil {
		return nil, false, err
	}
	argv := make([]string, 0, len(spec.Argv)+len(ipythonArgs))
	for _, a := range spec.Argv {
		a = strings.ReplaceAll(a, "{connection_file}", connFile)
		argv = append(argv, strings.ReplaceAll(a, "{resource_dir}", spec.ResourceDir))
	}
	if spec.IPython {
		argv = append(argv, ipythonArgs...)
	}
	r, w, err := os.Pipe()
	if err != nil {
		os.Remove(connFile)
		return nil, false, err
	}
	pid, waitc, err := s.host.Spawn(s.cfg.User, argv, cwd, envList(env), w)
	w.Close()
	if err != nil {
		r.Close()
		os.Remove(connFile)
		return nil, false, fmt.Errorf("%w: %s: %v", ErrKernelStart, spec.Name, err)
	}
	k := &kernel{spec: spec, pid: pid, log: newOutputTail(r), done: make(chan struct{}), env: env}
	go func() {
		ws := <-waitc
		// Whatever the kernel left in its group (a subprocess of user
		// code) goes with it, as when Jupyter kills a kernel.
		_ = unix.Kill(-pid, unix.SIGKILL)
		os.Remove(connFile)
		k.status = exitText(ws)
		close(k.done)
	}()

	start := time.Now()
	sctx, cancel := context.WithTimeout(ctx, s.cfg.StartTimeout)
	defer cancel()
	go func() {
		select {
		case <-k.done:
			cancel()
		case <-sctx.Done():
		}
	}()
	fail := func(err error) (*kernel, bool, error) {
		died := !k.alive()
		k.kill()
		if k.client != nil {
			k.client.Close()
		}
		<-k.done
		if died {
			return nil, true, fmt.Errorf("%w: %s %s: %v%s", ErrKernelStart, spec.Name, k.status, err, k.log.suffix())
		}
		return nil, false, fmt.Errorf("%w: %s: %v%s", ErrKernelStart, spec.Name, err, k.log.suffix())
	}
	if k.client, err = jupyter.Dial(sctx, info); err != nil {
		return fail(err)
	}
	if err := k.client.WaitReady(sctx); err != nil {
		return fail(err)
	}
	if spec.Language == "python" {
		if err := k.runSilent(sctx, pythonSetup); err != nil {
			// The kernel works without e2b's formatters; say so and go on.
			s.log.Warn("code interpreter: python setup failed", "kernel", spec.Name, "err", err)
		}
	}
	if spec.Deno {
		if err := k.runSilent(sctx, denoSetup); err != nil {
			s.log.Warn("code interpreter: deno setup failed", "kernel", spec.Name, "err", err)
		}
	}
	s.log.Info("code interpreter: kernel started", "kernel", spec.Name, "pid", pid, "cwd", cwd, "took", time.Since(start).Round(time.Millisecond))
	return k, false, nil
}

// ensurePrivateDir creates dir 0700 (a root-only directory when the agent is
// root: connection files hold the kernels' keys).
func ensurePrivateDir(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	return os.Chmod(dir, 0o700)
}

func (k *kernel) alive() bool {
	select {
	case <-k.done:
		return false
	default:
		return true
	}
}

// interrupt asks the kernel to stop what it is running, the way its
// kernelspec says.
func (k *kernel) interrupt() {
	if k.spec.InterruptMode == "message" {
		if sub, err := k.client.Request(jupyter.Control, "interrupt_request", struct{}{}); err == nil {
			sub.Close()
		}
		return
	}
	_ = unix.Kill(-k.pid, unix.SIGINT)
}

func (k *kernel) kill() { killGroup(k.pid) }

func killGroup(pid int) {
	_ = unix.Kill(-pid, unix.SIGKILL)
	_ = unix.Kill(pid, unix.SIGKILL)
}

// stop ends the kernel: a shutdown_request first, so it can clean up, then
// SIGKILL to its group if it has not exited within a second. It returns once
// the process is gone (bounded).
func (k *kernel) stop() {
	if k.alive() {
		if sub, err := k.client.Request(jupyter.Control, "shutdown_request", map[string]bool{"restart": false}); err == nil {
			sub.Close()
		}
		select {
		case <-k.done:
		case <-time.After(time.Second):
			k.kill()
		}
	}
	select {
	case <-k.done:
	case <-time.After(10 * time.Second):
	}
	k.client.Close()
}

// exitText says how a process ended, for people.
func exitText(ws unix.WaitStatus) string {
	switch {
	case ws.Exited():
		return "exited with code " + strconv.Itoa(ws.ExitStatus())
	case ws.Signaled():
		sig := ws.Signal()
		text := "was killed by signal " + strconv.Itoa(int(sig))
		if name := unix.SignalName(sig); name != "" {
			text += " (" + name + ")"
		}
		return text
	}
	return "ended"
}

// outputTail keeps the last bytes a kernel wrote to stdout/stderr, which
// explain a kernel that fails to start.
type outputTail struct {
	mu  sync.Mutex
	buf []byte
	eof chan struct{} // closed once the pipe is drained
}

const outputTailSize = 2048

func newOutputTail(r *os.File) *outputTail {
	t := &outputTail{eof: make(chan struct{})}
	go func() {
		defer close(t.eof)
		defer r.Close()
		b := make([]byte, 4096)
		for {
			n, err := r.Read(b)
			t.mu.Lock()
			t.buf = append(t.buf, b[:n]...)
			if len(t.buf) > outputTailSize {
				t.buf = append(t.buf[:0], t.buf[len(t.buf)-outputTailSize:]...)
			}
			t.mu.Unlock()
			if err != nil {
				return
			}
		}
	}()
	return t
}

// suffix is the tail for an error message. It is asked for once the kernel
// has ended, so it first waits (bounded) for the pipe to be drained: the
// process's exit can be seen before its last output is read.
func (t *outputTail) suffix() string {
	select {
	case <-t.eof:
	case <-time.After(2 * time.Second):
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if s := strings.TrimSpace(string(t.buf)); s != "" {
		return "; kernel output: " + s
	}
	return ""
}
