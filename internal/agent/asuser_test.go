package agent

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/cubicle-dev/cubicle/internal/testenv"
)

// threadStatus reads the Uid, Gid, Groups and CapEff lines of every thread
// of this process, by thread id.
func threadStatus(t *testing.T) map[int]string {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Fatal(err)
	}
	out := map[int]string{}
	for _, e := range ents {
		tid, _ := strconv.Atoi(e.Name())
		b, err := os.ReadFile(filepath.Join("/proc/self/task", e.Name(), "status"))
		if err != nil {
			continue // the thread exited meanwhile
		}
		var keep []string
		for _, l := range strings.Split(string(b), "\n") {
			for _, k := range []string{"Uid:", "Gid:", "Groups:", "CapEff:"} {
				if strings.HasPrefix(l, k) {
					keep = append(keep, l)
				}
			}
		}
		out[tid] = strings.Join(keep, "; ")
	}
	return out
}

// asUser hands its thread back to the runtime with root's identity instead
// of discarding it: a new thread per call needs a free pid, and at the
// sandbox's pids limit the runtime's failure to create one killed the agent.
// Every thread that ran fn as the user is still alive afterwards, and every
// thread of the process has the agent's own identity again.
func TestAsUserReusesThreadsWithRootIdentity(t *testing.T) {
	testenv.RequireRoot(t, "setfsuid, setgroups")
	u := &sysUser{Name: "nobody", UID: 65534, GID: 65534, Groups: []uint32{65534}}
	want := threadStatus(t)[unix.Gettid()]
	var mu sync.Mutex
	tids := map[int]bool{}
	var wg sync.WaitGroup
	for range 4 * asUserSlots {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 10 {
				err := asUser(u, func() error {
					if fsuid, _ := unix.SetfsuidRetUid(-1); fsuid != 65534 {
						return fmt.Errorf("fsuid %d inside asUser, want 65534", fsuid)
					}
					mu.Lock()
					tids[unix.Gettid()] = true
					mu.Unlock()
					return nil
				})
				if err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	after := threadStatus(t)
	for tid := range tids {
		if _, alive := after[tid]; !alive {
			t.Errorf("thread %d ran asUser and was discarded (%d threads ran it for %d calls)", tid, len(tids), 40*asUserSlots)
			break
		}
	}
	for tid, st := range after {
		if st != want {
			t.Errorf("thread %d after asUser: %s, want the agent's %s", tid, st, want)
		}
	}
}

// ReserveThreads leaves the runtime with the threads it reserved, alive and
// idle, and GOMAXPROCS within maxProcs.
func TestReserveThreads(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(0))
	n := ReserveThreads()
	if n < asUserSlots+threadSlack+1 {
		t.Fatalf("reserved %d threads, want at least %d", n, asUserSlots+threadSlack+1)
	}
	if p := runtime.GOMAXPROCS(0); p > maxProcs {
		t.Errorf("GOMAXPROCS %d, want at most %d", p, maxProcs)
	}
	if got := len(threadStatus(t)); got < n {
		t.Errorf("%d threads after reserving %d", got, n)
	}
}
