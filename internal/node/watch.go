package node

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"os"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cubicle-dev/cubicle/internal/runtime"
)

// Exit reports that a running sandbox's runtime process ended without the
// node ending it (the agent crashed or was killed, the OOM killer, someone
// ran `runc kill` behind the platform's back).
type Exit struct {
	ID  string
	Pid int
	At  time.Time
	// OOM: the sandbox's memory cgroup recorded an OOM kill.
	OOM bool
}

// Exits implements Node. In-process the stream is the node's own channel,
// open for the node's life; the reader stops at its ctx (a remote node ends
// its gRPC stream there).
func (l *Local) Exits(context.Context) (<-chan Exit, error) { return l.exits, nil }

// exitWatch watches one sandbox's runtime process: the container's init
// under runc and crun, the sandbox process under runsc (which exits within
// milliseconds of its init, while `runsc state` still says running for a
// second or two).
type exitWatch struct {
	pid  int
	stop chan struct{}
	f    *os.File // the pidfd; nil when polling /proc instead
}

// watch starts watching id's process pid, replacing any earlier watch.
// Callers hold no lock.
func (l *Local) watch(id string, pid int) {
	if pid <= 0 {
		return
	}
	w := &exitWatch{pid: pid, stop: make(chan struct{})}
	fd, err := unix.PidfdOpen(pid, unix.PIDFD_NONBLOCK)
	if errors.Is(err, unix.ESRCH) {
		return // already gone (and reaped): Get and the reconciler see that
	}
	if err == nil {
		w.f = os.NewFile(uintptr(fd), "pidfd:"+strconv.Itoa(pid))
	}
	l.mu.Lock()
	if old := l.watches[id]; old != nil {
		old.close()
	}
	l.watches[id] = w
	l.mu.Unlock()
	go l.await(id, w)
}

// unwatch stops watching id: the node is about to end or checkpoint it.
func (l *Local) unwatch(id string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if w := l.watches[id]; w != nil {
		w.close()
		delete(l.watches, id)
	}
}

func (w *exitWatch) close() {
	close(w.stop)
	if w.f != nil {
		w.f.Close() // wakes await's Read with ErrClosed
	}
}

// await blocks until w's process exits (a pidfd becomes readable then; the
// wait parks in the runtime's poller, not a thread) or the watch is stopped,
// and reports an exit only while the watch is still id's current one.
func (l *Local) await(id string, w *exitWatch) {
	if w.f != nil {
		rc, err := w.f.SyscallConn()
		if err != nil {
			return
		}
		exited := false
		rerr := rc.Read(func(fd uintptr) bool {
			p := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
			n, _ := unix.Poll(p, 0)
			exited = n > 0
			return exited
		})
		if rerr != nil || !exited {
			return // stopped
		}
	} else {
		// No pidfd (kernel < 5.10): poll /proc.
		t := time.NewTicker(250 * time.Millisecond)
		defer t.Stop()
		for pidAlive(w.pid) {
			select {
			case <-w.stop:
				return
			case <-t.C:
			}
		}
	}
	e := Exit{ID: id, Pid: w.pid, At: time.Now().UTC(), OOM: l.oomKilled(id)}
	l.mu.Lock()
	current := l.watches[id] == w
	if current {
		delete(l.watches, id)
	}
	l.mu.Unlock()
	if !current {
		return
	}
	if w.f != nil {
		w.f.Close()
	}
	l.cfg.Logger.Warn("sandbox process exited", "sandbox", id, "pid", w.pid, "oom", e.OOM)
	select {
	case l.exits <- e:
	case <-w.stop:
	}
}

// pidAlive reports whether pid exists and is not a zombie.
func pidAlive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	// "pid (comm) S ...": comm may hold spaces and parentheses.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 >= len(b) {
		return false
	}
	return b[i+2] != 'Z' && b[i+2] != 'X'
}

// cgroupReader is a runtime driver that exposes its sandboxes' cgroup files
// (the OCI driver does).
type cgroupReader interface {
	CgroupFile(id, controller, file string) ([]byte, error)
}

// oomKilled reports whether id's memory cgroup recorded an OOM kill
// (memory.events on cgroup v2, memory.oom_control on v1).
func (l *Local) oomKilled(id string) bool {
	cr, ok := l.cfg.Runtime.(cgroupReader)
	if !ok {
		return false
	}
	for _, f := range []string{"memory.events", "memory.oom_control"} {
		if b, err := cr.CgroupFile(id, "memory", f); err == nil {
			return oomKills(b) > 0
		}
	}
	return false
}

// oomKills parses the "oom_kill N" line of memory.events or memory.oom_control.
func oomKills(b []byte) int {
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "oom_kill "); ok {
			n, _ := strconv.Atoi(strings.TrimSpace(v))
			return n
		}
	}
	return 0
}

// adopt watches the running sandboxes of a listing that no operation of
// this node touched since gens was taken (so a sandbox paused or deleted
// meanwhile is not mistaken for one that died): after a restart, Recover's
// List is what re-adopts them.
func (l *Local) adopt(infos []runtime.Info, gens map[string]uint64) {
	for _, in := range infos {
		if in.State != runtime.StateRunning || in.Pid <= 0 {
			continue
		}
		l.mu.Lock()
		_, watched := l.watches[in.ID]
		skip := watched || l.busy[in.ID] > 0 || l.gens[in.ID] != gens[in.ID]
		l.mu.Unlock()
		if !skip {
			l.watch(in.ID, in.Pid)
		}
	}
}

// begin marks an operation on id in flight (adopt leaves it alone) and
// stops the exit watch when the operation ends or stops the process.
func (l *Local) begin(id string, unwatch bool) func() {
	if unwatch {
		l.unwatch(id)
	}
	l.mu.Lock()
	l.busy[id]++
	l.gens[id]++
	l.mu.Unlock()
	return func() {
		l.mu.Lock()
		l.gens[id]++
		if l.busy[id]--; l.busy[id] <= 0 {
			delete(l.busy, id)
		}
		l.mu.Unlock()
	}
}

// forget drops the bookkeeping of a deleted sandbox.
func (l *Local) forget(id string) {
	l.mu.Lock()
	if l.busy[id] == 0 {
		delete(l.gens, id)
	}
	l.mu.Unlock()
}

// snapshotGens copies the operation generations (for adopt).
func (l *Local) snapshotGens() map[string]uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	m := make(map[string]uint64, len(l.gens))
	for k, v := range l.gens {
		m[k] = v
	}
	return m
}

// watchAfter inspects id and watches its process if it is running (after a
// resume, or a pause that failed and left it running).
func (l *Local) watchAfter(ctx context.Context, id string) {
	if info, err := l.cfg.Runtime.Inspect(ctx, id); err == nil && info.State == runtime.StateRunning {
		l.watch(id, info.Pid)
	}
}
