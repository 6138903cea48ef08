// Package lxcfs runs the lxcfs FUSE filesystem that gives runc sandboxes a
// /proc that reports their own limits: /proc/meminfo shows the memory
// cgroup's limit (so free, top and every runtime that sizes its heap from
// MemTotal see the sandbox, not the host), /proc/cpuinfo and /proc/stat
// show as many CPUs as the CPU quota allows, /proc/uptime starts at the
// sandbox's start, /proc/loadavg, /proc/diskstats and /proc/swaps are the
// sandbox's own. The node bind-mounts those files (read-only) over the
// sandbox's procfs; runc allows exactly these /proc destinations for that
// purpose. gVisor (runsc) has its own /proc and does not need it.
//
// The command line (Debian 12, lxcfs 5.0.3; cgroup v1, hybrid and v2):
//
//	lxcfs --foreground --enable-loadavg --enable-cfs --pidfile <dir>/lxcfs.pid <dir>/mnt
//
// --enable-cfs makes the CPU view follow the CFS quota (cpu.cfs_quota_us or
// cpu.max), which is how Cubicle limits CPUs (there is no cpuset), and
// --enable-loadavg computes per-cgroup load averages.
//
// Unlike buildkitd, lxcfs must outlive `cubicle serve`: sandboxes keep
// running across a serve restart and their /proc files are views of this
// one FUSE mount. If lxcfs exits, the bind mounts in every sandbox created
// before become files of a dead FUSE connection, whose reads fail at once
// with ENOTCONN ("Transport endpoint is not connected"; nothing hangs) and
// stay failed, because a bind mount keeps the superblock it was made from.
// So lxcfs runs in its own session without a parent-death signal; serve
// adopts a live one from the pid file when it starts, restarts a dead one
// (new sandboxes get the new mount; the ones whose views went stale are
// logged), and stops it on shutdown only when no sandbox is left. lxcfs
// also exits by itself when its mount is unmounted.
package lxcfs

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cubicle-dev/cubicle/internal/runtime"
)

// ProcFiles are the /proc files lxcfs virtualises that the node binds over
// a sandbox's procfs (runc's allow-list for /proc mount destinations, less
// slabinfo, which is masked as host-kernel detail).
var ProcFiles = []string{
	"/proc/cpuinfo", "/proc/diskstats", "/proc/loadavg", "/proc/meminfo",
	"/proc/stat", "/proc/swaps", "/proc/uptime",
}

// SysFiles are the /sys files lxcfs virtualises: the online CPU list that
// glibc's sysconf(_SC_NPROCESSORS_ONLN) (Python's os.cpu_count, make -j
// helpers) reads.
var SysFiles = []string{"/sys/devices/system/cpu/online"}

// Config says how to run lxcfs.
type Config struct {
	Binary string // default "lxcfs" on PATH
	// Dir holds the mountpoint (<Dir>/mnt), the pid file and lxcfs's log;
	// it must be this server's own (never /var/lib/lxcfs), so a system
	// lxcfs is never touched.
	Dir string
	// CheckInterval is how often the supervisor checks lxcfs; default 1s.
	CheckInterval time.Duration
	// ReadyTimeout bounds the wait for a new lxcfs to serve files; default 10s.
	ReadyTimeout time.Duration
	Logger       *slog.Logger
	// OnRestart is called after lxcfs was restarted because it died
	// (sandboxes created before hold stale views).
	OnRestart func()
	// CPUs caps the CPU time lxcfs may use (a CFS quota on its own
	// cgroup, cgroup_linux.go); 0 leaves it unbounded.
	CPUs float64
	// Cgroup names that cgroup (a top-level one in the cpu hierarchy);
	// default "cubicle-lxcfs". One per lxcfs: two servers on one host
	// need two names.
	Cgroup string
}

// Daemon is the supervised lxcfs.
type Daemon struct {
	cfg     Config
	mnt     string
	pidFile string
	args    []string
	log     *slog.Logger
	files   []string
	cg      *cpuCgroup // nil: no CPU bound

	mu       sync.Mutex
	pid      int
	exited   chan struct{} // closed when a child we started exits; nil when adopted
	restarts int
	closed   bool
	stopCh   chan struct{}
	done     chan struct{}
}

// ErrNotFound: no lxcfs binary.
var ErrNotFound = errors.New("lxcfs: binary not found (install the lxcfs package: scripts/install, or apt-get install lxcfs; or run serve with --lxcfs=false)")

// Start adopts the lxcfs a previous serve left at cfg.Dir, or starts one,
// waits until it serves /proc/meminfo, and supervises it until Close or
// Release.
func Start(ctx context.Context, cfg Config) (*Daemon, error) {
	if cfg.Dir == "" {
		return nil, errors.New("lxcfs: Config.Dir is required")
	}
	if cfg.CPUs < 0 {
		return nil, fmt.Errorf("%w: CPUs %g is negative", ErrCgroup, cfg.CPUs)
	}
	if cfg.CPUs > 0 {
		if cfg.Cgroup == "" {
			cfg.Cgroup = "cubicle-lxcfs"
		}
		if err := checkCPUBound(cfg.Cgroup, cfg.CPUs); err != nil {
			return nil, err
		}
	}
	dir, err := filepath.Abs(cfg.Dir)
	if err != nil {
		return nil, err
	}
	cfg.Dir = dir
	if cfg.Binary == "" {
		cfg.Binary = "lxcfs"
	}
	bin, err := exec.LookPath(cfg.Binary)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrNotFound, err)
	}
	cfg.Binary = bin
	if cfg.CheckInterval == 0 {
		cfg.CheckInterval = time.Second
	}
	if cfg.ReadyTimeout == 0 {
		cfg.ReadyTimeout = 10 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	d := &Daemon{
		cfg: cfg, mnt: filepath.Join(dir, "mnt"), pidFile: filepath.Join(dir, "lxcfs.pid"),
		log: cfg.Logger.With("component", "lxcfs"), stopCh: make(chan struct{}), done: make(chan struct{}),
	}
	d.args = []string{"--foreground", "--enable-loadavg", "--enable-cfs", "--pidfile", d.pidFile, d.mnt}
	if cfg.CPUs > 0 {
		if d.cg, err = newCPUCgroup(cfg.Cgroup, cfg.CPUs); err != nil {
			return nil, err
		}
	}
	if err := os.MkdirAll(d.mnt, 0o755); err != nil {
		return nil, fmt.Errorf("lxcfs: %w", err)
	}
	if pid := d.adoptable(); pid > 0 {
		// One started by a serve without the bound, or a different one.
		if d.cg != nil {
			if err := d.cg.add(pid); err != nil {
				return nil, errors.Join(err, d.removeCgroup())
			}
		}
		d.pid = pid
		d.log.Info("lxcfs adopted", "pid", pid, "mount", d.mnt)
	} else if err := d.spawn(ctx); err != nil {
		d.removeCgroup()
		return nil, err
	}
	d.files = available(d.mnt)
	if !contains(d.files, "/proc/meminfo") {
		d.stop()
		return nil, fmt.Errorf("lxcfs: %s serves no proc/meminfo", d.mnt)
	}
	go d.supervise()
	return d, nil
}

// Mountpoint is where lxcfs is mounted ("" for a nil Daemon: no lxcfs).
func (d *Daemon) Mountpoint() string {
	if d == nil {
		return ""
	}
	return d.mnt
}

// Files are the sandbox paths (/proc/meminfo...) this lxcfs serves (none
// for a nil Daemon).
func (d *Daemon) Files() []string {
	if d == nil {
		return nil
	}
	return append([]string(nil), d.files...)
}

// Args is lxcfs's command line (without the binary).
func (d *Daemon) Args() []string { return append([]string(nil), d.args...) }

// PID is the current lxcfs's pid (0 while it is being restarted).
func (d *Daemon) PID() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.pid
}

// Restarts counts restarts after lxcfs died.
func (d *Daemon) Restarts() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.restarts
}

// BindMounts are the read-only mounts that put files (sandbox paths, as
// Files returns) of the lxcfs mounted at mnt into a sandbox.
func BindMounts(mnt string, files []string) []runtime.Mount {
	out := make([]runtime.Mount, 0, len(files))
	for _, f := range files {
		out = append(out, runtime.Mount{Source: filepath.Join(mnt, f), Destination: f, ReadOnly: true})
	}
	return out
}

// available lists the files of ProcFiles and SysFiles that mnt serves.
func available(mnt string) []string {
	var out []string
	for _, f := range append(append([]string(nil), ProcFiles...), SysFiles...) {
		if fi, err := os.Stat(filepath.Join(mnt, f)); err == nil && fi.Mode().IsRegular() {
			out = append(out, f)
		}
	}
	return out
}

func contains(ss []string, s string) bool {
	for _, x := range ss {
		if x == s {
			return true
		}
	}
	return false
}

// adoptable is the pid of a live lxcfs serving our mountpoint (left by a
// previous serve), or 0.
func (d *Daemon) adoptable() int {
	b, err := os.ReadFile(d.pidFile)
	if err != nil {
		return 0
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 || !d.isOurs(pid) {
		return 0
	}
	if !mounted(d.mnt) || readable(filepath.Join(d.mnt, "proc/meminfo"), 2*time.Second) != nil {
		// Alive but not serving (hung or unmounted): replace it.
		d.log.Warn("lxcfs from the pid file is not serving; replacing it", "pid", pid)
		syscall.Kill(pid, syscall.SIGKILL)
		return 0
	}
	return pid
}

// isOurs: pid is an lxcfs whose command line names our mountpoint (a pid
// file can outlive its process, and pids are reused).
func (d *Daemon) isOurs(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return false
	}
	args := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
	return len(args) > 1 && filepath.Base(args[0]) == "lxcfs" && args[len(args)-1] == d.mnt
}

// mounted says whether mnt is a mountpoint (of lxcfs) in our namespace.
func mounted(mnt string) bool {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && f[4] == mnt {
			return true
		}
	}
	return false
}

// readable reads path with a bound: a hung FUSE daemon must not hang us
// (the reader goroutine is left behind in that case).
func readable(path string, timeout time.Duration) error {
	errc := make(chan error, 1)
	go func() {
		b, err := os.ReadFile(path)
		if err == nil && len(b) == 0 {
			err = errors.New("empty")
		}
		errc <- err
	}()
	select {
	case err := <-errc:
		return err
	case <-time.After(timeout):
		return fmt.Errorf("read %s: timed out after %s", path, timeout)
	}
}

// unmountStale lazily unmounts whatever is left at the mountpoint (a dead
// lxcfs's mount answers ENOTCONN).
func (d *Daemon) unmountStale() {
	for i := 0; i < 8 && mounted(d.mnt); i++ {
		if err := unix.Unmount(d.mnt, unix.MNT_DETACH); err != nil {
			d.log.Warn("lxcfs: unmount stale mount", "mount", d.mnt, "err", err)
			return
		}
	}
}

// spawn starts lxcfs in its own session (it must survive serve) with its
// output appended to <Dir>/lxcfs.log, and waits until it serves files.
func (d *Daemon) spawn(ctx context.Context) error {
	d.unmountStale()
	os.Remove(d.pidFile)
	logf, err := os.OpenFile(filepath.Join(d.cfg.Dir, "lxcfs.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("lxcfs: %w", err)
	}
	defer logf.Close()
	if fi, err := logf.Stat(); err == nil && fi.Size() > 4<<20 {
		logf.Truncate(0)
	}
	cmd := exec.Command(d.cfg.Binary, d.args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Dir = "/"
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("lxcfs: start %s: %w", d.cfg.Binary, err)
	}
	exited := make(chan struct{})
	var waitErr error
	go func() { waitErr = cmd.Wait(); close(exited) }()
	// Moved before it serves a single read; threads it starts later are
	// born in the cgroup.
	if d.cg != nil {
		if err := d.cg.add(cmd.Process.Pid); err != nil {
			cmd.Process.Kill()
			<-exited
			d.unmountStale()
			return err
		}
	}
	deadline := time.Now().Add(d.cfg.ReadyTimeout)
	for {
		if mounted(d.mnt) && readable(filepath.Join(d.mnt, "proc/meminfo"), time.Second) == nil {
			break
		}
		select {
		case <-exited:
			d.unmountStale()
			return fmt.Errorf("lxcfs: %s exited at start (%v): %s", d.cfg.Binary, waitErr, d.logTail())
		case <-ctx.Done():
			cmd.Process.Kill()
			<-exited
			d.unmountStale()
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			<-exited
			d.unmountStale()
			return fmt.Errorf("lxcfs: not serving %s after %s: %s", d.mnt, d.cfg.ReadyTimeout, d.logTail())
		}
	}
	d.mu.Lock()
	d.pid, d.exited = cmd.Process.Pid, exited
	d.mu.Unlock()
	d.log.Info("lxcfs started", "pid", cmd.Process.Pid, "mount", d.mnt)
	return nil
}

func (d *Daemon) logTail() string {
	b, _ := os.ReadFile(filepath.Join(d.cfg.Dir, "lxcfs.log"))
	b = bytes.TrimSpace(b)
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return string(b)
}

// alive says whether the current lxcfs still runs and is mounted. It reads
// nothing through FUSE, so a busy lxcfs is not mistaken for a dead one.
func (d *Daemon) alive() bool {
	d.mu.Lock()
	pid, exited := d.pid, d.exited
	d.mu.Unlock()
	if pid == 0 {
		return false
	}
	if exited != nil {
		select {
		case <-exited:
			return false
		default:
		}
	} else if !d.isOurs(pid) {
		return false
	}
	return mounted(d.mnt)
}

// supervise restarts lxcfs (with backoff) when it dies.
func (d *Daemon) supervise() {
	defer close(d.done)
	const backoffMax = 30 * time.Second
	backoff := 200 * time.Millisecond
	for {
		select {
		case <-d.stopCh:
			return
		case <-time.After(d.cfg.CheckInterval):
		}
		if d.alive() {
			backoff = 200 * time.Millisecond
			continue
		}
		d.mu.Lock()
		old := d.pid
		d.pid, d.exited = 0, nil
		d.mu.Unlock()
		if old != 0 {
			d.log.Error("lxcfs died; restarting it. Sandboxes created before keep their dead /proc views (reads fail with ENOTCONN) until they are recreated", "pid", old)
			if d.isOurs(old) {
				syscall.Kill(old, syscall.SIGKILL) // alive but unmounted
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), d.cfg.ReadyTimeout+time.Second)
		err := d.spawn(ctx)
		cancel()
		if err != nil {
			d.log.Error("lxcfs restart failed", "err", err, "retry_in", backoff)
			select {
			case <-d.stopCh:
				return
			case <-time.After(backoff):
			}
			backoff = min(backoff*2, backoffMax)
			continue
		}
		d.mu.Lock()
		d.restarts++
		d.mu.Unlock()
		if d.cfg.OnRestart != nil {
			d.cfg.OnRestart()
		}
	}
}

func (d *Daemon) endSupervision() bool {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		<-d.done
		return false
	}
	d.closed = true
	close(d.stopCh)
	d.mu.Unlock()
	<-d.done
	return true
}

// Release stops supervising and leaves lxcfs running, for the sandboxes
// that outlive this serve (the next one adopts it).
func (d *Daemon) Release() {
	if d.endSupervision() {
		d.log.Info("lxcfs left running for the sandboxes still running", "pid", d.PID())
	}
}

// Close stops supervising, kills lxcfs and removes its mount. Only for when no sandbox uses it any more.
func (d *Daemon) Close() error {
	if !d.endSupervision() {
		return nil
	}
	return d.stop()
}

func (d *Daemon) stop() error {
	d.mu.Lock()
	pid, exited := d.pid, d.exited
	d.pid, d.exited = 0, nil
	d.mu.Unlock()
	if pid != 0 && (exited != nil || d.isOurs(pid)) {
		// lxcfs keeps no state, and takes ~4 s to act on SIGTERM (or on
		// an unmount): SIGKILL, then the mount is removed below.
		syscall.Kill(pid, syscall.SIGKILL)
		d.waitGone(pid, exited, 5*time.Second)
	}
	var err error
	if mounted(d.mnt) {
		if uerr := unix.Unmount(d.mnt, unix.MNT_DETACH); uerr != nil && !errors.Is(uerr, unix.EINVAL) {
			err = fmt.Errorf("lxcfs: unmount %s: %w", d.mnt, uerr)
		}
	}
	os.Remove(d.pidFile)
	return errors.Join(err, d.removeCgroup())
}

// removeCgroup removes lxcfs's cgroup (nothing runs in it any more).
func (d *Daemon) removeCgroup() error {
	if d.cg == nil {
		return nil
	}
	return d.cg.remove()
}

// CgroupDir is the cgroup that bounds lxcfs's CPU ("" when unbounded).
func (d *Daemon) CgroupDir() string {
	if d == nil || d.cg == nil {
		return ""
	}
	return d.cg.dir
}

// waitGone waits for a child (exited) or an adopted process (polled; a
// zombie no one reaped yet counts as gone).
func (d *Daemon) waitGone(pid int, exited chan struct{}, max time.Duration) bool {
	if exited != nil {
		select {
		case <-exited:
			return true
		case <-time.After(max):
			return false
		}
	}
	deadline := time.Now().Add(max)
	for time.Now().Before(deadline) {
		if !d.isOurs(pid) {
			return true
		}
		time.Sleep(20 * time.Millisecond)
	}
	return false
}
