package cubicle

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"

	"github.com/cubicle-dev/cubicle/sdk/go/envd/process"
)

// Commands runs processes in a sandbox (envd's process service).
type Commands struct{ sb *Sandbox }

// Commands returns the sandbox's process API.
func (s *Sandbox) Commands() *Commands { return &Commands{sb: s} }

// Output is one chunk of a process's output.
type Output struct {
	Stdout []byte
	Stderr []byte
	PTY    []byte
}

// CommandOptions configures Run, Start and Connect. The zero value runs as
// the sandbox's default user in its default directory.
type CommandOptions struct {
	Cwd  string
	Env  map[string]string
	User string
	// Stdin keeps the process's stdin open for SendStdin/CloseStdin.
	Stdin bool
	// Tag names the process so it can be found by List.
	Tag string
	// Timeout bounds the whole command (0: only ctx bounds it). When it
	// expires the stream ends with ErrTimeout; the process is not killed.
	Timeout time.Duration
	// OnStdout and OnStderr receive output as it arrives, from one
	// goroutine, in order.
	OnStdout func([]byte)
	OnStderr func([]byte)
	// Output, when set, receives every chunk and is closed at the end. The
	// reader must keep up: the stream waits for it.
	Output chan<- Output
}

// CommandResult is a finished process.
type CommandResult struct {
	Stdout   string
	Stderr   string
	ExitCode int
	// Error is envd's error text when the process could not run or was
	// killed by a signal.
	Error string
}

// ProcessInfo is one process List reports.
type ProcessInfo struct {
	PID  uint32
	Tag  string
	Cmd  string
	Args []string
	Env  map[string]string
	Cwd  string
}

// Run starts cmd with bash -l -c and waits for it. A non-zero exit is a
// *CommandExitError carrying the result.
func (c *Commands) Run(ctx context.Context, cmd string, o *CommandOptions) (*CommandResult, error) {
	h, err := c.Start(ctx, cmd, o)
	if err != nil {
		return nil, err
	}
	return h.Wait()
}

// Start launches cmd (bash -l -c cmd) and returns once the sandbox reports
// its PID. ctx bounds the stream: cancelling it stops following the
// process, which keeps running (use Kill to end it).
func (c *Commands) Start(ctx context.Context, cmd string, o *CommandOptions) (*CommandHandle, error) {
	if o == nil {
		o = &CommandOptions{}
	}
	stdin := o.Stdin
	req := &process.StartRequest{
		Process: &process.ProcessConfig{Cmd: "/bin/bash", Args: []string{"-l", "-c", cmd}, Envs: o.Env},
		Stdin:   &stdin,
	}
	if o.Cwd != "" {
		req.Process.Cwd = &o.Cwd
	}
	if o.Tag != "" {
		req.Tag = &o.Tag
	}
	return c.start(ctx, req, o, false)
}

func (c *Commands) start(ctx context.Context, req *process.StartRequest, o *CommandOptions, pty bool) (*CommandHandle, error) {
	sctx, cancel := streamCtx(ctx, o.Timeout)
	r := connect.NewRequest(req)
	r.Header().Set("Keepalive-Ping-Interval", keepaliveSeconds)
	userHeader(r.Header(), o.User)
	stream, err := c.sb.envd.proc.Start(sctx, r)
	if err != nil {
		cancel()
		return nil, rpcErr(ctx, "process.Start", err, resSandbox)
	}
	h := newHandle(c.sb, o, pty, cancel)
	if err := h.begin(ctx, eventsOf("process.Start", resSandbox, stream, (*process.StartResponse).GetEvent)); err != nil {
		return nil, err
	}
	return h, nil
}

// eventStream is a Start or Connect stream seen as process events.
type eventStream struct {
	procedure string
	res       resource // what a failure before the start event is about
	recv      func() (*process.ProcessEvent, bool)
	err       func() error
	close     func() error
}

func eventsOf[T any](procedure string, res resource, s *connect.ServerStreamForClient[T], get func(*T) *process.ProcessEvent) eventStream {
	return eventStream{procedure: procedure, res: res, err: s.Err, close: s.Close, recv: func() (*process.ProcessEvent, bool) {
		if !s.Receive() {
			return nil, false
		}
		return get(s.Msg()), true
	}}
}

// Connect attaches to a running process by PID and follows its output.
func (c *Commands) Connect(ctx context.Context, pid uint32, o *CommandOptions) (*CommandHandle, error) {
	if o == nil {
		o = &CommandOptions{}
	}
	sctx, cancel := streamCtx(ctx, o.Timeout)
	r := connect.NewRequest(&process.ConnectRequest{Process: pidSel(pid)})
	r.Header().Set("Keepalive-Ping-Interval", keepaliveSeconds)
	stream, err := c.sb.envd.proc.Connect(sctx, r)
	if err != nil {
		cancel()
		return nil, rpcErr(ctx, "process.Connect", err, resNone)
	}
	h := newHandle(c.sb, o, false, cancel)
	if err := h.begin(ctx, eventsOf("process.Connect", resNone, stream, (*process.ConnectResponse).GetEvent)); err != nil {
		return nil, err
	}
	return h, nil
}

func pidSel(pid uint32) *process.ProcessSelector {
	return &process.ProcessSelector{Selector: &process.ProcessSelector_Pid{Pid: pid}}
}

// List reports the sandbox's running processes started through envd.
func (c *Commands) List(ctx context.Context) ([]ProcessInfo, error) {
	ctx2, cancel := c.sb.envd.unaryCtx(ctx)
	defer cancel()
	resp, err := c.sb.envd.proc.List(ctx2, connect.NewRequest(&process.ListRequest{}))
	if err != nil {
		return nil, rpcErr(ctx, "process.List", err, resNone)
	}
	var out []ProcessInfo
	for _, p := range resp.Msg.GetProcesses() {
		cfg := p.GetConfig()
		out = append(out, ProcessInfo{PID: p.GetPid(), Tag: p.GetTag(), Cmd: cfg.GetCmd(), Args: cfg.GetArgs(), Env: cfg.GetEnvs(), Cwd: cfg.GetCwd()})
	}
	return out, nil
}

// Kill sends SIGKILL; false (no error) when there is no such process.
func (c *Commands) Kill(ctx context.Context, pid uint32) (bool, error) {
	ctx2, cancel := c.sb.envd.unaryCtx(ctx)
	defer cancel()
	_, err := c.sb.envd.proc.SendSignal(ctx2, connect.NewRequest(&process.SendSignalRequest{Process: pidSel(pid), Signal: process.Signal_SIGNAL_SIGKILL}))
	if err != nil {
		if connect.CodeOf(err) == connect.CodeNotFound {
			return false, nil
		}
		return false, rpcErr(ctx, "process.SendSignal", err, resNone)
	}
	return true, nil
}

// SendStdin writes to a process started with Stdin: true.
func (c *Commands) SendStdin(ctx context.Context, pid uint32, data []byte) error {
	return c.sb.sendInput(ctx, pid, &process.ProcessInput{Input: &process.ProcessInput_Stdin{Stdin: data}})
}

// CloseStdin sends EOF to a process's stdin (not for PTYs).
func (c *Commands) CloseStdin(ctx context.Context, pid uint32) error {
	ctx2, cancel := c.sb.envd.unaryCtx(ctx)
	defer cancel()
	_, err := c.sb.envd.proc.CloseStdin(ctx2, connect.NewRequest(&process.CloseStdinRequest{Process: pidSel(pid)}))
	return rpcErr(ctx, "process.CloseStdin", err, resNone)
}

func (s *Sandbox) sendInput(ctx context.Context, pid uint32, in *process.ProcessInput) error {
	ctx2, cancel := s.envd.unaryCtx(ctx)
	defer cancel()
	_, err := s.envd.proc.SendInput(ctx2, connect.NewRequest(&process.SendInputRequest{Process: pidSel(pid), Input: in}))
	return rpcErr(ctx, "process.SendInput", err, resNone)
}

// CommandHandle is a started process being followed.
type CommandHandle struct {
	// PID is the process ID inside the sandbox.
	PID uint32

	sb     *Sandbox
	o      *CommandOptions
	pty    bool
	cancel context.CancelFunc
	done   chan struct{}

	mu             sync.Mutex
	stdout, stderr strings.Builder
	result         *CommandResult
	err            error
}

func newHandle(sb *Sandbox, o *CommandOptions, pty bool, cancel context.CancelFunc) *CommandHandle {
	return &CommandHandle{sb: sb, o: o, pty: pty, cancel: cancel, done: make(chan struct{})}
}

// begin reads the start event, then follows the rest in a goroutine.
func (h *CommandHandle) begin(ctx context.Context, es eventStream) error {
	fail := func(err error) error {
		h.cancel()
		es.close()
		if h.o.Output != nil {
			close(h.o.Output) // nothing will come; don't leave a reader waiting
		}
		return err
	}
	ev, ok := es.recv()
	if !ok {
		err := rpcErr(ctx, es.procedure, es.err(), es.res)
		if err == nil {
			err = errors.New("cubicle: process stream ended before the start event")
		}
		return fail(err)
	}
	st := ev.GetStart()
	if st == nil {
		return fail(fmt.Errorf("cubicle: expected the start event, got %T", ev.GetEvent()))
	}
	h.PID = st.GetPid()
	go h.follow(ctx, es)
	return nil
}

func (h *CommandHandle) follow(ctx context.Context, es eventStream) {
	defer close(h.done)
	defer h.cancel()
	defer es.close()
	if h.o.Output != nil {
		defer close(h.o.Output)
	}
	var end *process.ProcessEvent_EndEvent
	for {
		ev, ok := es.recv()
		if !ok {
			break
		}
		if d := ev.GetData(); d != nil {
			h.data(d)
		}
		if e := ev.GetEnd(); e != nil {
			end = e
		}
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	res := &CommandResult{Stdout: h.stdout.String(), Stderr: h.stderr.String()}
	h.result = res
	switch {
	case end != nil:
		res.ExitCode = int(end.GetExitCode())
		res.Error = end.GetError()
		if res.ExitCode != 0 {
			h.err = &CommandExitError{Result: res}
		}
	default:
		if err := rpcErr(ctx, es.procedure, es.err(), resNone); err != nil {
			h.err = err
		} else {
			h.err = errors.New("cubicle: process stream ended without a result")
		}
	}
}

func (h *CommandHandle) data(d *process.ProcessEvent_DataEvent) {
	var out Output
	switch {
	case d.GetStdout() != nil:
		out.Stdout = d.GetStdout()
		h.mu.Lock()
		h.stdout.Write(out.Stdout)
		h.mu.Unlock()
		if h.o.OnStdout != nil {
			h.o.OnStdout(out.Stdout)
		}
	case d.GetStderr() != nil:
		out.Stderr = d.GetStderr()
		h.mu.Lock()
		h.stderr.Write(out.Stderr)
		h.mu.Unlock()
		if h.o.OnStderr != nil {
			h.o.OnStderr(out.Stderr)
		}
	case d.GetPty() != nil:
		out.PTY = d.GetPty()
		if h.o.OnStdout != nil {
			h.o.OnStdout(out.PTY)
		}
	default:
		return
	}
	if h.o.Output != nil {
		h.o.Output <- out
	}
}

// Wait blocks until the process ends (or the stream does) and returns its
// result; a non-zero exit is a *CommandExitError.
func (h *CommandHandle) Wait() (*CommandResult, error) {
	<-h.done
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.result, h.err
}

// Done is closed when the stream has ended.
func (h *CommandHandle) Done() <-chan struct{} { return h.done }

// Stdout returns the stdout received so far.
func (h *CommandHandle) Stdout() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.stdout.String()
}

// Stderr returns the stderr received so far.
func (h *CommandHandle) Stderr() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.stderr.String()
}

// Disconnect stops following; the process keeps running.
func (h *CommandHandle) Disconnect() { h.cancel() }

// Kill sends SIGKILL to the process.
func (h *CommandHandle) Kill(ctx context.Context) (bool, error) {
	return h.sb.Commands().Kill(ctx, h.PID)
}

// SendStdin writes to the process's stdin (its terminal, for a PTY).
func (h *CommandHandle) SendStdin(ctx context.Context, data []byte) error {
	if h.pty {
		return h.sb.PTY().SendInput(ctx, h.PID, data)
	}
	return h.sb.Commands().SendStdin(ctx, h.PID, data)
}

// CloseStdin sends EOF (not for PTYs).
func (h *CommandHandle) CloseStdin(ctx context.Context) error {
	return h.sb.Commands().CloseStdin(ctx, h.PID)
}

// PTY runs interactive terminals in a sandbox.
type PTY struct{ sb *Sandbox }

// PTY returns the sandbox's terminal API.
func (s *Sandbox) PTY() *PTY { return &PTY{sb: s} }

// PTYOptions configures a terminal; OnData (or Output's PTY field) gets
// the terminal's output.
type PTYOptions struct {
	Cols, Rows uint32
	Cwd        string
	Env        map[string]string
	User       string
	Timeout    time.Duration
	OnData     func([]byte)
	Output     chan<- Output
}

// Create starts an interactive login bash on a terminal of Cols×Rows
// (default 80×24), with TERM=xterm-256color and a UTF-8 locale.
func (p *PTY) Create(ctx context.Context, o PTYOptions) (*CommandHandle, error) {
	if o.Cols == 0 {
		o.Cols = 80
	}
	if o.Rows == 0 {
		o.Rows = 24
	}
	env := map[string]string{"TERM": "xterm-256color", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}
	for k, v := range o.Env {
		env[k] = v
	}
	req := &process.StartRequest{
		Process: &process.ProcessConfig{Cmd: "/bin/bash", Args: []string{"-i", "-l"}, Envs: env},
		Pty:     &process.PTY{Size: &process.PTY_Size{Cols: o.Cols, Rows: o.Rows}},
	}
	if o.Cwd != "" {
		req.Process.Cwd = &o.Cwd
	}
	co := &CommandOptions{User: o.User, Timeout: o.Timeout, OnStdout: o.OnData, Output: o.Output}
	return p.sb.Commands().start(ctx, req, co, true)
}

// SendInput types data into the terminal.
func (p *PTY) SendInput(ctx context.Context, pid uint32, data []byte) error {
	return p.sb.sendInput(ctx, pid, &process.ProcessInput{Input: &process.ProcessInput_Pty{Pty: data}})
}

// Resize changes the terminal size.
func (p *PTY) Resize(ctx context.Context, pid uint32, cols, rows uint32) error {
	ctx2, cancel := p.sb.envd.unaryCtx(ctx)
	defer cancel()
	_, err := p.sb.envd.proc.Update(ctx2, connect.NewRequest(&process.UpdateRequest{Process: pidSel(pid),
		Pty: &process.PTY{Size: &process.PTY_Size{Cols: cols, Rows: rows}}}))
	return rpcErr(ctx, "process.Update", err, resNone)
}

// Kill ends the terminal's process.
func (p *PTY) Kill(ctx context.Context, pid uint32) (bool, error) {
	return p.sb.Commands().Kill(ctx, pid)
}
