package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/sys/unix"

	pb "github.com/cubicle-dev/cubicle/sdk/go/envd/process"
)

const (
	defaultKeepalive = 90 * time.Second
	// finishedRetention is how long a finished process's end event stays
	// available to Connect, as in envd.
	finishedRetention = 30 * time.Second
	// outputDrainGrace bounds how long we wait for output after exit, for when
	// a backgrounded grandchild keeps the pipe or pty open.
	outputDrainGrace = 2 * time.Second
	terminateGrace   = 5 * time.Second
	defaultPath      = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
)

var (
	errProcessNotFound = errors.New("agent: process not found")
	errNoStdin         = errors.New("agent: process has no stdin")
	errNoPTY           = errors.New("agent: process has no pty")
)

// proc is one started process.
type proc struct {
	pid    int
	config *pb.ProcessConfig
	tag    *string

	inMu  sync.Mutex
	stdin *os.File // write end of stdin pipe; nil when closed or absent
	pty   *os.File // pty master; nil without pty

	mu   sync.Mutex
	subs map[*subscriber]struct{}
	end  *pb.ProcessEvent_EndEvent

	done chan struct{} // closed after the end event is published
}

type subscriber struct {
	ch   chan *pb.ProcessEvent
	gone chan struct{}
	once sync.Once
}

func (s *subscriber) close() { s.once.Do(func() { close(s.gone) }) }

// subscribe registers a subscriber; if the process already ended, end is set.
func (p *proc) subscribe() (*subscriber, *pb.ProcessEvent_EndEvent) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.end != nil {
		return nil, p.end
	}
	s := &subscriber{ch: make(chan *pb.ProcessEvent, 64), gone: make(chan struct{})}
	p.subs[s] = struct{}{}
	return s, nil
}

func (p *proc) unsubscribe(s *subscriber) {
	s.close()
	p.mu.Lock()
	delete(p.subs, s)
	p.mu.Unlock()
}

// broadcast delivers ev to every subscriber. It applies backpressure to the
// output reader (a slow stream slows reading) but never blocks on a
// subscriber that has gone away.
func (p *proc) broadcast(ev *pb.ProcessEvent) {
	p.mu.Lock()
	subs := make([]*subscriber, 0, len(p.subs))
	for s := range p.subs {
		subs = append(subs, s)
	}
	p.mu.Unlock()
	for _, s := range subs {
		select {
		case s.ch <- ev:
		case <-s.gone:
		}
	}
}

func (p *proc) finish(end *pb.ProcessEvent_EndEvent) {
	p.mu.Lock()
	p.end = end
	subs := make([]*subscriber, 0, len(p.subs))
	for s := range p.subs {
		subs = append(subs, s)
	}
	p.mu.Unlock()
	ev := &pb.ProcessEvent{Event: &pb.ProcessEvent_End{End: end}}
	for _, s := range subs {
		select {
		case s.ch <- ev:
		case <-s.gone:
		}
	}
	close(p.done)
}

func (p *proc) running() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

func (p *proc) signal(sig unix.Signal) error {
	// Children run in their own process group (pgid == pid); signal the group
	// so shells' children die too, then the leader in case it left the group.
	errGroup := unix.Kill(-p.pid, sig)
	errLeader := unix.Kill(p.pid, sig)
	if errGroup != nil && errLeader != nil {
		return errLeader
	}
	return nil
}

// notFoundError keeps envd's exact message ("process with pid N not found")
// on the wire while still matching errProcessNotFound with errors.Is.
type notFoundError struct{ msg string }

func (e notFoundError) Error() string        { return e.msg }
func (e notFoundError) Is(target error) bool { return target == errProcessNotFound }

func processNotFound(format string, args ...any) error {
	return connect.NewError(connect.CodeNotFound, notFoundError{fmt.Sprintf(format, args...)})
}

type processTable struct {
	mu   sync.Mutex
	pids map[int]*proc
	tags map[string]*proc
}

func newProcessTable() *processTable {
	return &processTable{pids: map[int]*proc{}, tags: map[string]*proc{}}
}

func (t *processTable) add(p *proc) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.pids[p.pid] = p
	if p.tag != nil {
		t.tags[*p.tag] = p
	}
}

func (t *processTable) remove(p *proc) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.pids[p.pid] == p {
		delete(t.pids, p.pid)
	}
	if p.tag != nil && t.tags[*p.tag] == p {
		delete(t.tags, *p.tag)
	}
}

func (t *processTable) get(sel *pb.ProcessSelector) (*proc, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	switch s := sel.GetSelector().(type) {
	case *pb.ProcessSelector_Pid:
		if p, ok := t.pids[int(s.Pid)]; ok {
			return p, nil
		}
		return nil, processNotFound("process with pid %d not found", s.Pid)
	case *pb.ProcessSelector_Tag:
		if p, ok := t.tags[s.Tag]; ok {
			return p, nil
		}
		return nil, processNotFound("process with tag %s not found", s.Tag)
	}
	return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("process selector is required"))
}

func (t *processTable) list() []*proc {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]*proc, 0, len(t.pids))
	for _, p := range t.pids {
		if p.running() {
			out = append(out, p)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].pid < out[j].pid })
	return out
}

func (t *processTable) terminateAll() {
	procs := t.list()
	for _, p := range procs {
		_ = p.signal(unix.SIGTERM)
	}
	deadline := time.After(terminateGrace)
	for _, p := range procs {
		select {
		case <-p.done:
		case <-deadline:
			_ = p.signal(unix.SIGKILL)
		}
	}
	for _, p := range procs {
		select {
		case <-p.done:
		case <-time.After(terminateGrace):
		}
	}
}

// processService implements processconnect.ProcessHandler.
type processService struct{ a *Agent }

func keepaliveInterval(h http.Header) time.Duration {
	if v, err := strconv.Atoi(h.Get("Keepalive-Ping-Interval")); err == nil && v > 0 {
		return time.Duration(v) * time.Second
	}
	return defaultKeepalive
}

// timeoutFromHeader reads Connect-Timeout-Ms; zero means no timeout.
func timeoutFromHeader(h http.Header) (time.Duration, error) {
	v := h.Get("Connect-Timeout-Ms")
	if v == "" {
		return 0, nil
	}
	ms, err := strconv.ParseInt(v, 10, 64)
	if err != nil || ms < 0 {
		return 0, fmt.Errorf("invalid Connect-Timeout-Ms %q", v)
	}
	return time.Duration(ms) * time.Millisecond, nil
}

func (a *Agent) buildEnv(u *sysUser, extra map[string]string) []string {
	a.mu.RLock()
	vars := maps.Clone(a.envVars)
	a.mu.RUnlock()
	return userEnv(u, vars, extra)
}

// userEnv is a child's environment: the user's identity, then the sandbox
// env vars, then extra; later ones win.
func userEnv(u *sysUser, vars, extra map[string]string) []string {
	env := map[string]string{
		"PATH":    defaultPath,
		"HOME":    u.Home,
		"USER":    u.Name,
		"LOGNAME": u.Name,
	}
	maps.Copy(env, vars)
	maps.Copy(env, extra)
	out := make([]string, 0, len(env))
	for k, v := range env {
		out = append(out, k+"="+v)
	}
	sort.Strings(out)
	return out
}

func envLookup(env []string, key string) string {
	for _, kv := range env {
		if k, v, ok := strings.Cut(kv, "="); ok && k == key {
			return v
		}
	}
	return ""
}

// lookPath resolves cmd against the child's PATH, as exec.Command would.
func lookPath(cmd string, env []string) (string, error) {
	if strings.Contains(cmd, "/") {
		return cmd, nil
	}
	for _, dir := range filepath.SplitList(envLookup(env, "PATH")) {
		if dir == "" {
			dir = "."
		}
		p := filepath.Join(dir, cmd)
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("executable file %q not found in $PATH", cmd)
}

// startError is the Connect error for a failed fork/exec of cmd. Fork
// failing for want of a pid (EAGAIN: the sandbox's pids limit) or of memory
// is the sandbox's resources running out, not a bad request: the caller gets
// resource_exhausted with the reason at once, and can retry once processes
// have ended.
func startError(cmd string, err error) error {
	switch {
	case errors.Is(err, syscall.EAGAIN):
		return connect.NewError(connect.CodeResourceExhausted, fmt.Errorf("start %s: the sandbox's process limit is reached (fork: %w)", cmd, err))
	case errors.Is(err, syscall.ENOMEM):
		return connect.NewError(connect.CodeResourceExhausted, fmt.Errorf("start %s: the sandbox is out of memory (fork: %w)", cmd, err))
	}
	return connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("start %s: %w", cmd, err))
}

// openPTY opens a pty pair without creack/pty's Open, which calls Fd() on the
// master and thereby switches it to blocking mode; a blocking master cannot be
// unblocked by Close, which we need when a grandchild keeps the slave open.
func openPTY() (master, slave *os.File, err error) {
	master, err = os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		return nil, nil, err
	}
	var n int
	var ioErr error
	rc, err := master.SyscallConn()
	if err == nil {
		err = rc.Control(func(fd uintptr) {
			if ioErr = unix.IoctlSetPointerInt(int(fd), unix.TIOCSPTLCK, 0); ioErr != nil {
				return
			}
			n, ioErr = unix.IoctlGetInt(int(fd), unix.TIOCGPTN)
		})
	}
	if err == nil {
		err = ioErr
	}
	if err != nil {
		master.Close()
		return nil, nil, err
	}
	slave, err = os.OpenFile("/dev/pts/"+strconv.Itoa(n), os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		master.Close()
		return nil, nil, err
	}
	return master, slave, nil
}

func setPTYSize(master *os.File, size *pb.PTY_Size) error {
	if size == nil {
		return nil
	}
	rc, err := master.SyscallConn()
	if err != nil {
		return err
	}
	var ioErr error
	err = rc.Control(func(fd uintptr) {
		ioErr = unix.IoctlSetWinsize(int(fd), unix.TIOCSWINSZ, &unix.Winsize{Row: uint16(size.GetRows()), Col: uint16(size.GetCols())})
	})
	if err != nil {
		return err
	}
	return ioErr
}

// startProcess starts req as user u. The returned proc is registered and its
// first subscriber (if subscribe) is attached before any output is read, so
// that subscriber sees every byte.
func (a *Agent) startProcess(u *sysUser, req *pb.StartRequest, timeout time.Duration, subscribe bool) (*proc, *subscriber, error) {
	cfg := req.GetProcess()
	if cfg == nil || cfg.GetCmd() == "" {
		return nil, nil, connect.NewError(connect.CodeInvalidArgument, errors.New("process cmd is required"))
	}
	env := a.buildEnv(u, cfg.GetEnvs())
	path, err := lookPath(cfg.GetCmd(), env)
	if err != nil {
		return nil, nil, connect.NewError(connect.CodeInvalidArgument, err)
	}
	cwd := u.Home
	a.mu.RLock()
	if a.defaultWorkdir != "" {
		cwd = a.defaultWorkdir
	}
	a.mu.RUnlock()
	if cfg.Cwd != nil && cfg.GetCwd() != "" {
		if cwd, err = resolvePath(cfg.GetCwd(), u); err != nil {
			return nil, nil, connect.NewError(connect.CodeInvalidArgument, err)
		}
	}
	var cwdErr error
	_ = asUser(u, func() error {
		fi, err := os.Stat(cwd)
		switch {
		case err != nil:
			cwdErr = err
		case !fi.IsDir():
			cwdErr = fmt.Errorf("%w: %s", ErrNotDir, cwd)
		}
		return nil
	})
	if cwdErr != nil {
		return nil, nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("invalid cwd %s: %w", cwd, cwdErr))
	}

	p := &proc{config: cfg, tag: req.Tag, subs: map[*subscriber]struct{}{}, done: make(chan struct{})}
	sys := &syscall.SysProcAttr{}
	if os.Geteuid() == 0 {
		sys.Credential = &syscall.Credential{Uid: u.UID, Gid: u.GID, Groups: u.Groups}
	}
	var childFiles []*os.File // closed in the parent after fork
	var readers []struct {
		f    *os.File
		kind int
	}
	closeAll := func() {
		for _, f := range childFiles {
			f.Close()
		}
		for _, r := range readers {
			r.f.Close()
		}
		if p.stdin != nil {
			p.stdin.Close()
		}
	}
	var files []uintptr
	if req.Pty != nil {
		master, slave, err := openPTY()
		if err != nil {
			return nil, nil, connect.NewError(connect.CodeInternal, fmt.Errorf("open pty: %w", err))
		}
		if err := setPTYSize(master, req.GetPty().GetSize()); err != nil {
			master.Close()
			slave.Close()
			return nil, nil, connect.NewError(connect.CodeInternal, fmt.Errorf("pty size: %w", err))
		}
		p.pty = master
		childFiles = append(childFiles, slave)
		fd := slave.Fd()
		files = []uintptr{fd, fd, fd}
		sys.Setsid = true
		sys.Setctty = true
		sys.Ctty = 0
		readers = append(readers, struct {
			f    *os.File
			kind int
		}{master, 3})
	} else {
		sys.Setpgid = true
		var stdinR *os.File
		if req.Stdin == nil || req.GetStdin() {
			r, w, err := os.Pipe()
			if err != nil {
				return nil, nil, connect.NewError(connect.CodeInternal, err)
			}
			stdinR, p.stdin = r, w
		} else {
			r, err := os.Open(os.DevNull)
			if err != nil {
				return nil, nil, connect.NewError(connect.CodeInternal, err)
			}
			stdinR = r
		}
		childFiles = append(childFiles, stdinR)
		outR, outW, err := os.Pipe()
		if err != nil {
			closeAll()
			return nil, nil, connect.NewError(connect.CodeInternal, err)
		}
		childFiles = append(childFiles, outW)
		readers = append(readers, struct {
			f    *os.File
			kind int
		}{outR, 1})
		errR, errW, err := os.Pipe()
		if err != nil {
			closeAll()
			return nil, nil, connect.NewError(connect.CodeInternal, err)
		}
		childFiles = append(childFiles, errW)
		readers = append(readers, struct {
			f    *os.File
			kind int
		}{errR, 2})
		files = []uintptr{stdinR.Fd(), outW.Fd(), errW.Fd()}
	}

	argv := append([]string{cfg.GetCmd()}, cfg.GetArgs()...)
	var sub *subscriber
	pid, waitc, err := a.reaper.spawn(func() (int, error) {
		return a.forkExec(path, argv, &syscall.ProcAttr{Dir: cwd, Env: env, Files: files, Sys: sys})
	})
	for _, f := range childFiles {
		f.Close()
	}
	childFiles = nil
	if err != nil {
		closeAll()
		return nil, nil, startError(cfg.GetCmd(), err)
	}
	p.pid = pid
	if subscribe {
		sub, _ = p.subscribe()
	}
	a.procs.add(p)

	var killTimer *time.Timer
	if timeout > 0 {
		// envd runs the command under a context bounded by Connect-Timeout-Ms:
		// the process dies at the deadline, but not when the client merely
		// disconnects.
		killTimer = time.AfterFunc(timeout, func() { _ = p.signal(unix.SIGKILL) })
	}

	var wg sync.WaitGroup
	for _, r := range readers {
		wg.Add(1)
		go func(f *os.File, kind int) {
			defer wg.Done()
			p.pump(f, kind)
		}(r.f, r.kind)
	}
	go func() {
		ws := <-waitc
		if killTimer != nil {
			killTimer.Stop()
		}
		drained := make(chan struct{})
		go func() { wg.Wait(); close(drained) }()
		select {
		case <-drained:
		case <-time.After(outputDrainGrace):
			// Unblock readers stuck on a pipe/pty still held by a grandchild.
			for _, r := range readers {
				r.f.Close()
			}
			<-drained
		}
		for _, r := range readers {
			r.f.Close()
		}
		p.inMu.Lock()
		if p.stdin != nil {
			p.stdin.Close()
			p.stdin = nil
		}
		p.pty = nil
		p.inMu.Unlock()
		p.finish(endEvent(ws))
		time.AfterFunc(finishedRetention, func() { a.procs.remove(p) })
	}()
	return p, sub, nil
}

func endEvent(ws unix.WaitStatus) *pb.ProcessEvent_EndEvent {
	// Mirrors os.ProcessState: ExitCode() is -1 when signaled; String() text.
	e := &pb.ProcessEvent_EndEvent{}
	switch {
	case ws.Exited():
		e.Exited = true
		e.ExitCode = int32(ws.ExitStatus())
		e.Status = "exit status " + strconv.Itoa(ws.ExitStatus())
		if ws.ExitStatus() != 0 {
			// envd reports cmd.Wait's error text, which is the status for a
			// non-zero exit (the SDK puts it in CommandExitError).
			msg := e.Status
			e.Error = &msg
		}
	case ws.Signaled():
		e.ExitCode = -1
		e.Status = "signal: " + ws.Signal().String()
		if ws.CoreDump() {
			e.Status += " (core dumped)"
		}
		msg := e.Status
		e.Error = &msg
	default:
		e.ExitCode = -1
		e.Status = "exit status unknown"
	}
	return e
}

// pump reads one output stream and broadcasts it as data events.
func (p *proc) pump(f *os.File, kind int) {
	buf := make([]byte, 32*1024)
	for {
		n, err := f.Read(buf)
		if n > 0 {
			b := append([]byte(nil), buf[:n]...)
			var d *pb.ProcessEvent_DataEvent
			switch kind {
			case 1:
				d = &pb.ProcessEvent_DataEvent{Output: &pb.ProcessEvent_DataEvent_Stdout{Stdout: b}}
			case 2:
				d = &pb.ProcessEvent_DataEvent{Output: &pb.ProcessEvent_DataEvent_Stderr{Stderr: b}}
			default:
				d = &pb.ProcessEvent_DataEvent{Output: &pb.ProcessEvent_DataEvent_Pty{Pty: b}}
			}
			p.broadcast(&pb.ProcessEvent{Event: &pb.ProcessEvent_Data{Data: d}})
		}
		if err != nil {
			// EOF for pipes, EIO for a pty whose slave side is closed.
			return
		}
	}
}

// stream sends start, data/keepalive and end events for p to send.
func (p *proc) stream(ctx context.Context, sub *subscriber, end *pb.ProcessEvent_EndEvent, keepalive time.Duration, send func(*pb.ProcessEvent) error) error {
	if err := send(&pb.ProcessEvent{Event: &pb.ProcessEvent_Start{Start: &pb.ProcessEvent_StartEvent{Pid: uint32(p.pid)}}}); err != nil {
		return err
	}
	if sub == nil {
		return send(&pb.ProcessEvent{Event: &pb.ProcessEvent_End{End: end}})
	}
	t := time.NewTimer(keepalive)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
			if err := send(&pb.ProcessEvent{Event: &pb.ProcessEvent_Keepalive{Keepalive: &pb.ProcessEvent_KeepAlive{}}}); err != nil {
				return err
			}
			t.Reset(keepalive)
		case ev := <-sub.ch:
			if err := send(ev); err != nil {
				return err
			}
			if _, ok := ev.Event.(*pb.ProcessEvent_End); ok {
				return nil
			}
			if !t.Stop() {
				select {
				case <-t.C:
				default:
				}
			}
			t.Reset(keepalive)
		}
	}
}

func ctxErr(ctx context.Context) error {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return connect.NewError(connect.CodeDeadlineExceeded, ctx.Err())
	}
	return connect.NewError(connect.CodeCanceled, ctx.Err())
}

func (s *processService) Start(ctx context.Context, req *connect.Request[pb.StartRequest], stream *connect.ServerStream[pb.StartResponse]) error {
	// The user lookup and the start block in system calls, each holding an
	// OS thread; bounded, a burst of starts never needs more threads than
	// ReserveThreads made (at the pids limit none can be added).
	select {
	case startSem <- struct{}{}:
	case <-ctx.Done():
		return ctxErr(ctx)
	}
	u, err := s.a.requestUser(ctx)
	if err != nil {
		<-startSem
		return connect.NewError(connect.CodeUnauthenticated, err)
	}
	timeout, err := timeoutFromHeader(req.Header())
	if err != nil {
		<-startSem
		return connect.NewError(connect.CodeInvalidArgument, err)
	}
	p, sub, err := s.a.startProcess(u, req.Msg, timeout, true)
	<-startSem
	if err != nil {
		return err
	}
	defer p.unsubscribe(sub)
	err = p.stream(ctx, sub, nil, keepaliveInterval(req.Header()), func(ev *pb.ProcessEvent) error {
		return stream.Send(&pb.StartResponse{Event: ev})
	})
	if err != nil && ctx.Err() != nil {
		return ctxErr(ctx)
	}
	return err
}

func (s *processService) Connect(ctx context.Context, req *connect.Request[pb.ConnectRequest], stream *connect.ServerStream[pb.ConnectResponse]) error {
	p, err := s.a.procs.get(req.Msg.GetProcess())
	if err != nil {
		return err
	}
	sub, end := p.subscribe()
	if sub != nil {
		defer p.unsubscribe(sub)
	}
	err = p.stream(ctx, sub, end, keepaliveInterval(req.Header()), func(ev *pb.ProcessEvent) error {
		return stream.Send(&pb.ConnectResponse{Event: ev})
	})
	if err != nil && ctx.Err() != nil {
		return ctxErr(ctx)
	}
	return err
}

func (s *processService) List(ctx context.Context, req *connect.Request[pb.ListRequest]) (*connect.Response[pb.ListResponse], error) {
	resp := &pb.ListResponse{}
	for _, p := range s.a.procs.list() {
		resp.Processes = append(resp.Processes, &pb.ProcessInfo{Config: p.config, Pid: uint32(p.pid), Tag: p.tag})
	}
	return connect.NewResponse(resp), nil
}

func (s *processService) Update(ctx context.Context, req *connect.Request[pb.UpdateRequest]) (*connect.Response[pb.UpdateResponse], error) {
	p, err := s.a.procs.get(req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	if req.Msg.Pty != nil {
		p.inMu.Lock()
		defer p.inMu.Unlock()
		if p.pty == nil {
			return nil, connect.NewError(connect.CodeFailedPrecondition, errNoPTY)
		}
		if err := setPTYSize(p.pty, req.Msg.GetPty().GetSize()); err != nil {
			return nil, connect.NewError(connect.CodeInternal, err)
		}
	}
	return connect.NewResponse(&pb.UpdateResponse{}), nil
}

func (p *proc) write(in *pb.ProcessInput) error {
	p.inMu.Lock()
	defer p.inMu.Unlock()
	var f *os.File
	var data []byte
	switch v := in.GetInput().(type) {
	case *pb.ProcessInput_Stdin:
		f, data = p.stdin, v.Stdin
		if f == nil && p.pty != nil {
			// envd accepts stdin input for pty processes as pty input.
			f = p.pty
		}
		if f == nil {
			return connect.NewError(connect.CodeFailedPrecondition, errNoStdin)
		}
	case *pb.ProcessInput_Pty:
		f, data = p.pty, v.Pty
		if f == nil {
			return connect.NewError(connect.CodeFailedPrecondition, errNoPTY)
		}
	default:
		return connect.NewError(connect.CodeInvalidArgument, errors.New("input is required"))
	}
	if _, err := f.Write(data); err != nil {
		return connect.NewError(connect.CodeInternal, fmt.Errorf("write input: %w", err))
	}
	return nil
}

func (s *processService) SendInput(ctx context.Context, req *connect.Request[pb.SendInputRequest]) (*connect.Response[pb.SendInputResponse], error) {
	p, err := s.a.procs.get(req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	if err := p.write(req.Msg.GetInput()); err != nil {
		return nil, err
	}
	return connect.NewResponse(&pb.SendInputResponse{}), nil
}

func (s *processService) StreamInput(ctx context.Context, stream *connect.ClientStream[pb.StreamInputRequest]) (*connect.Response[pb.StreamInputResponse], error) {
	var p *proc
	for stream.Receive() {
		switch ev := stream.Msg().GetEvent().(type) {
		case *pb.StreamInputRequest_Start:
			got, err := s.a.procs.get(ev.Start.GetProcess())
			if err != nil {
				return nil, err
			}
			p = got
		case *pb.StreamInputRequest_Data:
			if p == nil {
				return nil, connect.NewError(connect.CodeFailedPrecondition, errors.New("start event must come first"))
			}
			if err := p.write(ev.Data.GetInput()); err != nil {
				return nil, err
			}
		case *pb.StreamInputRequest_Keepalive:
		}
	}
	if err := stream.Err(); err != nil && !errors.Is(err, io.EOF) {
		return nil, err
	}
	return connect.NewResponse(&pb.StreamInputResponse{}), nil
}

func (s *processService) SendSignal(ctx context.Context, req *connect.Request[pb.SendSignalRequest]) (*connect.Response[pb.SendSignalResponse], error) {
	p, err := s.a.procs.get(req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	var sig unix.Signal
	switch req.Msg.GetSignal() {
	case pb.Signal_SIGNAL_SIGKILL:
		sig = unix.SIGKILL
	case pb.Signal_SIGNAL_SIGTERM:
		sig = unix.SIGTERM
	default:
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("unsupported signal %v", req.Msg.GetSignal()))
	}
	if !p.running() {
		return nil, processNotFound("process with pid %d not found", p.pid)
	}
	if err := p.signal(sig); err != nil {
		return nil, connect.NewError(connect.CodeInternal, fmt.Errorf("signal: %w", err))
	}
	return connect.NewResponse(&pb.SendSignalResponse{}), nil
}

func (s *processService) CloseStdin(ctx context.Context, req *connect.Request[pb.CloseStdinRequest]) (*connect.Response[pb.CloseStdinResponse], error) {
	p, err := s.a.procs.get(req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	p.inMu.Lock()
	defer p.inMu.Unlock()
	if p.pty != nil {
		return nil, connect.NewError(connect.CodeFailedPrecondition, errors.New("cannot close stdin of a pty process; send Ctrl+D instead"))
	}
	if p.stdin != nil {
		p.stdin.Close()
		p.stdin = nil
	}
	return connect.NewResponse(&pb.CloseStdinResponse{}), nil
}
