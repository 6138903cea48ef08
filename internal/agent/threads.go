package agent

import (
	"net/http"
	"os"
	"runtime"
	"sync"
)

// The sandbox's pids limit counts the agent's OS threads with the
// workload's processes, and the Go runtime cannot live without a thread it
// asks for: a failed clone is fatal (runtime: failed to create new OS
// thread, "fatal error: newosproc"). A workload that fills the limit with
// sleeping processes would then kill PID 1, and with it the sandbox. So the
// agent starts every thread it will need while the limit has room, and
// afterwards never needs a new one: the runtime keeps idle threads for
// reuse, asUser returns its threads to the runtime instead of discarding
// them and runs at most asUserSlots at once, and GOMAXPROCS is capped.
//
// A goroutine in a blocking system call holds its OS thread, and while it
// does the runtime hands its P to another thread (a new one when none is
// idle). So every system call a request makes on a file (not a socket: those
// go through the poller) runs in a bounded set of slots: asUser for the file
// system work of the API, fileSem for the rest (user lookups in
// /etc/passwd and /etc/group, which every request naming a user makes). A
// burst of requests then waits on channels, which needs no thread. Unbounded,
// a burst of 100 commands at the pids limit, with the host loaded (a system
// call that is slow to return is one whose thread the runtime replaces), made
// the runtime ask for a thread it could not have, and the agent died with
// every connection reset: the proxy's 502s of TestCommandsPastThePidsLimit.

// maxProcs caps GOMAXPROCS in the agent: each P may need a thread of its
// own, and all of them must fit in the reserve.
const maxProcs = 4

// asUserSlots bounds how many goroutines run asUser at once; each holds a
// locked OS thread while it runs.
const asUserSlots = 16

// fileSlots bounds the goroutines in file system calls outside asUser.
const fileSlots = 4

var fileSem = make(chan struct{}, fileSlots)

// inFileSlot runs fn, which makes blocking system calls on files, in one of
// fileSlots slots.
func inFileSlot[T any](fn func() (T, error)) (T, error) {
	fileSem <- struct{}{}
	defer func() { <-fileSem }()
	return fn()
}

// slotFile reads, writes and seeks f in file slots, one call at a time, so
// that a download or upload never holds a slot while it waits on the network.
type slotFile struct{ f *os.File }

func (s slotFile) Read(p []byte) (int, error) {
	return inFileSlot(func() (int, error) { return s.f.Read(p) })
}

func (s slotFile) Write(p []byte) (int, error) {
	return inFileSlot(func() (int, error) { return s.f.Write(p) })
}

func (s slotFile) Seek(offset int64, whence int) (int64, error) {
	return inFileSlot(func() (int64, error) { return s.f.Seek(offset, whence) })
}

// threadSlack covers the runtime's own threads (sysmon, the template thread)
// and goroutines briefly blocked in ordinary system calls.
const threadSlack = 12

var asUserSem = make(chan struct{}, asUserSlots)

// startSlots bounds the process starts in progress (see processService.Start).
const startSlots = 8

var startSem = make(chan struct{}, startSlots)

// ReserveThreads caps GOMAXPROCS at maxProcs and makes the runtime start
// enough OS threads, while the sandbox's pids limit still has room, that it
// never needs to create another (see above). It returns how many threads it
// had running at once. Call it once, before serving.
func ReserveThreads() int {
	if runtime.GOMAXPROCS(0) > maxProcs {
		runtime.GOMAXPROCS(maxProcs)
	}
	n := runtime.GOMAXPROCS(0) + asUserSlots + fileSlots + threadSlack
	// Each goroutine locks a thread of its own and holds it until all are
	// running, so the runtime must start n distinct threads; unlocked again,
	// they go idle and the runtime keeps them.
	var started, release sync.WaitGroup
	started.Add(n)
	release.Add(1)
	var done sync.WaitGroup
	done.Add(n)
	for range n {
		go func() {
			defer done.Done()
			runtime.LockOSThread()
			started.Done()
			release.Wait()
			runtime.UnlockOSThread()
		}()
	}
	started.Wait()
	release.Done()
	done.Wait()
	return n
}

// UntilReserved holds every request but GET /health until reserved is
// closed. The agent reserves its threads (ReserveThreads, a few ms) while
// it already listens, so the node's readiness probe overlaps that work,
// and nothing that can start a process (the API, /init's start command)
// runs before the reserve is complete.
func UntilReserved(reserved <-chan struct{}, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet || r.URL.Path != "/health" {
			select {
			case <-reserved:
			case <-r.Context().Done():
				return
			}
		}
		h.ServeHTTP(w, r)
	})
}
