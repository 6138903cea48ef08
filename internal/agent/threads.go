package agent

import (
	"net/http"
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

// maxProcs caps GOMAXPROCS in the agent: each P may need a thread of its
// own, and all of them must fit in the reserve.
const maxProcs = 4

// asUserSlots bounds how many goroutines run asUser at once; each holds a
// locked OS thread while it runs.
const asUserSlots = 16

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
	n := runtime.GOMAXPROCS(0) + asUserSlots + threadSlack
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
