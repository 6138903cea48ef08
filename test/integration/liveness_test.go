package integration

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/cubicle-dev/cubicle/sdk/go/envd/process"
	"github.com/cubicle-dev/cubicle/sdk/go/envd/process/processconnect"
)

var rfc3339 = regexp.MustCompile(`\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ`)

// waitEnded polls GET /sandboxes/{id} until it is a 404 and returns its
// message and how long that took; it fails after max.
func (s *server) waitEnded(t *testing.T, id string, max time.Duration) (string, time.Duration) {
	t.Helper()
	start := time.Now()
	for {
		var e struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
		}
		st := s.do("GET", "/sandboxes/"+id, nil, &e)
		if st == http.StatusNotFound {
			return e.Message, time.Since(start)
		}
		if time.Since(start) > max {
			t.Fatalf("sandbox %s still answers %d after %s; server logs:\n%s", id, st, max, s.logs)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// envdStatus sends GET /health to the sandbox's agent through the proxy with
// its access token and returns the status and message.
func (s *server) envdStatus(t *testing.T, c created) (int, string) {
	t.Helper()
	req, _ := http.NewRequest("GET", s.URL+"/health", nil)
	req.Header.Set("E2b-Sandbox-Id", c.SandboxID)
	req.Header.Set("E2b-Sandbox-Port", "49983")
	req.Header.Set("X-Access-Token", c.EnvdAccessToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var e struct{ Message string }
	json.Unmarshal(b, &e)
	return resp.StatusCode, e.Message
}

// startAsRoot starts cmdline in the sandbox as root and returns once it
// has started (it is not waited for).
func (s *server) startAsRoot(t *testing.T, c created, cmdline string) {
	t.Helper()
	pc := processconnect.NewProcessClient(s.envdClient(c), s.URL, connect.WithProtoJSON())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req := connect.NewRequest(&process.StartRequest{Process: &process.ProcessConfig{Cmd: "/bin/bash", Args: []string{"-c", cmdline}}})
	req.Header().Set("Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte("root:")))
	stream, err := pc.Start(ctx, req)
	if err != nil {
		t.Fatalf("start %q: %v", cmdline, err)
	}
	if !stream.Receive() {
		t.Fatalf("start %q: %v", cmdline, stream.Err())
	}
	stream.Close()
}

// A sandbox that dies behind the platform's back is reported dead within
// 2 s, and its 404 (and the proxy's 502 to a holder of its token) names how
// and when it ended; on both runtimes.
func TestDeadSandboxReportedPromptly(t *testing.T) {
	for _, rt := range []string{"runc", "runsc"} {
		t.Run(rt, func(t *testing.T) {
			if rt == "runsc" {
				requireRunsc(t)
			}
			s := startServer(t, "--runtime", rt)
			for i := 0; i < 2; i++ {
				c := s.create(map[string]any{"templateID": "base"})
				s.mustRun(c, "true")
				// The container's init, killed by the runtime with the server's own state root.
				if out, err := exec.Command(rt, "--root", s.stateRoot(), "kill", c.SandboxID, "KILL").CombinedOutput(); err != nil {
					t.Fatalf("%s kill: %v %s", rt, err, out)
				}
				msg, took := s.waitEnded(t, c.SandboxID, 2*time.Second)
				t.Logf("%s: dead sandbox reported after %s: %q", rt, took.Round(time.Millisecond), msg)
				if !strings.Contains(msg, c.SandboxID) || !strings.Contains(msg, "exited unexpectedly") || !rfc3339.MatchString(msg) {
					t.Fatalf("404 message does not name the end and its time: %q", msg)
				}
				if st, m := s.envdStatus(t, c); st != http.StatusBadGateway || !strings.Contains(m, "exited unexpectedly") {
					t.Fatalf("envd through the proxy after the death: %d %q", st, m)
				}
			}
			// A platform kill names its reason too.
			c := s.create(map[string]any{"templateID": "base"})
			if st := s.do("DELETE", "/sandboxes/"+c.SandboxID, nil, nil); st != http.StatusNoContent {
				t.Fatalf("kill: %d", st)
			}
			if msg, _ := s.waitEnded(t, c.SandboxID, time.Second); !strings.Contains(msg, "killed by request at ") {
				t.Fatalf("404 after a kill: %q", msg)
			}
			// Without the sandbox's token the proxy names nothing.
			noTok := c
			noTok.EnvdAccessToken = "nope"
			if st, m := s.envdStatus(t, noTok); st != http.StatusBadGateway || strings.Contains(m, "killed") {
				t.Fatalf("proxy without the token: %d %q", st, m)
			}
		})
	}
}

// A sandbox the OOM killer ends is reported dead with the reason. Under
// gVisor the host OOM killer takes the whole sandbox process (the cgroup's
// only big one) when the workload outgrows the sandbox's memory. Under runc
// the agent (PID 1) is protected and the workload starts at oom_score_adj
// 500, so a memory bomb kills the bomb, never the sandbox (the isolation
// tests check that it stays reachable): there is no OOM death to report.
func TestOOMKilledSandboxReason(t *testing.T) {
	requireRunsc(t)
	s := startServer(t, "--runtime", "runsc")
	c := s.create(map[string]any{"templateID": "base"})
	s.mustRun(c, "true")
	s.startAsRoot(t, c, "(head -c 4096m /dev/zero | tail) >/dev/null 2>&1 &")
	msg, took := s.waitEnded(t, c.SandboxID, 60*time.Second)
	t.Logf("runsc: OOM-killed sandbox reported %s after the bomb started: %q", took.Round(time.Millisecond), msg)
	if !strings.Contains(msg, "killed: out of memory at ") || !rfc3339.MatchString(msg) {
		t.Fatalf("404 message does not name the OOM kill: %q", msg)
	}
	if st, m := s.envdStatus(t, c); st != http.StatusBadGateway || !strings.Contains(m, "out of memory") {
		t.Fatalf("envd through the proxy after the OOM kill: %d %q", st, m)
	}
}
