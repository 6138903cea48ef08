package agent

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/sys/unix"

	"github.com/cubicle-dev/cubicle/internal/testenv"
	pb "github.com/cubicle-dev/cubicle/sdk/go/envd/process"
	"github.com/cubicle-dev/cubicle/sdk/go/envd/process/processconnect"
)

const (
	pidsLimitScenario = "pids-limit"
	pidsLimitDirEnv   = "CUBICLE_AGENT_PIDS_LIMIT_DIR"
	pidsLimitRequests = 100
)

// pidsLimitAgent is the helper process of TestBurstAtThePidsLimitKeepsTheAgent:
// an agent as cubicle-agent runs it (threads reserved before serving),
// which prints READY <addr> once it serves and ARRIVED once every request of
// the burst has reached its handler.
func pidsLimitAgent() error {
	dir := os.Getenv(pidsLimitDirEnv)
	ReserveThreads()
	a := New(Config{PasswdPath: filepath.Join(dir, "passwd"), GroupPath: filepath.Join(dir, "group"), AccessToken: testToken})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	srv := a.Server("")
	h := srv.Handler
	var arrived atomic.Int32
	srv.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/health" && arrived.Add(1) == pidsLimitRequests {
			fmt.Println("ARRIVED")
		}
		h.ServeHTTP(w, r)
	})
	fmt.Println("READY", ln.Addr().String())
	return srv.Serve(ln)
}

// pidsCgroup makes a pids cgroup for the test (v1 hierarchy or v2) and
// removes it at cleanup, once the processes in it have been reaped.
func pidsCgroup(t *testing.T) string {
	t.Helper()
	parent := "/sys/fs/cgroup/pids"
	if _, err := os.Stat(filepath.Join(parent, "cgroup.procs")); err != nil {
		parent = "/sys/fs/cgroup"
		b, err := os.ReadFile(filepath.Join(parent, "cgroup.subtree_control"))
		if err != nil || !strings.Contains(string(b), "pids") {
			testenv.Skip(t, "no pids cgroup controller to limit the agent with")
		}
	}
	cg := filepath.Join(parent, fmt.Sprintf("cubicle-agent-test-%d", os.Getpid()))
	if err := os.Mkdir(cg, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for range 50 {
			if err := os.Remove(cg); err == nil || errors.Is(err, os.ErrNotExist) {
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
		t.Errorf("cgroup %s left behind", cg)
	})
	return cg
}

// A burst of commands into an agent whose pids limit is full (no thread
// can be added: pids.max is set to the agent's own task count once its
// threads are reserved), while every request's user lookup blocks in a
// system call (the group file is a FIFO nobody writes yet), which is what
// a loaded host makes of slow system calls. Each request still gets the
// agent's answer, resource_exhausted naming the process limit, and the agent
// lives on. Before, each request's lookup held a thread of its own, the
// runtime asked for one past the reserve, and the agent died with every
// connection reset (the proxy's 502s in TestCommandsPastThePidsLimit under
// CI load).
func TestBurstAtThePidsLimitKeepsTheAgent(t *testing.T) {
	testenv.RequireRoot(t, "pids cgroup, setuid children")
	cg := pidsCgroup(t)
	dir := t.TempDir()
	for _, d := range []string{dir, filepath.Dir(dir)} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	home := filepath.Join(dir, "home")
	if err := os.Mkdir(home, 0o755); err != nil {
		t.Fatal(err)
	}
	passwd := "root:x:0:0:root:" + home + ":/bin/sh\nuser:x:1000:1000:user:" + home + ":/bin/sh\n"
	if err := os.WriteFile(filepath.Join(dir, "passwd"), []byte(passwd), 0o644); err != nil {
		t.Fatal(err)
	}
	group := filepath.Join(dir, "group")
	if err := unix.Mkfifo(group, 0o644); err != nil {
		t.Fatal(err)
	}

	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), reaperHelperEnv+"="+pidsLimitScenario, pidsLimitDirEnv+"="+dir)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
	})
	lines := make(chan string, 4)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	next := func(want string) string {
		t.Helper()
		select {
		case l, ok := <-lines:
			if ok && strings.HasPrefix(l, want) {
				return strings.TrimSpace(strings.TrimPrefix(l, want))
			}
			<-exited
			t.Fatalf("agent: %q, want %s; it exited (%v):\n%s", l, want, cmd.ProcessState, stderr.String())
		case <-time.After(time.Minute):
			t.Fatalf("agent: no %s within a minute", want)
		}
		return ""
	}
	addr := next("READY")

	// Fill the limit: the agent's own tasks, none to spare.
	if err := os.WriteFile(filepath.Join(cg, "cgroup.procs"), []byte(strconv.Itoa(cmd.Process.Pid)), 0); err != nil {
		t.Fatal(err)
	}
	cur, err := os.ReadFile(filepath.Join(cg, "pids.current"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(cg, "pids.max"), bytes.TrimSpace(cur), 0); err != nil {
		t.Fatal(err)
	}

	errs := make([]error, pidsLimitRequests)
	var wg sync.WaitGroup
	for i := range pidsLimitRequests {
		user := "user"
		if i%4 == 0 {
			user = "root"
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			hc := &http.Client{Transport: authTransport{user: user}}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			st, err := processconnect.NewProcessClient(hc, "http://"+addr, connect.WithProtoJSON()).Start(ctx, connect.NewRequest(&pb.StartRequest{
				Process: &pb.ProcessConfig{Cmd: "/bin/sleep", Args: []string{"1"}},
			}))
			if err == nil {
				for st.Receive() {
				}
				err = st.Err()
				st.Close()
			}
			errs[i] = err
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()

	// Every request is in the agent before any lookup may finish.
	next("ARRIVED")
	// Then let the lookups through, one opening of the FIFO at a time (an
	// empty group file: each user has its primary group only).
	for fed := false; !fed; {
		select {
		case <-done:
			fed = true
		case <-exited:
			t.Fatalf("the agent died at the pids limit (%v):\n%s", cmd.ProcessState, tail(stderr.String(), 4000))
		default:
			fd, err := unix.Open(group, unix.O_WRONLY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
			if err == nil {
				unix.Close(fd)
				continue
			}
			if !errors.Is(err, unix.ENXIO) { // ENXIO: no reader yet
				t.Fatal(err)
			}
			time.Sleep(time.Millisecond)
		}
	}
	for i, err := range errs {
		var ce *connect.Error
		if !errors.As(err, &ce) || ce.Code() != connect.CodeResourceExhausted || !strings.Contains(ce.Message(), "process limit") {
			t.Errorf("command %d at the pids limit: %v, want resource_exhausted naming the process limit", i, err)
		}
	}
	resp, err := http.Get("http://" + addr + "/health")
	if err != nil {
		t.Fatalf("agent after the burst: %v\n%s", err, tail(stderr.String(), 4000))
	}
	resp.Body.Close()
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// authTransport sends the agent's token and names user as envd's clients do.
type authTransport struct{ user string }

func (a authTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("X-Access-Token", testToken)
	r.Header.Set("Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte(a.user+":")))
	return http.DefaultTransport.RoundTrip(r)
}
