package agent

import (
	"fmt"
	"os"
	"strconv"
	"syscall"
)

// workloadOOMScoreAdj is every sandbox process's OOM score adjustment; the
// agent (PID 1) stays at 0. When a memory bomb fills the sandbox's memory
// cgroup, the OOM killer then picks the workload's processes and never the
// agent, so the sandbox stays reachable. Raising a process's adjustment
// needs no privilege; lowering it below 0 needs CAP_SYS_RESOURCE, which no
// sandbox process has (and these hosts' root lacks too, so the agent cannot
// be given -1000 instead).
const workloadOOMScoreAdj = "500"

// forkExec starts path with argv like syscall.ForkExec and raises the new
// process's oom_score_adj as soon as it returns, i.e. right after the exec.
// A program that forks within those microseconds leaves children at 0,
// level with the agent: that harms only its own sandbox, and no ordinary
// workload forks before its runtime has started. (A trampoline that raised
// its own score before exec'ing the program would close that window, but a
// Go trampoline needs several threads and fails when a fork storm has taken
// the pids limit, where a plain exec still works.)
func (a *Agent) forkExec(path string, argv []string, attr *syscall.ProcAttr) (int, error) {
	pid, err := syscall.ForkExec(path, argv, attr)
	if err != nil {
		return 0, err
	}
	if err := os.WriteFile("/proc/"+strconv.Itoa(pid)+"/oom_score_adj", []byte(workloadOOMScoreAdj), 0); err != nil {
		// The process may already have exited (ESRCH/ENOENT): nothing left
		// to protect the agent from.
		if _, serr := os.Stat("/proc/" + strconv.Itoa(pid)); serr == nil {
			a.log.Warn("cannot raise a process's OOM score", "pid", pid, "err", fmt.Sprint(err))
		}
	}
	return pid, nil
}
