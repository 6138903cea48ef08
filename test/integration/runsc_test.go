package integration

import (
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// The same lifecycle under gVisor: pause is a checkpoint to disk and resume a
// restore, so a process's memory (a shell variable) must survive it.
func TestRunscSandbox(t *testing.T) {
	if _, err := exec.LookPath("runsc"); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("runsc missing in CI: scripts/install must install it")
		}
		t.Skip("runsc not installed")
	}
	s := startServer(t, "--runtime", "runsc")
	c := s.create(map[string]any{"templateID": "base"})
	if out := s.mustRun(c, "id -u; dmesg 2>/dev/null | head -1 | grep -qi gvisor && echo gvisor || uname -r"); out == "" {
		t.Fatal("no output from runsc sandbox")
	}
	// A background loop keeps incrementing a counter held only in memory and
	// writes it out; after restore it must continue, not restart from 0.
	s.mustRun(c, "(i=0; while true; do i=$((i+1)); echo $i > /tmp/n.tmp && mv /tmp/n.tmp /tmp/n; sleep 0.1; done) >/dev/null 2>&1 &")
	s.mustRun(c, "sleep 0.5")
	before := s.mustRun(c, "cat /tmp/n")
	if st := s.do("POST", "/sandboxes/"+c.SandboxID+"/pause", map[string]any{}, nil); st != http.StatusNoContent {
		t.Fatalf("pause: %d", st)
	}
	var detail map[string]any
	s.do("GET", "/sandboxes/"+c.SandboxID, nil, &detail)
	if detail["state"] != "paused" {
		t.Fatalf("state: %v", detail["state"])
	}
	if st := s.do("POST", "/v2/sandboxes/"+c.SandboxID+"/connect", map[string]any{}, nil); st != http.StatusCreated {
		t.Fatalf("resume: %d", st)
	}
	out := s.mustRun(c, "a=$(cat /tmp/n); sleep 0.5; b=$(cat /tmp/n); echo $a $b")
	var a, b int
	if _, err := fmt.Sscan(out, &a, &b); err != nil || a < atoi(before) || b <= a {
		t.Fatalf("counter did not continue across checkpoint/restore: before %q after %q", before, out)
	}
	// gVisor strips the netns addresses on the host side; a restart must
	// still find the sandbox's address and re-adopt it.
	s.stop(syscall.SIGTERM)
	s.start()
	if out := s.mustRun(c, "echo readopted"); out != "readopted\n" {
		t.Fatalf("after restart: %q", out)
	}
	if st := s.do("DELETE", "/sandboxes/"+c.SandboxID, nil, nil); st != http.StatusNoContent {
		t.Fatalf("kill: %d", st)
	}
	if h := s.snapshot(t); h.netns != 0 || h.sandboxDirs != 0 || h.mounts != 0 {
		t.Fatalf("runsc sandbox left host state: %+v", h)
	}
}

func atoi(s string) int {
	n, _ := strconv.Atoi(strings.TrimSpace(s))
	return n
}
