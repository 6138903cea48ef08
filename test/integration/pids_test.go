package integration

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/cubicle-dev/cubicle/sdk/go/envd/process"
	"github.com/cubicle-dev/cubicle/sdk/go/envd/process/processconnect"
)

// Past the sandbox's pids limit, starting a command fails at once with the
// reason (resource_exhausted, naming the process limit), for root and for
// the default user alike, instead of hanging until the client's timeout;
// the agent survives it (at the limit, the Go runtime cannot create a
// thread, which used to kill PID 1), and once the processes end, commands
// work again. runc only: under gVisor the sandbox's processes are not host
// tasks, and the pids limit bounds the sentry (see TestAgentSurvivesWorkload).
func TestCommandsPastThePidsLimit(t *testing.T) {
	bin := probe(t)
	s := startServer(t) // --memory-mb 256: a pids limit of 256
	c := s.create(map[string]any{"templateID": "base", "timeout": 300})
	s.upload(t, c, bin, "/home/user/probe")
	s.mustRun(c, "chmod 755 /home/user/probe")

	// Fill the limit with sleepers held by one background command.
	pc := processconnect.NewProcessClient(s.envdClient(c), s.URL, connect.WithProtoJSON())
	holdCtx, stopHold := context.WithCancel(context.Background())
	defer stopHold()
	hold, err := pc.Start(holdCtx, connect.NewRequest(&process.StartRequest{
		Process: &process.ProcessConfig{Cmd: "/home/user/probe", Args: []string{"hold", "100000"}},
	}))
	if err != nil {
		t.Fatal(err)
	}
	defer hold.Close()
	var holdPid uint32
	var out strings.Builder
	for !strings.Contains(out.String(), "\n") && hold.Receive() {
		ev := hold.Msg().GetEvent()
		if st := ev.GetStart(); st != nil {
			holdPid = st.GetPid()
		}
		if d := ev.GetData(); d != nil {
			out.Write(d.GetStdout())
		}
	}
	if started, reason, _ := strings.Cut(strings.TrimSpace(out.String()), " "); reason != "EAGAIN" || started == "0" {
		t.Fatalf("filling the pids limit: %q (%v), want sleepers until EAGAIN", out.String(), hold.Err())
	}

	// Many commands at once, as SDK clients with a 60 s timeout send them.
	const n = 100
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			user := "user"
			if i%4 == 0 {
				user = "root"
			}
			hc := &http.Client{Transport: userTransport{headerTransport{id: c.SandboxID, token: c.EnvdAccessToken}, user}}
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			st, err := processconnect.NewProcessClient(hc, s.URL, connect.WithProtoJSON()).Start(ctx, connect.NewRequest(&process.StartRequest{
				Process: &process.ProcessConfig{Cmd: "/bin/sleep", Args: []string{"1"}},
			}))
			if err == nil {
				for st.Receive() {
				}
				err = st.Err()
				st.Close()
			}
			errs[i] = err
		}()
	}
	wg.Wait()
	for i, err := range errs {
		var ce *connect.Error
		if !errors.As(err, &ce) || ce.Code() != connect.CodeResourceExhausted || !strings.Contains(ce.Message(), "process limit") {
			t.Errorf("command %d past the pids limit: %v, want resource_exhausted naming the process limit at once", i, err)
		}
	}

	// The agent is alive and the sandbox still running.
	resp, err := s.envdClient(c).Get(s.URL + "/health")
	if err != nil {
		t.Fatalf("agent at the pids limit: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		t.Fatalf("agent at the pids limit: status %d; server logs:\n%s", resp.StatusCode, s.logs)
	}

	// Freed, commands work again (the sleepers are reaped asynchronously).
	if _, err := pc.SendSignal(context.Background(), connect.NewRequest(&process.SendSignalRequest{
		Process: &process.ProcessSelector{Selector: &process.ProcessSelector_Pid{Pid: holdPid}},
		Signal:  process.Signal_SIGNAL_SIGKILL,
	})); err != nil {
		t.Fatalf("kill the holder: %v", err)
	}
	for hold.Receive() {
	}
	var got string
	for range 40 {
		o, _, code, err := s.run(c, "echo alive")
		if got = strings.TrimSpace(o); err == nil && code == 0 && got == "alive" {
			return
		}
		time.Sleep(250 * time.Millisecond)
	}
	t.Fatalf("after the sleepers were killed: %q", got)
}
