package agent

import (
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func TestSpawnRunsAsUserWithEnvAndOutput(t *testing.T) {
	e := newTestEnv(t, testToken)
	e.a.mu.Lock()
	e.a.envVars["SANDBOX_VAR"] = "from-init"
	e.a.mu.Unlock()

	env, err := e.a.ProcessEnv("user")
	if err != nil {
		t.Fatal(err)
	}
	if env["SANDBOX_VAR"] != "from-init" || env["HOME"] != e.userHome || env["PATH"] == "" {
		t.Fatalf("ProcessEnv = %v", env)
	}
	var list []string
	for k, v := range env {
		list = append(list, k+"="+v)
	}
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	_, exited, err := e.a.Spawn("user", []string{"sh", "-c", `echo "$(id -u) $SANDBOX_VAR $(pwd)"; exit 3`}, e.userHome, list, w)
	w.Close()
	if err != nil {
		t.Fatal(err)
	}
	out, _ := io.ReadAll(r)
	r.Close()
	ws := <-exited
	if got, want := strings.TrimSpace(string(out)), "1000 from-init "+e.userHome; got != want {
		t.Fatalf("output %q, want %q", got, want)
	}
	if !ws.Exited() || ws.ExitStatus() != 3 {
		t.Fatalf("status %v, want exit 3", ws)
	}
}

func TestShutdownTerminatesServiceProcesses(t *testing.T) {
	e := newTestEnv(t, testToken)
	env, err := e.a.ProcessEnv("")
	if err != nil {
		t.Fatal(err)
	}
	pid, exited, err := e.a.Spawn("", []string{"sleep", "60"}, "/", []string{"PATH=" + env["PATH"]}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if pgid, err := unix.Getpgid(pid); err != nil || pgid != pid {
		t.Fatalf("pgid of %d = %d, %v; want its own group", pid, pgid, err)
	}
	start := time.Now()
	e.a.Shutdown()
	select {
	case ws := <-exited:
		if !ws.Signaled() || ws.Signal() != unix.SIGTERM {
			t.Fatalf("status %v, want SIGTERM", ws)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("service process survived Shutdown")
	}
	if d := time.Since(start); d > terminateGrace {
		t.Fatalf("Shutdown took %v; sleep should die on SIGTERM", d)
	}
}

func TestAccessTokenFollowsConfig(t *testing.T) {
	e := newTestEnv(t, testToken)
	if got := e.a.AccessToken(); got != testToken {
		t.Fatalf("AccessToken = %q", got)
	}
}
