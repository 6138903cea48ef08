package agent

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// The template start command (CEP-0019: "startCmd started once by the agent as
// the template user"). POST /init carries it; the agent forks it once per agent
// lifetime with its output appended to a log file and its state in a status
// file, both under Config.LogDir:
//
//	start-cmd.log     stdout+stderr, appended, mode 0644, owned by the user
//	start-cmd.status  "running pid=<pid>\n", then "exited code=<n>\n" or
//	                  "signaled <SIGNAME>\n"; same ownership, replaced atomically
//
// It is deliberately not a process-service process: it is not in List and
// cannot be reached by Connect/SendSignal, so an SDK's commands.list() shows
// only what the SDK started, and its output goes straight to the file (no
// pipes whose reader could stall it). It is reaped like every other child:
// through Agent.reaper (the single wait4 loop in ReapAll mode), and whatever it
// daemonizes is an orphan that loop reaps. Agent.Shutdown terminates its group.

const (
	// DefaultLogDir is where the start command's log and status files go.
	DefaultLogDir      = "/var/log/cubicle"
	startCmdLogName    = "start-cmd.log"
	startCmdStatusName = "start-cmd.status"
	// ticksPerSecond is USER_HZ, the unit of /proc/<pid>/stat starttime; it
	// is 100 on every Linux architecture the agent is built for.
	ticksPerSecond = 100
)

// Errors of startUser parsing (ErrUserNotFound covers an unknown name).
var (
	ErrInvalidUserSpec = errors.New("agent: invalid user spec")
	ErrGroupNotFound   = errors.New("agent: group not found")
)

// startCmdError is a start command that could not be started after its
// request was validated (log directory, fork); /init answers 500.
type startCmdError struct{ err error }

func (e *startCmdError) Error() string { return "start command: " + e.err.Error() }
func (e *startCmdError) Unwrap() error { return e.err }

// startProc is the running (or finished) start command.
type startProc struct {
	pid  int
	done chan struct{} // closed once reaped and the final status is written
}

func (a *Agent) logDir() string {
	if a.cfg.LogDir != "" {
		return a.cfg.LogDir
	}
	return DefaultLogDir
}

// resolveUserSpec resolves "name", "uid", "name:group" or "uid:gid" (groups
// by name or number) as an OCI image's USER does: a numeric uid without a
// passwd entry is allowed and runs with HOME=/ and gid 0 unless a group is
// given, which is what the template's build steps ran as.
func (a *Agent) resolveUserSpec(spec string) (*sysUser, error) {
	userPart, groupPart, hasGroup := strings.Cut(spec, ":")
	if userPart == "" || (hasGroup && groupPart == "") || strings.ContainsAny(groupPart, ":") {
		return nil, fmt.Errorf("%w: %q (want user, uid or uid:gid)", ErrInvalidUserSpec, spec)
	}
	var u *sysUser
	if isDigits(userPart) {
		uid, err := parseID(userPart)
		if err != nil {
			return nil, fmt.Errorf("%w: %q: %v", ErrInvalidUserSpec, spec, err)
		}
		if u, err = a.lookupUID(uid); err != nil {
			u = &sysUser{Name: userPart, UID: uid, GID: 0, Home: "/", Groups: []uint32{0}}
		}
	} else {
		var err error
		if u, err = a.lookupUser(userPart); err != nil {
			return nil, err
		}
	}
	if hasGroup {
		gid, err := a.lookupGroup(groupPart)
		if err != nil {
			return nil, err
		}
		u.GID = gid
		u.Groups = a.supplementaryGroups(u.Name, gid)
	}
	return u, nil
}

func isDigits(s string) bool {
	for _, c := range s {
		if c < '0' || c > '9' {
			return false
		}
	}
	return s != ""
}

// parseID parses a uid/gid; 4294967295 is (uid_t)-1, which set*id reads as
// "unchanged", so it is refused.
func parseID(s string) (uint32, error) {
	n, err := strconv.ParseUint(s, 10, 32)
	if err != nil {
		return 0, err
	}
	if n == 1<<32-1 {
		return 0, fmt.Errorf("id %s is reserved", s)
	}
	return uint32(n), nil
}

func (a *Agent) lookupUID(uid uint32) (*sysUser, error) {
	rows, err := readColonFile(a.cfg.PasswdPath)
	if err != nil {
		return nil, fmt.Errorf("%w: %d: %v", ErrUserNotFound, uid, err)
	}
	for _, f := range rows {
		if len(f) >= 7 && f[2] == strconv.FormatUint(uint64(uid), 10) {
			return a.lookupUser(f[0])
		}
	}
	return nil, fmt.Errorf("%w: %d", ErrUserNotFound, uid)
}

func (a *Agent) lookupGroup(name string) (uint32, error) {
	if isDigits(name) {
		gid, err := parseID(name)
		if err != nil {
			return 0, fmt.Errorf("%w: group %q: %v", ErrInvalidUserSpec, name, err)
		}
		return gid, nil
	}
	rows, err := readColonFile(a.cfg.GroupPath)
	if err != nil {
		return 0, fmt.Errorf("%w: %s: %v", ErrGroupNotFound, name, err)
	}
	for _, f := range rows {
		if len(f) >= 3 && f[0] == name {
			if gid, err := parseID(f[2]); err == nil {
				return gid, nil
			}
		}
	}
	return 0, fmt.Errorf("%w: %s", ErrGroupNotFound, name)
}

// startCmdCwd is startWorkdir (relative to the user's home) when given, which
// must be a directory the user can reach; otherwise the user's home, or / when
// the home does not exist (an image USER without a home must still start).
func startCmdCwd(u *sysUser, workdir string) (string, error) {
	cwd := u.Home
	if workdir != "" {
		var err error
		if cwd, err = resolvePath(workdir, u); err != nil {
			return "", err
		}
	}
	var statErr error
	_ = asUser(u, func() error {
		fi, err := os.Stat(cwd)
		switch {
		case err != nil:
			statErr = err
		case !fi.IsDir():
			statErr = fmt.Errorf("%w: %s", ErrNotDir, cwd)
		}
		return nil
	})
	if statErr != nil {
		if workdir == "" {
			return "/", nil
		}
		return "", statErr
	}
	return cwd, nil
}

// startShell is bash as a login shell (so /etc/profile and ~/.profile apply,
// like the SDK's commands), or POSIX sh where the image has no bash.
func startShell(cmd string) (string, []string) {
	if fi, err := os.Stat("/bin/bash"); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
		return "/bin/bash", []string{"/bin/bash", "-l", "-c", cmd}
	}
	return "/bin/sh", []string{"/bin/sh", "-c", cmd}
}

// startStatusFromThisBoot reports whether a status file exists that was
// written since PID 1 started, i.e. by an earlier agent of this boot (an agent
// that is not PID 1 restarted). As PID 1 any existing file predates us: it is
// left from an earlier boot of the same root filesystem, and the command runs
// again, like a container's CMD.
func (a *Agent) startStatusFromThisBoot() bool {
	fi, err := os.Lstat(filepath.Join(a.logDir(), startCmdStatusName))
	if err != nil {
		return false
	}
	initStart, err := pid1StartTime()
	if err != nil {
		return false // cannot tell: assume a new boot, as PID 1 would
	}
	return !fi.ModTime().Before(initStart)
}

// pid1StartTime is the wall-clock start of this PID namespace's init, from
// /proc/stat btime plus /proc/1/stat starttime.
func pid1StartTime() (time.Time, error) {
	stat, err := os.ReadFile("/proc/stat")
	if err != nil {
		return time.Time{}, err
	}
	var btime int64 = -1
	for line := range strings.Lines(string(stat)) {
		if v, ok := strings.CutPrefix(line, "btime "); ok {
			btime, err = strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			if err != nil {
				return time.Time{}, err
			}
		}
	}
	if btime < 0 {
		return time.Time{}, errors.New("no btime in /proc/stat")
	}
	b, err := os.ReadFile("/proc/1/stat")
	if err != nil {
		return time.Time{}, err
	}
	// comm may contain spaces and parentheses; the fields follow the last ')'.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return time.Time{}, errors.New("malformed /proc/1/stat")
	}
	fields := strings.Fields(string(b[i+1:]))
	const startIdx = 22 - 3 // field 22 (starttime); fields[0] is field 3
	if len(fields) <= startIdx {
		return time.Time{}, errors.New("short /proc/1/stat")
	}
	ticks, err := strconv.ParseUint(fields[startIdx], 10, 64)
	if err != nil {
		return time.Time{}, err
	}
	return time.Unix(btime, 0).Add(time.Duration(ticks) * time.Second / ticksPerSecond), nil
}

// openOwned opens path without following a symlink there (the directory may
// come from the image) and makes it mode 0644 owned by u.
func openOwned(path string, flag int, u *sysUser) (*os.File, error) {
	f, err := os.OpenFile(path, flag|syscall.O_NOFOLLOW, 0o644)
	if err != nil {
		return nil, err
	}
	if os.Geteuid() == 0 {
		if err := f.Chown(int(u.UID), int(u.GID)); err != nil {
			f.Close()
			return nil, err
		}
	}
	if err := f.Chmod(0o644); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// writeStartStatus replaces the status file atomically, so a reader (the
// control plane's readiness probe, a user's cat) never sees it half written.
func (a *Agent) writeStartStatus(u *sysUser, status string) error {
	path := filepath.Join(a.logDir(), startCmdStatusName)
	tmp := path + ".tmp"
	f, err := openOwned(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, u)
	if err != nil {
		return err
	}
	_, err = f.WriteString(status + "\n")
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		_ = os.Remove(tmp)
	}
	return err
}

func exitStatusLine(ws unix.WaitStatus) string {
	switch {
	case ws.Exited():
		return "exited code=" + strconv.Itoa(ws.ExitStatus())
	case ws.Signaled():
		name := unix.SignalName(ws.Signal())
		if name == "" {
			name = strconv.Itoa(int(ws.Signal()))
		}
		return "signaled " + name
	}
	return "exited code=-1"
}

// launchStartCmd forks cmd as u in cwd with env and records it in the status
// file. It returns as soon as the child exists; a goroutine waits for it.
func (a *Agent) launchStartCmd(u *sysUser, cmd, cwd string, env []string) (*startProc, error) {
	dir := a.logDir()
	if _, err := os.Lstat(dir); errors.Is(err, os.ErrNotExist) {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, &startCmdError{err}
		}
		// MkdirAll's mode is subject to the umask.
		if err := os.Chmod(dir, 0o755); err != nil {
			return nil, &startCmdError{err}
		}
	}
	logf, err := openOwned(filepath.Join(dir, startCmdLogName), os.O_WRONLY|os.O_CREATE|os.O_APPEND, u)
	if err != nil {
		return nil, &startCmdError{err}
	}
	defer logf.Close()
	null, err := os.Open(os.DevNull)
	if err != nil {
		return nil, &startCmdError{err}
	}
	defer null.Close()
	// Its own process group, so Shutdown can signal it with its children and a
	// signal meant for a process-service group never reaches it.
	sys := &syscall.SysProcAttr{Setpgid: true}
	if os.Geteuid() == 0 {
		sys.Credential = &syscall.Credential{Uid: u.UID, Gid: u.GID, Groups: u.Groups}
	}
	shell, argv := startShell(cmd)
	attr := &syscall.ProcAttr{Dir: cwd, Env: env, Files: []uintptr{null.Fd(), logf.Fd(), logf.Fd()}, Sys: sys}
	pid, waitc, err := a.reaper.spawn(func() (int, error) { return a.forkExec(shell, argv, attr) })
	if err != nil {
		return nil, &startCmdError{fmt.Errorf("start %s: %w", shell, err)}
	}
	sp := &startProc{pid: pid, done: make(chan struct{})}
	// Written before the waiter starts, so "running" can never overwrite the
	// final status of a command that exits at once.
	if err := a.writeStartStatus(u, "running pid="+strconv.Itoa(pid)); err != nil {
		a.log.Warn("start command: write status", "err", err)
	}
	a.log.Info("start command started", "pid", pid, "user", u.Name, "uid", u.UID, "cwd", cwd)
	go func() {
		ws := <-waitc
		line := exitStatusLine(ws)
		if err := a.writeStartStatus(u, line); err != nil {
			a.log.Warn("start command: write status", "err", err)
		}
		a.log.Info("start command ended", "pid", pid, "status", line)
		close(sp.done)
	}()
	return sp, nil
}

// terminate stops the start command's process group: SIGTERM, then SIGKILL
// after terminateGrace, as for process-service processes.
func (sp *startProc) terminate() {
	select {
	case <-sp.done:
		return
	default:
	}
	signalGroup(sp.pid, unix.SIGTERM)
	select {
	case <-sp.done:
		return
	case <-time.After(terminateGrace):
	}
	signalGroup(sp.pid, unix.SIGKILL)
	select {
	case <-sp.done:
	case <-time.After(terminateGrace):
	}
}

func signalGroup(pid int, sig unix.Signal) {
	_ = unix.Kill(-pid, sig)
	_ = unix.Kill(pid, sig)
}
