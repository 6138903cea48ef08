package agent

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cubicle-dev/cubicle/internal/agentapi"
	"github.com/cubicle-dev/cubicle/internal/testenv"
	pb "github.com/cubicle-dev/cubicle/sdk/go/envd/process"
)

const reaperHelperEnv = "CUBICLE_AGENT_REAPER_HELPER"

func TestMain(m *testing.M) {
	if os.Getenv(reaperHelperEnv) == startCmdScenarioName {
		if err := startCmdReapScenario(); err != nil {
			fmt.Println("REAPER-FAIL:", err)
			os.Exit(1)
		}
		fmt.Println("REAPER-OK")
		os.Exit(0)
	}
	if os.Getenv(reaperHelperEnv) == pidsLimitScenario {
		if err := pidsLimitAgent(); err != nil {
			fmt.Println("AGENT-FAIL:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	if os.Getenv(reaperHelperEnv) == "1" {
		if err := reaperScenario(); err != nil {
			fmt.Println("REAPER-FAIL:", err)
			os.Exit(1)
		}
		fmt.Println("REAPER-OK")
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// TestReapAllMode runs the PID-1 style reaper in a child copy of the test
// binary (a wait4(-1) loop must not run inside the shared test process).
func TestReapAllMode(t *testing.T) {
	testenv.RequireRoot(t, "setuid children")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), reaperHelperEnv+"=1")
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "REAPER-OK") {
		t.Fatalf("reaper scenario: %v\n%s", err, out)
	}
}

// reaperScenario: as a subreaper with ReapAll, exit statuses reach the right
// process (also for children that exit instantly) and orphans are reaped.
func reaperScenario() error {
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "reaper")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	passwd := filepath.Join(dir, "passwd")
	if err := os.WriteFile(passwd, []byte("root:x:0:0:root:"+dir+":/bin/sh\n"), 0o644); err != nil {
		return err
	}
	a := New(Config{PasswdPath: passwd, GroupPath: filepath.Join(dir, "group"), ReapAll: true, DefaultUser: "root"})
	defer a.Shutdown()
	u, err := a.lookupUser("root")
	if err != nil {
		return err
	}
	f := false
	runOne := func(script string) (*pb.ProcessEvent_EndEvent, string, error) {
		req := &pb.StartRequest{Process: &pb.ProcessConfig{Cmd: "/bin/sh", Args: []string{"-c", script}}, Stdin: &f}
		p, sub, err := a.startProcess(u, req, 0, true)
		if err != nil {
			return nil, "", err
		}
		defer p.unsubscribe(sub)
		var out strings.Builder
		timeout := time.After(20 * time.Second)
		for {
			select {
			case ev := <-sub.ch:
				if d := ev.GetData(); d != nil {
					out.Write(d.GetStdout())
				}
				if end := ev.GetEnd(); end != nil {
					return end, out.String(), nil
				}
			case <-timeout:
				return nil, "", fmt.Errorf("no end for %q", script)
			}
		}
	}
	end, out, err := runOne(`sleep 0.3 & echo $!; exit 7`)
	if err != nil {
		return err
	}
	if end.GetExitCode() != 7 {
		return fmt.Errorf("exit code %d", end.GetExitCode())
	}
	orphan, err := strconv.Atoi(strings.TrimSpace(out))
	if err != nil {
		return fmt.Errorf("orphan pid %q", out)
	}
	// The accelerator check's commands go through the reaper too: under a
	// wait4(-1) loop an exec.Cmd of its own lost its status ("waitid: no
	// child processes", seen in CI as a failed GPU create).
	for i := range 20 {
		res := a.runAccelCheck(context.Background(), agentapi.AccelCheckRequest{Check: fmt.Sprintf("echo check-%d; exit %d", i, i%2)})
		if (i%2 == 0) != res.OK || !strings.Contains(res.Output, fmt.Sprintf("check-%d", i)) {
			return fmt.Errorf("accelerator check %d under the reaper: %+v", i, res)
		}
		if i%2 == 1 && !strings.Contains(res.Failures[0].Detail, "exited 1") {
			return fmt.Errorf("accelerator check %d: %+v", i, res.Failures)
		}
	}
	// Instantly exiting children, concurrently: each must get its own status.
	var wg sync.WaitGroup
	errs := make(chan error, 20)
	for i := range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			end, _, err := runOne(fmt.Sprintf("exit %d", i))
			if err == nil && end.GetExitCode() != int32(i) {
				err = fmt.Errorf("child %d got exit %d", i, end.GetExitCode())
			}
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			return err
		}
	}
	// The orphaned sleep was reparented to us and must be reaped, not left a zombie.
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		if _, err := os.Stat("/proc/" + strconv.Itoa(orphan)); os.IsNotExist(err) {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	stat, _ := os.ReadFile("/proc/" + strconv.Itoa(orphan) + "/stat")
	return fmt.Errorf("orphan %d not reaped: %s", orphan, stat)
}
