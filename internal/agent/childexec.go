package agent

import (
	"os"
	"strings"
	"sync"
	"syscall"
)

// workloadOOMScoreAdj is every sandbox process's OOM score adjustment; the
// agent (PID 1) stays at its own (0). When a memory bomb fills the sandbox's
// memory cgroup, the OOM killer then picks the workload's processes and
// never the agent, so the sandbox stays reachable. Raising a process's
// adjustment needs no privilege; lowering it below the minimum it inherited
// (0) needs CAP_SYS_RESOURCE, which no sandbox process has (and these
// hosts' root lacks too, so the agent cannot be given -1000 instead).
const workloadOOMScoreAdj = "500"

const ownOOMScoreAdj = "/proc/self/oom_score_adj"

// spawnMu serialises forkExec: the agent's own score is raised across one
// fork at a time.
var spawnMu sync.Mutex

// forkExec starts path with argv like syscall.ForkExec. The child must be
// at workloadOOMScoreAdj before any of its code runs (a fork storm's first
// forks come within microseconds, and under load the parent's write after
// the exec came too late in tests), so the agent raises its own score for
// the fork, which the child inherits, and lowers it back at once; lowering
// to the score it started with is allowed, as it is not below its minimum.
// Only during that fork is the agent at the workload's level, where the
// largest process still goes first.
func (a *Agent) forkExec(path string, argv []string, attr *syscall.ProcAttr) (int, error) {
	spawnMu.Lock()
	defer spawnMu.Unlock()
	own, err := os.ReadFile(ownOOMScoreAdj)
	if err == nil {
		err = os.WriteFile(ownOOMScoreAdj, []byte(workloadOOMScoreAdj), 0)
	}
	if err != nil {
		a.log.Warn("cannot raise sandbox processes' OOM score", "err", err)
	} else {
		defer func() {
			if err := os.WriteFile(ownOOMScoreAdj, []byte(strings.TrimSpace(string(own))), 0); err != nil {
				a.log.Error("cannot restore the agent's OOM score", "err", err)
			}
		}()
	}
	return syscall.ForkExec(path, argv, attr)
}
