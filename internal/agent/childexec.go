package agent

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// Sandbox processes are started through the agent's own binary, re-executed
// as a trampoline (argv[0] = childExecArg0) that raises its oom_score_adj to
// workloadOOMScoreAdj and then execs the real program, in the same process,
// before any of the workload's code runs. When a fork storm or memory bomb
// fills the sandbox's memory cgroup, the OOM killer then picks the
// workload's processes and never the agent (PID 1, adj 0), so the sandbox
// stays reachable. Raising one's own oom_score_adj needs no privilege;
// lowering it below 0 needs CAP_SYS_RESOURCE, which no sandbox process has,
// so only a process that deliberately lowers itself back to 0 can compete
// with the agent, and that harms only its own sandbox.
const childExecArg0 = "cubicle-exec"

// workloadOOMScoreAdj is every sandbox process's OOM score adjustment.
const workloadOOMScoreAdj = "500"

// childErrFD is the trampoline's error pipe: the errno of a failed exec is
// written there; a successful exec closes it (close-on-exec).
const childErrFD = 3

// IsChildExec reports whether this process was started as the trampoline.
// The agent's main (and test binaries that run an agent) call it first.
func IsChildExec() bool { return len(os.Args) >= 3 && os.Args[0] == childExecArg0 }

// RunChildExec is the trampoline: os.Args = [childExecArg0, path, argv...].
// It never returns.
func RunChildExec() {
	fail := func(err error) {
		var errno syscall.Errno
		if !errors.As(err, &errno) {
			errno = syscall.EINVAL
		}
		var b [4]byte
		binary.LittleEndian.PutUint32(b[:], uint32(errno))
		_, _ = unix.Write(childErrFD, b[:])
		os.Exit(127)
	}
	unix.CloseOnExec(childErrFD)
	if err := os.WriteFile("/proc/self/oom_score_adj", []byte(workloadOOMScoreAdj), 0); err != nil {
		fail(err)
	}
	fail(syscall.Exec(os.Args[1], os.Args[2:], os.Environ()))
}

// forkExec starts path with argv like syscall.ForkExec, through the
// trampoline. attr.Files must be the child's fds 0..2. It returns once the
// program is executing, or with the exec error (the trampoline reaped).
func (a *Agent) forkExec(path string, argv []string, attr *syscall.ProcAttr) (int, error) {
	if a.selfErr != nil {
		return 0, fmt.Errorf("locate the agent binary: %w", a.selfErr)
	}
	if len(attr.Files) != childErrFD {
		return 0, fmt.Errorf("forkExec: %d files, want %d", len(attr.Files), childErrFD)
	}
	r, w, err := os.Pipe()
	if err != nil {
		return 0, err
	}
	defer r.Close()
	at := *attr
	at.Files = append(append([]uintptr(nil), attr.Files...), w.Fd())
	pid, err := syscall.ForkExec(a.selfExe, append([]string{childExecArg0, path}, argv...), &at)
	w.Close()
	if err != nil {
		return 0, err
	}
	var b [4]byte
	if n, _ := io.ReadFull(r, b[:]); n == len(b) {
		// The trampoline exits right after reporting; a reap-all agent's
		// loop may take the status first, so ECHILD is fine here.
		var ws unix.WaitStatus
		_, _ = unix.Wait4(pid, &ws, 0, nil)
		return 0, syscall.Errno(binary.LittleEndian.Uint32(b[:]))
	}
	return pid, nil
}
