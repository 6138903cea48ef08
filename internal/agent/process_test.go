package agent

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/sys/unix"

	pb "github.com/cubicle-dev/cubicle/sdk/go/envd/process"
)

func TestStartStreamEnvCwdExitCode(t *testing.T) {
	e := newTestEnv(t, testToken)
	dir := filepath.Join(e.root, "work")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	e.a.mu.Lock()
	e.a.envVars["FROM_INIT"] = "init-val"
	e.a.mu.Unlock()
	req := bash(`echo "out:$FOO:$FROM_INIT"; echo "err" >&2; pwd; exit 3`)
	req.Process.Envs = map[string]string{"FOO": "bar"}
	req.Process.Cwd = &dir
	r := e.run(asUserCtx(context.Background(), "root"), req)
	if r.err != nil {
		t.Fatalf("stream error: %v", r.err)
	}
	if len(r.events) == 0 || r.events[0] != "start" || r.events[len(r.events)-1] != "end" || r.pid == 0 {
		t.Fatalf("bad event order %v pid=%d", r.events, r.pid)
	}
	if want := "out:bar:init-val\n" + dir + "\n"; r.stdout != want {
		t.Fatalf("stdout %q want %q", r.stdout, want)
	}
	if r.stderr != "err\n" {
		t.Fatalf("stderr %q", r.stderr)
	}
	if r.end.GetExitCode() != 3 || !r.end.GetExited() || r.end.GetStatus() != "exit status 3" || r.end.GetError() != "exit status 3" {
		t.Fatalf("end %+v", r.end)
	}
}

func TestStartUsers(t *testing.T) {
	e := newTestEnv(t, testToken)
	cmd := `echo "$(id -u) $(id -g) $(id -G) $HOME $USER $(pwd)"; touch owned`
	// Default user ("user", uid 1000): cwd defaults to its home.
	r := e.run(context.Background(), bash(cmd))
	if r.err != nil || r.end.GetExitCode() != 0 {
		t.Fatalf("user run: %v %+v %q", r.err, r.end, r.stderr)
	}
	want := "1000 1000 1000 1500 " + e.userHome + " user " + e.userHome
	if trim(r.stdout) != want {
		t.Fatalf("user: got %q want %q", trim(r.stdout), want)
	}
	var st unix.Stat_t
	if err := unix.Stat(filepath.Join(e.userHome, "owned"), &st); err != nil || st.Uid != 1000 {
		t.Fatalf("file owned by %d (%v)", st.Uid, err)
	}
	r = e.run(asUserCtx(context.Background(), "root"), bash(`id -u`))
	if trim(r.stdout) != "0" {
		t.Fatalf("root: %q %v", r.stdout, r.err)
	}
	// Unknown user → unauthenticated.
	r = e.run(asUserCtx(context.Background(), "nobody-here"), bash(`id -u`))
	if codeOf(r.err) != connect.CodeUnauthenticated {
		t.Fatalf("unknown user: %v", r.err)
	}
	// Missing executable → invalid argument.
	f := false
	r = e.run(context.Background(), &pb.StartRequest{Process: &pb.ProcessConfig{Cmd: "no-such-binary-xyz"}, Stdin: &f})
	if codeOf(r.err) != connect.CodeInvalidArgument {
		t.Fatalf("missing binary: %v", r.err)
	}
}

func TestBackgroundConnectList(t *testing.T) {
	e := newTestEnv(t, testToken)
	ctx := context.Background()
	tag := "bg-job"
	req := bash(`read -t 10 line < /dev/null; sleep 0.8; echo done`)
	req.Tag = &tag
	sctx, cancel := context.WithCancel(ctx)
	s, err := e.proc.Start(sctx, connect.NewRequest(req))
	if err != nil {
		t.Fatal(err)
	}
	if !s.Receive() {
		t.Fatalf("no start: %v", s.Err())
	}
	pid := s.Msg().GetEvent().GetStart().GetPid()
	// Disconnecting the Start stream must not kill the process (envd behaviour).
	cancel()
	s.Close()

	lr, err := e.proc.List(ctx, connect.NewRequest(&pb.ListRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	found := slices.ContainsFunc(lr.Msg.GetProcesses(), func(p *pb.ProcessInfo) bool {
		return p.GetPid() == pid && p.GetTag() == tag && p.GetConfig().GetCmd() == "/bin/bash"
	})
	if !found {
		t.Fatalf("pid %d not in list %v", pid, lr.Msg.GetProcesses())
	}

	connectAndCollect := func(sel *pb.ProcessSelector) result {
		cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		cs, err := e.proc.Connect(cctx, connect.NewRequest(&pb.ConnectRequest{Process: sel}))
		if err != nil {
			return result{err: err}
		}
		defer cs.Close()
		return collect(cs.Receive, func() *pb.ProcessEvent { return cs.Msg().GetEvent() }, cs.Err)
	}
	// Two subscribers at once.
	done := make(chan result, 1)
	go func() { done <- connectAndCollect(&pb.ProcessSelector{Selector: &pb.ProcessSelector_Tag{Tag: tag}}) }()
	r := connectAndCollect(&pb.ProcessSelector{Selector: &pb.ProcessSelector_Pid{Pid: pid}})
	r2 := <-done
	for _, x := range []result{r, r2} {
		if x.err != nil || x.pid != pid || x.stdout != "done\n" || x.end.GetExitCode() != 0 || x.events[0] != "start" {
			t.Fatalf("connect: %+v", x)
		}
	}
	// A finished process's end event is kept for late Connects.
	r = connectAndCollect(&pb.ProcessSelector{Selector: &pb.ProcessSelector_Pid{Pid: pid}})
	if r.err != nil || r.end == nil || !r.end.GetExited() {
		t.Fatalf("late connect: %+v", r)
	}
	// Finished processes are not listed.
	lr, _ = e.proc.List(ctx, connect.NewRequest(&pb.ListRequest{}))
	for _, p := range lr.Msg.GetProcesses() {
		if p.GetPid() == pid {
			t.Fatal("finished process still listed")
		}
	}
	// Unknown pid.
	r = connectAndCollect(&pb.ProcessSelector{Selector: &pb.ProcessSelector_Pid{Pid: 999999}})
	if codeOf(r.err) != connect.CodeNotFound || !strings.Contains(r.err.Error(), "process with pid 999999 not found") {
		t.Fatalf("unknown pid: %v", r.err)
	}
}

// startBackground starts req and returns its pid plus a channel with the rest
// of the stream.
func (e *testEnv) startBackground(ctx context.Context, req *pb.StartRequest) (uint32, <-chan result) {
	e.t.Helper()
	s, err := e.proc.Start(ctx, connect.NewRequest(req))
	if err != nil {
		e.t.Fatal(err)
	}
	if !s.Receive() {
		e.t.Fatalf("no start event: %v", s.Err())
	}
	pid := s.Msg().GetEvent().GetStart().GetPid()
	ch := make(chan result, 1)
	go func() {
		defer s.Close()
		r := collect(s.Receive, func() *pb.ProcessEvent { return s.Msg().GetEvent() }, s.Err)
		r.pid = pid
		ch <- r
	}()
	return pid, ch
}

func awaitResult(t *testing.T, ch <-chan result) result {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(20 * time.Second):
		t.Fatal("process did not finish")
		return result{}
	}
}

func sel(pid uint32) *pb.ProcessSelector {
	return &pb.ProcessSelector{Selector: &pb.ProcessSelector_Pid{Pid: pid}}
}

func TestStdinSendInputCloseStdin(t *testing.T) {
	e := newTestEnv(t, testToken)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	tr := true
	pid, ch := e.startBackground(ctx, &pb.StartRequest{Process: &pb.ProcessConfig{Cmd: "cat"}, Stdin: &tr})
	for _, s := range []string{"hello ", "world\n"} {
		_, err := e.proc.SendInput(ctx, connect.NewRequest(&pb.SendInputRequest{Process: sel(pid), Input: &pb.ProcessInput{Input: &pb.ProcessInput_Stdin{Stdin: []byte(s)}}}))
		if err != nil {
			t.Fatal(err)
		}
	}
	if _, err := e.proc.CloseStdin(ctx, connect.NewRequest(&pb.CloseStdinRequest{Process: sel(pid)})); err != nil {
		t.Fatal(err)
	}
	r := awaitResult(t, ch)
	if r.stdout != "hello world\n" || r.end.GetExitCode() != 0 {
		t.Fatalf("cat: %+v", r)
	}
	// Stdin absent (nil) defaults to true for old clients.
	pid, ch = e.startBackground(ctx, &pb.StartRequest{Process: &pb.ProcessConfig{Cmd: "cat"}})
	if _, err := e.proc.CloseStdin(ctx, connect.NewRequest(&pb.CloseStdinRequest{Process: sel(pid)})); err != nil {
		t.Fatal(err)
	}
	if r := awaitResult(t, ch); r.end.GetExitCode() != 0 {
		t.Fatalf("cat default stdin: %+v", r)
	}
}

func TestStreamInputH2C(t *testing.T) {
	e := newTestEnv(t, testToken)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	tr := true
	pid, ch := e.startBackground(ctx, &pb.StartRequest{Process: &pb.ProcessConfig{Cmd: "cat"}, Stdin: &tr})
	cs := e.h2proc.StreamInput(ctx)
	msgs := []*pb.StreamInputRequest{
		{Event: &pb.StreamInputRequest_Start{Start: &pb.StreamInputRequest_StartEvent{Process: sel(pid)}}},
		{Event: &pb.StreamInputRequest_Data{Data: &pb.StreamInputRequest_DataEvent{Input: &pb.ProcessInput{Input: &pb.ProcessInput_Stdin{Stdin: []byte("a")}}}}},
		{Event: &pb.StreamInputRequest_Keepalive{Keepalive: &pb.StreamInputRequest_KeepAlive{}}},
		{Event: &pb.StreamInputRequest_Data{Data: &pb.StreamInputRequest_DataEvent{Input: &pb.ProcessInput{Input: &pb.ProcessInput_Stdin{Stdin: []byte("b\n")}}}}},
	}
	for _, m := range msgs {
		if err := cs.Send(m); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := cs.CloseAndReceive(); err != nil {
		t.Fatal(err)
	}
	if _, err := e.proc.CloseStdin(ctx, connect.NewRequest(&pb.CloseStdinRequest{Process: sel(pid)})); err != nil {
		t.Fatal(err)
	}
	if r := awaitResult(t, ch); r.stdout != "ab\n" {
		t.Fatalf("stream input: %+v", r)
	}
}

func TestSendSignalKillsGroup(t *testing.T) {
	e := newTestEnv(t, testToken)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	pidFile := filepath.Join(e.userHome, "child.pid")
	pid, ch := e.startBackground(ctx, bash(`sleep 30 & echo $! > `+pidFile+`; wait`))
	var child int
	waitFor(t, 5*time.Second, "child pid file", func() bool {
		b, err := os.ReadFile(pidFile)
		if err != nil || !strings.HasSuffix(string(b), "\n") {
			return false
		}
		child = atoiT(t, trim(string(b)))
		return true
	})
	if _, err := e.proc.SendSignal(ctx, connect.NewRequest(&pb.SendSignalRequest{Process: sel(pid), Signal: pb.Signal_SIGNAL_SIGKILL})); err != nil {
		t.Fatal(err)
	}
	r := awaitResult(t, ch)
	if r.end.GetExited() || r.end.GetExitCode() != -1 || r.end.GetStatus() != "signal: killed" {
		t.Fatalf("end after kill: %+v", r.end)
	}
	// The backgrounded sleep was in the same process group and died too. It was
	// reparented away from us, so just check it is gone (or a zombie).
	waitFor(t, 5*time.Second, "grandchild gone", func() bool {
		b, err := os.ReadFile("/proc/" + itoa(child) + "/stat")
		return err != nil || strings.Contains(string(b), ") Z ")
	})
	_, err := e.proc.SendSignal(ctx, connect.NewRequest(&pb.SendSignalRequest{Process: sel(424242), Signal: pb.Signal_SIGNAL_SIGKILL}))
	if codeOf(err) != connect.CodeNotFound {
		t.Fatalf("unknown pid signal: %v", err)
	}
	pid, ch = e.startBackground(ctx, bash(`trap 'exit 42' TERM; while true; do sleep 0.05; done`))
	time.Sleep(200 * time.Millisecond) // let bash install the trap
	if _, err := e.proc.SendSignal(ctx, connect.NewRequest(&pb.SendSignalRequest{Process: sel(pid), Signal: pb.Signal_SIGNAL_SIGTERM})); err != nil {
		t.Fatal(err)
	}
	if r := awaitResult(t, ch); r.end.GetExitCode() != 42 {
		t.Fatalf("sigterm: %+v", r.end)
	}
}

func TestPTYEchoResize(t *testing.T) {
	e := newTestEnv(t, testToken)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	req := &pb.StartRequest{
		Process: &pb.ProcessConfig{Cmd: "/bin/bash", Args: []string{"-c", `stty size; read line; echo "got:$line"; stty size`}, Envs: map[string]string{"TERM": "xterm-256color"}},
		Pty:     &pb.PTY{Size: &pb.PTY_Size{Cols: 80, Rows: 24}},
	}
	s, err := e.proc.Start(ctx, connect.NewRequest(req))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var out strings.Builder
	var pid uint32
	readUntil := func(want string) {
		t.Helper()
		for !strings.Contains(out.String(), want) {
			if !s.Receive() {
				t.Fatalf("stream ended before %q: %v; got %q", want, s.Err(), out.String())
			}
			ev := s.Msg().GetEvent()
			if st := ev.GetStart(); st != nil {
				pid = st.GetPid()
			}
			if d := ev.GetData(); d != nil {
				if len(d.GetStdout()) > 0 {
					t.Fatal("pty output arrived as stdout")
				}
				out.Write(d.GetPty())
			}
		}
	}
	readUntil("24 80")
	if _, err := e.proc.Update(ctx, connect.NewRequest(&pb.UpdateRequest{Process: sel(pid), Pty: &pb.PTY{Size: &pb.PTY_Size{Cols: 100, Rows: 30}}})); err != nil {
		t.Fatal(err)
	}
	if _, err := e.proc.SendInput(ctx, connect.NewRequest(&pb.SendInputRequest{Process: sel(pid), Input: &pb.ProcessInput{Input: &pb.ProcessInput_Pty{Pty: []byte("typed\n")}}})); err != nil {
		t.Fatal(err)
	}
	readUntil("got:typed")
	readUntil("30 100")
	// The terminal echoed the input.
	if !strings.Contains(out.String(), "typed\r\n") {
		t.Fatalf("no echo in %q", out.String())
	}
	_, err = e.proc.CloseStdin(ctx, connect.NewRequest(&pb.CloseStdinRequest{Process: sel(pid)}))
	if err != nil && codeOf(err) != connect.CodeFailedPrecondition && codeOf(err) != connect.CodeNotFound {
		t.Fatalf("close stdin on pty: %v", err)
	}
	for s.Receive() {
		if end := s.Msg().GetEvent().GetEnd(); end != nil {
			if end.GetExitCode() != 0 {
				t.Fatalf("pty end %+v", end)
			}
			return
		}
	}
	t.Fatalf("no end event: %v", s.Err())
}

func TestStartTimeoutKillsProcess(t *testing.T) {
	e := newTestEnv(t, testToken)
	// The client deadline becomes Connect-Timeout-Ms, as with the SDK's timeoutMs.
	ctx, cancel := context.WithTimeout(context.Background(), 700*time.Millisecond)
	defer cancel()
	pidFile := filepath.Join(e.userHome, "t.pid")
	s, err := e.proc.Start(ctx, connect.NewRequest(bash(`echo $$ > `+pidFile+`; exec sleep 30`)))
	if err != nil {
		t.Fatal(err)
	}
	r := collect(s.Receive, func() *pb.ProcessEvent { return s.Msg().GetEvent() }, s.Err)
	s.Close()
	if codeOf(r.err) != connect.CodeDeadlineExceeded || !r.started {
		t.Fatalf("want deadline_exceeded after start, got %+v", r)
	}
	// envd bounds the process by the same timeout: it is killed.
	p, err := e.a.procs.get(sel(r.pid))
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.done:
	case <-time.After(5 * time.Second):
		t.Fatal("process not killed at the deadline")
	}
	if p.end.GetStatus() != "signal: killed" {
		t.Fatalf("end %+v", p.end)
	}
}

func TestKeepalive(t *testing.T) {
	e := newTestEnv(t, testToken) // interceptor sends Keepalive-Ping-Interval: 1
	r := e.run(context.Background(), bash(`sleep 2.3; echo x`))
	if r.err != nil || !slices.Contains(r.events, "keepalive") {
		t.Fatalf("no keepalive: %+v", r)
	}
}
