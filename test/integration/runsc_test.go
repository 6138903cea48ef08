package integration

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/runtime/runtimetest"
	"github.com/cubicle-dev/cubicle/internal/testenv"
)

// The same lifecycle under gVisor: pause is a checkpoint to disk and resume a
// restore, so a process's memory (a shell variable) must survive it.
func TestRunscSandbox(t *testing.T) {
	testenv.LookPath(t, "runsc")
	s := startServer(t, "--runtime", "runsc")
	c := s.create(map[string]any{"templateID": "base"})
	if out := s.mustRun(c, "id -u; dmesg 2>/dev/null | head -1 | grep -qi gvisor && echo gvisor || uname -r"); out == "" {
		t.Fatal("no output from runsc sandbox")
	}
	// serve's default (--userns auto): gVisor's sentry runs as the sandbox's
	// unprivileged host uid, not host root.
	sentry, _ := runtimetest.RunscProcs(t, c.SandboxID)
	if len(sentry) == 0 {
		t.Fatal("no runsc sentry (runsc-sandbox ... boot) found for the sandbox")
	}
	for _, pid := range sentry {
		if uid, _ := runtimetest.ProcIDs(t, pid); uid == "0" {
			t.Errorf("sentry %d runs as host root", pid)
		}
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

func requireRunsc(t *testing.T) {
	t.Helper()
	testenv.LookPath(t, "runsc")
}

// The first command in a fresh sandbox must work, on every sandbox, on both
// runtimes. Sandboxes reuse the lowest free address (and its derived MAC),
// so a keep-alive connection the proxy (or node) still holds to a killed
// sandbox at the same address must never carry the next sandbox's first
// request: gVisor dies without sending FIN, so on runsc that connection
// stays ESTABLISHED on the host and the new netstack answers it with RST.
func TestFirstCommandEverySandbox(t *testing.T) {
	for _, rt := range []string{"runc", "runsc"} {
		t.Run(rt, func(t *testing.T) {
			if rt == "runsc" {
				requireRunsc(t)
			}
			s := startServer(t, "--runtime", rt)
			const rounds = 6
			var failed []string
			start := time.Now()
			for i := 0; i < rounds; i++ {
				c := s.create(map[string]any{"templateID": "base"})
				if _, errOut, code, err := s.run(c, "true"); err != nil || code != 0 {
					failed = append(failed, fmt.Sprintf("round %d: code %d err %v stderr %q", i, code, err, errOut))
				}
				if st := s.do("DELETE", "/sandboxes/"+c.SandboxID, nil, nil); st != http.StatusNoContent {
					t.Fatalf("kill: %d", st)
				}
			}
			t.Logf("%s: %d create/run/kill rounds in %s", rt, rounds, time.Since(start).Round(time.Millisecond))
			// A runsc pause is a checkpoint: the restored netstack does not
			// know the host's connections from before either.
			c := s.create(map[string]any{"templateID": "base"})
			s.mustRun(c, "true")
			start = time.Now()
			for i := 0; i < 3; i++ {
				if st := s.do("POST", "/sandboxes/"+c.SandboxID+"/pause", map[string]any{}, nil); st != http.StatusNoContent {
					t.Fatalf("pause: %d", st)
				}
				if st := s.do("POST", "/v2/sandboxes/"+c.SandboxID+"/connect", map[string]any{}, nil); st != http.StatusCreated {
					t.Fatalf("resume: %d", st)
				}
				if _, errOut, code, err := s.run(c, "true"); err != nil || code != 0 {
					failed = append(failed, fmt.Sprintf("after resume %d: code %d err %v stderr %q", i, code, err, errOut))
				}
			}
			t.Logf("%s: 3 pause/resume/run rounds in %s", rt, time.Since(start).Round(time.Millisecond))
			if len(failed) > 0 {
				t.Fatalf("%d first commands failed:\n%s\nserver logs:\n%s", len(failed), strings.Join(failed, "\n"), s.logs)
			}
		})
	}
}
