package main

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// The agent holds the sandbox's access token and is PID 1. Non-dumpable,
// its memory (/proc/1/mem), environ and fds cannot be read and it cannot
// be ptrace-attached by sandbox processes: they lack CAP_SYS_PTRACE, which
// a non-dumpable target demands even from the same uid. Set in an init
// function, before main reads the token. execve resets the flag, so the
// workload the agent starts stays dumpable (gdb, strace work on it).
func init() {
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		fmt.Fprintln(os.Stderr, "cubicle-agent: PR_SET_DUMPABLE:", err)
		os.Exit(1)
	}
}
