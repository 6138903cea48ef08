package agent

import (
	"errors"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// reaper owns waiting for children. Exactly one design is active per agent:
//
//   - all=true (PID 1 / subreaper): one goroutine calls wait4(-1) and hands
//     each status to the channel registered for that pid; unknown pids are
//     orphans and are simply reaped. spawn holds mu across fork+register and
//     the dispatcher takes mu before lookup, so a child that exits instantly is
//     never mistaken for an orphan.
//   - all=false: each child is waited for by its own pid, so other children of
//     the process (e.g. in tests) are never touched.
//
// Nothing in the agent uses exec.Cmd.Wait, so statuses cannot be stolen.
type reaper struct {
	all     bool
	mu      sync.Mutex
	waiters map[int]chan unix.WaitStatus
	once    sync.Once
}

func newReaper(all bool) *reaper {
	return &reaper{all: all, waiters: map[int]chan unix.WaitStatus{}}
}

// spawn runs fork (which must return the new pid) and returns a channel that
// receives the child's wait status exactly once.
func (r *reaper) spawn(fork func() (int, error)) (int, <-chan unix.WaitStatus, error) {
	ch := make(chan unix.WaitStatus, 1)
	if !r.all {
		pid, err := fork()
		if err != nil {
			return 0, nil, err
		}
		go func() {
			var ws unix.WaitStatus
			for {
				_, err := unix.Wait4(pid, &ws, 0, nil)
				if errors.Is(err, unix.EINTR) {
					continue
				}
				break
			}
			ch <- ws
		}()
		return pid, ch, nil
	}
	r.once.Do(func() { go r.loop() })
	r.mu.Lock()
	defer r.mu.Unlock()
	pid, err := fork()
	if err != nil {
		return 0, nil, err
	}
	r.waiters[pid] = ch
	return pid, ch, nil
}

func (r *reaper) loop() {
	sigc := make(chan os.Signal, 16)
	signal.Notify(sigc, syscall.SIGCHLD)
	// The ticker covers coalesced or missed SIGCHLDs.
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		r.reapAvailable()
		select {
		case <-sigc:
		case <-tick.C:
		}
	}
}

func (r *reaper) reapAvailable() {
	// Bounded: each iteration reaps one exited child; stops when none is left.
	for range 1 << 16 {
		var ws unix.WaitStatus
		pid, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil || pid <= 0 {
			return
		}
		r.mu.Lock()
		ch, ok := r.waiters[pid]
		delete(r.waiters, pid)
		r.mu.Unlock()
		if ok {
			ch <- ws
		}
	}
}
