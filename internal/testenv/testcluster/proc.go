package testcluster

import (
	"os"
	"os/exec"
	"syscall"
	"time"
)

// Proc is one long-running child, its output in its own log file.
type Proc struct {
	Name string
	Cmd  *exec.Cmd
	// Log is the file that holds its stdout and stderr.
	Log    string
	exited chan struct{}
}

// Spawn starts argv with env added to this process's environment, its
// output appended to log. With pdeathsig the child is SIGKILLed if the
// starting thread dies without its clean-up (only for a process whose
// threads never exit early: a goroutine that locked its thread and
// returns would end the child).
func Spawn(name string, argv, env []string, log string, pdeathsig bool) (*Proc, error) {
	f, err := os.OpenFile(log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = f, f
	if pdeathsig {
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &Proc{Name: name, Cmd: cmd, Log: log, exited: make(chan struct{})}
	go func() { cmd.Wait(); close(p.exited) }()
	return p, nil
}

// Dead says whether the process has exited.
func (p *Proc) Dead() bool {
	select {
	case <-p.exited:
		return true
	default:
		return false
	}
}

// Tail is the last 4000 bytes of the log.
func (p *Proc) Tail() string {
	b, _ := os.ReadFile(p.Log)
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}

// Signal sends sig and, when the process has not exited after grace,
// SIGKILL; it returns once the process is gone.
func (p *Proc) Signal(sig syscall.Signal, grace time.Duration) {
	if p.Dead() {
		return
	}
	p.Cmd.Process.Signal(sig)
	select {
	case <-p.exited:
	case <-time.After(grace):
		p.Cmd.Process.Kill()
		<-p.exited
	}
}

// Term sends SIGTERM, then SIGKILL after grace.
func (p *Proc) Term(grace time.Duration) { p.Signal(syscall.SIGTERM, grace) }

// execCombined runs argv to its end and returns its combined output.
func execCombined(argv []string) (string, error) {
	out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput()
	return string(out), err
}
