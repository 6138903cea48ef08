package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/sys/unix"

	"github.com/cubicle-dev/cubicle/internal/testenv"
	pb "github.com/cubicle-dev/cubicle/sdk/go/envd/process"
)

const startCmdScenarioName = "startcmd"

func (e *testEnv) logDir() string { return filepath.Join(e.root, "log") }

// initJSON posts /init with body (marshalled) and the current token.
func (e *testEnv) initJSON(t *testing.T, body map[string]any) (*http.Response, []byte) {
	t.Helper()
	b, err := json.Marshal(body)
	if err != nil {
		t.Fatal(err)
	}
	hdr := map[string]string{"Content-Type": "application/json"}
	if e.token != "" {
		hdr["X-Access-Token"] = e.token
	}
	return e.do(t, "POST", "/init", strings.NewReader(string(b)), hdr)
}

func (e *testEnv) mustInit(t *testing.T, body map[string]any) {
	t.Helper()
	start := time.Now()
	resp, b := e.initJSON(t, body)
	if resp.StatusCode != 204 {
		t.Fatalf("init %d: %s", resp.StatusCode, b)
	}
	// /init must not wait for the command.
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("init took %v", d)
	}
}

func readFileOr(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	return string(b)
}

func (e *testEnv) startStatus() string {
	return trim(readFileOr(filepath.Join(e.logDir(), startCmdStatusName)))
}

func (e *testEnv) startLog() string {
	return readFileOr(filepath.Join(e.logDir(), startCmdLogName))
}

func (e *testEnv) waitStatus(t *testing.T, pred func(string) bool, what string) string {
	t.Helper()
	var s string
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		if s = e.startStatus(); pred(s) {
			return s
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("status %q, want %s; log:\n%s", s, what, e.startLog())
	return ""
}

func (e *testEnv) waitExited(t *testing.T, want string) {
	t.Helper()
	e.waitStatus(t, func(s string) bool { return s == want }, want)
}

// checkOwner checks path's owner and, unless mode is 0, its permissions.
func checkOwner(t *testing.T, path string, uid, gid uint32, mode os.FileMode) {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	st := fi.Sys().(*syscall.Stat_t)
	if st.Uid != uid || st.Gid != gid || (mode != 0 && fi.Mode().Perm() != mode) {
		t.Fatalf("%s: %d:%d %v, want %d:%d %v", path, st.Uid, st.Gid, fi.Mode().Perm(), uid, gid, mode)
	}
}

func TestStartCmdRunsOnceAsUser(t *testing.T) {
	e := newTestEnv(t, testToken)
	body := map[string]any{
		"accessToken": testToken,
		"envVars":     map[string]string{"GREETING": "hi"},
		"startCmd":    `echo "out $GREETING $HOME $(pwd) $(id -u):$(id -g) $USER"; echo err >&2; touch marker`,
		"startUser":   "user",
	}
	// A token is set: an /init that cannot prove it is refused and starts nothing.
	e.token = ""
	resp, b := e.initJSON(t, map[string]any{"startCmd": body["startCmd"], "startUser": "user"})
	checkJSONError(t, resp, b, 401)
	time.Sleep(200 * time.Millisecond)
	if _, err := os.Stat(e.logDir()); !os.IsNotExist(err) {
		t.Fatalf("unauthorised init created %s: %v", e.logDir(), err)
	}
	e.token = testToken

	e.mustInit(t, body)
	e.waitExited(t, "exited code=0")
	log := e.startLog()
	want := fmt.Sprintf("out hi %s %s 1000:1000 user\n", e.userHome, e.userHome)
	if !strings.Contains(log, want) || !strings.Contains(log, "err\n") {
		t.Fatalf("log %q lacks %q and err", log, want)
	}
	checkOwner(t, e.logDir(), 0, 0, 0o755)
	checkOwner(t, filepath.Join(e.logDir(), startCmdLogName), 1000, 1000, 0o644)
	checkOwner(t, filepath.Join(e.logDir(), startCmdStatusName), 1000, 1000, 0o644)
	checkOwner(t, filepath.Join(e.userHome, "marker"), 1000, 1000, 0)

	// A later /init (a resume re-sends it) never starts it again, with the
	// same or another command; its other fields still apply.
	for _, cmd := range []string{body["startCmd"].(string), "echo again; touch again"} {
		e.mustInit(t, map[string]any{"startCmd": cmd, "envVars": map[string]string{"LATER": "1"}})
	}
	time.Sleep(300 * time.Millisecond)
	if got := e.startLog(); got != log {
		t.Fatalf("log changed: %q", got)
	}
	if s := e.startStatus(); s != "exited code=0" {
		t.Fatalf("status %q", s)
	}
	if _, err := os.Stat(filepath.Join(e.userHome, "again")); !os.IsNotExist(err) {
		t.Fatal("second start command ran")
	}
	if resp, b := e.do(t, "GET", "/envs", nil, e.tok()); resp.StatusCode != 200 || !strings.Contains(string(b), `"LATER":"1"`) {
		t.Fatalf("envs %s", b)
	}
}

func TestStartCmdUsers(t *testing.T) {
	const cmd = `echo "id=$(id -u):$(id -g) cwd=$(pwd) home=$HOME"`
	for _, tc := range []struct {
		name        string
		startUser   string
		defaultUser string
		uid, gid    uint32
		home        string // "" = user's home, "root" = root's home
	}{
		{name: "name", startUser: "user", uid: 1000, gid: 1000},
		{name: "uid", startUser: "1000", uid: 1000, gid: 1000},
		{name: "uid-gid", startUser: "1000:1500", uid: 1000, gid: 1500},
		{name: "name-group", startUser: "user:extra", uid: 1000, gid: 1500},
		{name: "root-uid", startUser: "0", uid: 0, gid: 0, home: "root"},
		{name: "root-name", startUser: "root", uid: 0, gid: 0, home: "root"},
		{name: "unknown-uid", startUser: "4242", uid: 4242, gid: 0, home: "/"},
		{name: "default-user", defaultUser: "root", uid: 0, gid: 0, home: "root"},
		{name: "default-fallback", uid: 1000, gid: 1000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newTestEnv(t, testToken)
			body := map[string]any{"startCmd": cmd}
			if tc.startUser != "" {
				body["startUser"] = tc.startUser
			}
			if tc.defaultUser != "" {
				body["defaultUser"] = tc.defaultUser
			}
			e.mustInit(t, body)
			e.waitExited(t, "exited code=0")
			home := tc.home
			switch home {
			case "":
				home = e.userHome
			case "root":
				home = filepath.Join(e.root, "root")
			}
			want := fmt.Sprintf("id=%d:%d cwd=%s home=%s\n", tc.uid, tc.gid, home, home)
			if log := e.startLog(); !strings.Contains(log, want) {
				t.Fatalf("log %q, want %q", log, want)
			}
			checkOwner(t, filepath.Join(e.logDir(), startCmdLogName), tc.uid, tc.gid, 0o644)
			checkOwner(t, filepath.Join(e.logDir(), startCmdStatusName), tc.uid, tc.gid, 0o644)
		})
	}
}

func TestStartCmdWorkdir(t *testing.T) {
	for _, tc := range []struct{ workdir, want string }{
		{"sub", "home/user/sub"},
		{"/", "/"},
	} {
		e := newTestEnv(t, testToken)
		sub := filepath.Join(e.userHome, "sub")
		if err := os.Mkdir(sub, 0o755); err != nil {
			t.Fatal(err)
		}
		e.mustInit(t, map[string]any{"startCmd": "pwd", "startWorkdir": tc.workdir, "defaultWorkdir": "/tmp"})
		e.waitExited(t, "exited code=0")
		want := tc.want
		if want != "/" {
			want = filepath.Join(e.root, want)
		}
		lines := strings.Split(trim(e.startLog()), "\n")
		if got := lines[len(lines)-1]; got != want {
			t.Fatalf("workdir %q: log %q want %q", tc.workdir, got, want)
		}
	}
}

func TestStartCmdExitStatus(t *testing.T) {
	for cmd, want := range map[string]string{
		"echo bye; exit 3": "exited code=3",
		"kill -KILL $$":    "signaled SIGKILL",
	} {
		e := newTestEnv(t, testToken)
		e.mustInit(t, map[string]any{"startCmd": cmd})
		e.waitExited(t, want)
	}
}

func TestStartCmdLongRunning(t *testing.T) {
	e := newTestEnv(t, testToken)
	e.mustInit(t, map[string]any{"accessToken": testToken, "startCmd": "sleep 300", "startUser": "1000"})
	s := e.waitStatus(t, func(s string) bool { return strings.HasPrefix(s, "running pid=") }, "running pid=N")
	pid, err := strconv.Atoi(strings.TrimPrefix(s, "running pid="))
	if err != nil {
		t.Fatalf("status %q", s)
	}
	st, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil || !strings.Contains(string(st), "\nUid:\t1000\t") {
		t.Fatalf("pid %d: %v\n%s", pid, err, st)
	}
	// Still running a moment later, and not a process-service process.
	time.Sleep(300 * time.Millisecond)
	if s2 := e.startStatus(); s2 != s {
		t.Fatalf("status %q, want %q", s2, s)
	}
	lr, err := e.proc.List(context.Background(), connect.NewRequest(&pb.ListRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range lr.Msg.GetProcesses() {
		if int(p.GetPid()) == pid {
			t.Fatalf("start command listed: %v", p)
		}
	}
	_, err = e.proc.SendSignal(context.Background(), connect.NewRequest(&pb.SendSignalRequest{Process: sel(uint32(pid)), Signal: pb.Signal_SIGNAL_SIGKILL}))
	if codeOf(err) != connect.CodeNotFound {
		t.Fatalf("SendSignal to start command: %v", err)
	}
	// A second /init does not start another.
	e.mustInit(t, map[string]any{"startCmd": "sleep 301"})
	time.Sleep(200 * time.Millisecond)
	if s2 := e.startStatus(); s2 != s {
		t.Fatalf("status after second init %q", s2)
	}
	// Shutdown terminates it and the status records how it ended.
	e.a.Shutdown()
	e.waitExited(t, "signaled SIGTERM")
	if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); !os.IsNotExist(err) {
		t.Fatalf("pid %d still present after shutdown: %s", pid, readFileOr(fmt.Sprintf("/proc/%d/stat", pid)))
	}
}

func TestStartCmdInvalid(t *testing.T) {
	e := newTestEnv(t, testToken)
	if err := os.WriteFile(filepath.Join(e.userHome, "file"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		body map[string]any
		msg  string
	}{
		{map[string]any{"startUser": "ghost"}, `invalid startUser "ghost": agent: user not found: ghost`},
		{map[string]any{"defaultUser": "root", "startUser": "user:nogroup"}, `invalid startUser "user:nogroup": agent: group not found: nogroup`},
		{map[string]any{"startUser": "user:"}, "invalid user spec"},
		{map[string]any{"startUser": ":1000"}, "invalid user spec"},
		{map[string]any{"startUser": "1:2:3"}, "invalid user spec"},
		{map[string]any{"startUser": "4294967295"}, "invalid user spec"},
		{map[string]any{"startWorkdir": "/nonexistent-dir"}, `invalid startWorkdir "/nonexistent-dir"`},
		{map[string]any{"startWorkdir": "file"}, "not a directory"},
	} {
		tc.body["startCmd"] = "touch " + filepath.Join(e.root, "ran")
		tc.body["envVars"] = map[string]string{"BAD": "1"}
		resp, b := e.initJSON(t, tc.body)
		checkJSONError(t, resp, b, 400)
		var v struct{ Message string }
		if err := json.Unmarshal(b, &v); err != nil || !strings.Contains(v.Message, tc.msg) {
			t.Fatalf("%v: message %s lacks %q", tc.body, b, tc.msg)
		}
	}
	time.Sleep(200 * time.Millisecond)
	if _, err := os.Stat(filepath.Join(e.root, "ran")); !os.IsNotExist(err) {
		t.Fatal("invalid init started the command")
	}
	if _, err := os.Stat(e.logDir()); !os.IsNotExist(err) {
		t.Fatalf("invalid init created the log dir: %v", err)
	}
	// A rejected /init applied nothing else either.
	if _, b := e.do(t, "GET", "/envs", nil, nil); strings.Contains(string(b), "BAD") {
		t.Fatalf("envs after rejected init: %s", b)
	}
	// Nothing was claimed: a valid one starts it.
	e.mustInit(t, map[string]any{"startCmd": "echo ok", "startUser": "user"})
	e.waitExited(t, "exited code=0")
}

func TestStartCmdStatusFromEarlierAgent(t *testing.T) {
	// A status file written since PID 1 started means an earlier agent of this
	// boot already started the command.
	e := newTestEnv(t, testToken)
	if err := os.MkdirAll(e.logDir(), 0o755); err != nil {
		t.Fatal(err)
	}
	status := filepath.Join(e.logDir(), startCmdStatusName)
	writeFileT(t, status, "running pid=1\n")
	e.mustInit(t, map[string]any{"startCmd": "touch " + filepath.Join(e.root, "ran")})
	time.Sleep(300 * time.Millisecond)
	if _, err := os.Stat(filepath.Join(e.root, "ran")); !os.IsNotExist(err) {
		t.Fatal("start command ran although this boot had started it")
	}
	if s := e.startStatus(); s != "running pid=1" {
		t.Fatalf("status %q", s)
	}

	// One left from an earlier boot (older than PID 1) does not count.
	e = newTestEnv(t, testToken)
	if err := os.MkdirAll(e.logDir(), 0o755); err != nil {
		t.Fatal(err)
	}
	status = filepath.Join(e.logDir(), startCmdStatusName)
	writeFileT(t, status, "running pid=1\n")
	old := time.Unix(1, 0)
	if err := os.Chtimes(status, old, old); err != nil {
		t.Fatal(err)
	}
	e.mustInit(t, map[string]any{"startCmd": "echo fresh"})
	e.waitExited(t, "exited code=0")
	if !strings.Contains(e.startLog(), "fresh\n") {
		t.Fatalf("log %q", e.startLog())
	}
}

func TestPID1StartTime(t *testing.T) {
	st, err := pid1StartTime()
	if err != nil {
		t.Fatal(err)
	}
	if st.After(time.Now()) || st.Before(time.Unix(1e9, 0)) {
		t.Fatalf("implausible PID 1 start %v", st)
	}
}

// TestStartCmdReapsDaemon runs the PID-1 style reaper in a child copy of the
// test binary: the start command's status comes through the shared wait4 loop
// and a child it leaves behind is reaped, not left a zombie.
func TestStartCmdReapsDaemon(t *testing.T) {
	testenv.RequireRoot(t, "setuid children")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), reaperHelperEnv+"="+startCmdScenarioName)
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "REAPER-OK") {
		t.Fatalf("start command reaper scenario: %v\n%s", err, out)
	}
}

func startCmdReapScenario() error {
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "startcmd")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	passwd := filepath.Join(dir, "passwd")
	if err := os.WriteFile(passwd, []byte("root:x:0:0:root:"+dir+":/bin/sh\n"), 0o644); err != nil {
		return err
	}
	logDir := filepath.Join(dir, "log")
	a := New(Config{PasswdPath: passwd, GroupPath: filepath.Join(dir, "group"), ReapAll: true, LogDir: logDir, AccessToken: testToken})
	defer a.Shutdown()
	// The inner sh backgrounds a sleep and exits: the sleep is orphaned onto
	// us, the subreaper, as a daemon's child is onto PID 1.
	body := `{"defaultUser":"root","startCmd":"sh -c 'sleep 1 & echo $! > gc.pid'; echo parent-done"}`
	rec := httptest.NewRecorder()
	req := httptest.NewRequest("POST", "/init", strings.NewReader(body))
	req.Header.Set("X-Access-Token", testToken)
	a.Handler().ServeHTTP(rec, req)
	if rec.Code != 204 {
		return fmt.Errorf("init %d: %s", rec.Code, rec.Body)
	}
	statusPath := filepath.Join(logDir, startCmdStatusName)
	deadline := time.Now().Add(20 * time.Second)
	for trim(readFileOr(statusPath)) != "exited code=0" {
		if time.Now().After(deadline) {
			return fmt.Errorf("status %q, log %q", readFileOr(statusPath), readFileOr(filepath.Join(logDir, startCmdLogName)))
		}
		time.Sleep(20 * time.Millisecond)
	}
	gc, err := strconv.Atoi(trim(readFileOr(filepath.Join(dir, "gc.pid"))))
	if err != nil {
		return fmt.Errorf("grandchild pid: %w", err)
	}
	deadline = time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if _, err := os.Stat("/proc/" + strconv.Itoa(gc)); os.IsNotExist(err) {
			if !strings.Contains(readFileOr(filepath.Join(logDir, startCmdLogName)), "parent-done\n") {
				return fmt.Errorf("log %q", readFileOr(filepath.Join(logDir, startCmdLogName)))
			}
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("grandchild %d not reaped: %s", gc, readFileOr("/proc/"+strconv.Itoa(gc)+"/stat"))
}
