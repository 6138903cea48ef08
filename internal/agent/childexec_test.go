package agent

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// A sandbox process starts with oom_score_adj 500 (the OOM killer takes it
// before the agent) and the agent's own adjustment is unchanged.
func TestChildOOMScoreAdj(t *testing.T) {
	a := New(Config{})
	before, _ := os.ReadFile("/proc/self/oom_score_adj")
	out := filepath.Join(t.TempDir(), "adj")
	f, err := os.Create(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	null, _ := os.Open(os.DevNull)
	defer null.Close()
	pid, err := a.forkExec("/bin/sh", []string{"sh", "-c", "cat /proc/self/oom_score_adj; echo -1 > /proc/self/oom_score_adj && echo lowered"},
		&syscall.ProcAttr{Env: []string{"PATH=/bin:/usr/bin"}, Files: []uintptr{null.Fd(), f.Fd(), null.Fd()}})
	if err != nil {
		t.Fatal(err)
	}
	var ws unix.WaitStatus
	if _, err := unix.Wait4(pid, &ws, 0, nil); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(out)
	lines := strings.Fields(string(b))
	if len(lines) == 0 || lines[0] != workloadOOMScoreAdj {
		t.Fatalf("child oom_score_adj output %q, want %s first", b, workloadOOMScoreAdj)
	}
	if os.Geteuid() == 0 && !hasCapSysResource() && strings.Contains(string(b), "lowered") {
		t.Errorf("child lowered its oom_score_adj below the workload value without CAP_SYS_RESOURCE")
	}
	if after, _ := os.ReadFile("/proc/self/oom_score_adj"); string(after) != string(before) {
		t.Errorf("agent's oom_score_adj changed: %q -> %q", before, after)
	}
}

func hasCapSysResource() bool {
	b, _ := os.ReadFile("/proc/self/status")
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "CapEff:"); ok {
			n, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			return err == nil && n&(1<<unix.CAP_SYS_RESOURCE) != 0
		}
	}
	return false
}
