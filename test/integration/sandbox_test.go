package integration

import (
	"fmt"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestSandboxLifecycle(t *testing.T) {
	s := startServer(t)
	c := s.create(map[string]any{"templateID": "base", "metadata": map[string]string{"user id": "a&b"}, "envVars": map[string]string{"GREETING": "hi"}})
	if len(c.SandboxID) != 20 || c.EnvdAccessToken == "" || c.EnvdVersion != "0.6.13" || c.ClientID == "" || c.TemplateID != "base" {
		t.Fatalf("create response: %+v", c)
	}
	if out := s.mustRun(c, "echo $GREETING; id -u"); out != "hi\n1000\n" {
		t.Fatalf("run: %q", out)
	}
	if _, _, code, err := s.run(c, "exit 7"); err != nil || code != 7 {
		t.Fatalf("exit code: %d %v", code, err)
	}
	// Without the access token envd refuses.
	noTok := c
	noTok.EnvdAccessToken = ""
	if _, _, _, err := s.run(noTok, "true"); err == nil {
		t.Fatal("run without access token succeeded")
	}

	var detail map[string]any
	if st := s.do("GET", "/sandboxes/"+c.SandboxID, nil, &detail); st != 200 || detail["state"] != "running" || detail["envdAccessToken"] != c.EnvdAccessToken {
		t.Fatalf("get: %d %v", st, detail)
	}
	var list []map[string]any
	if st := s.do("GET", "/v2/sandboxes?metadata=user%252520id%3Da%252526b", nil, &list); st != 200 || len(list) != 1 {
		t.Fatalf("list with metadata: %d %v", st, list)
	}
	if st := s.do("GET", "/v2/sandboxes?metadata=user%252520id%3Dnope", nil, &list); st != 200 || len(list) != 0 {
		t.Fatalf("list with non-matching metadata: %d %v", st, list)
	}

	// Pause keeps memory: a background counter continues from where it was.
	s.mustRun(c, "echo before > /tmp/f; (i=0; while true; do i=$((i+1)); echo $i > /tmp/n.tmp && mv /tmp/n.tmp /tmp/n; sleep 0.1; done) >/dev/null 2>&1 &")
	time.Sleep(300 * time.Millisecond)
	if st := s.do("POST", "/sandboxes/"+c.SandboxID+"/pause", map[string]any{}, nil); st != http.StatusNoContent {
		t.Fatalf("pause: %d", st)
	}
	errShape(t, s, "POST", "/sandboxes/"+c.SandboxID+"/pause", map[string]any{}, http.StatusConflict)
	s.do("GET", "/sandboxes/"+c.SandboxID, nil, &detail)
	if detail["state"] != "paused" {
		t.Fatalf("state after pause: %v", detail["state"])
	}
	if _, _, _, err := s.run(c, "true"); err == nil {
		t.Fatal("command ran in a paused sandbox")
	}
	var resumed created
	if st := s.do("POST", "/v2/sandboxes/"+c.SandboxID+"/connect", map[string]any{}, &resumed); st != http.StatusCreated {
		t.Fatalf("connect (resume): %d", st)
	}
	if st := s.do("POST", "/v2/sandboxes/"+c.SandboxID+"/connect", nil, &resumed); st != http.StatusOK {
		t.Fatalf("connect (already running): %d", st)
	}
	out := s.mustRun(c, "cat /tmp/f; a=$(cat /tmp/n); sleep 0.5; b=$(cat /tmp/n); [ $b -gt $a ] && echo counting")
	if out != "before\ncounting\n" {
		t.Fatalf("after resume: %q", out)
	}

	if st := s.do("POST", "/sandboxes/"+c.SandboxID+"/timeout", map[string]any{"timeout": 600}, nil); st != http.StatusNoContent {
		t.Fatalf("timeout: %d", st)
	}
	var metrics []map[string]any
	if st := s.do("GET", "/sandboxes/"+c.SandboxID+"/metrics", nil, &metrics); st != 200 || len(metrics) == 0 || metrics[0]["memUsed"].(float64) <= 0 {
		t.Fatalf("metrics: %d %v", st, metrics)
	}
	var logs map[string]any
	if st := s.do("GET", "/v2/sandboxes/"+c.SandboxID+"/logs", nil, &logs); st != 200 || len(logs["logs"].([]any)) == 0 {
		t.Fatalf("logs: %d %v", st, logs)
	}
	if st := s.do("DELETE", "/sandboxes/"+c.SandboxID, nil, nil); st != http.StatusNoContent {
		t.Fatalf("kill: %d", st)
	}
	errShape(t, s, "GET", "/sandboxes/"+c.SandboxID, nil, http.StatusNotFound)
	errShape(t, s, "DELETE", "/sandboxes/"+c.SandboxID, nil, http.StatusNotFound)
	errShape(t, s, "POST", "/v2/sandboxes/"+c.SandboxID+"/connect", map[string]any{}, http.StatusNotFound)
}

func TestV1Routes(t *testing.T) {
	s := startServer(t)
	var c created
	if st := s.do("POST", "/sandboxes", map[string]any{"templateID": "code-interpreter-v1", "timeout": 60, "secure": true, "allow_internet_access": true}, &c); st != http.StatusCreated || c.EnvdAccessToken == "" {
		t.Fatalf("v1 create: %d %+v", st, c)
	}
	if s.mustRun(c, "echo ok") != "ok\n" {
		t.Fatal("v1 sandbox does not run commands")
	}
	var again created
	if st := s.do("POST", "/sandboxes/"+c.SandboxID+"/connect", map[string]any{"timeout": 60}, &again); st != http.StatusOK || again.SandboxID != c.SandboxID {
		t.Fatalf("v1 connect: %d", st)
	}
	// No timeout (CubeSandbox's connect(id)): the sandbox keeps its own.
	if st := s.do("POST", "/sandboxes/"+c.SandboxID+"/connect", map[string]any{}, &again); st != http.StatusOK || again.SandboxID != c.SandboxID {
		t.Fatalf("v1 connect without a timeout: %d", st)
	}
	errShape(t, s, "POST", "/sandboxes/"+c.SandboxID+"/connect", map[string]any{"timeout": -5}, http.StatusBadRequest)
	var list []map[string]any
	if st := s.do("GET", "/sandboxes", nil, &list); st != 200 || len(list) != 1 {
		t.Fatalf("v1 list: %d %v", st, list)
	}
}

func TestBadInput(t *testing.T) {
	s := startServer(t)
	before := s.snapshot(t)
	errShape(t, s, "POST", "/v2/sandboxes", "{not json", http.StatusBadRequest)
	errShape(t, s, "POST", "/v2/sandboxes", "", http.StatusBadRequest)
	errShape(t, s, "POST", "/v2/sandboxes", map[string]any{"templateID": "no-such-template"}, http.StatusNotFound)
	errShape(t, s, "POST", "/v2/sandboxes", map[string]any{"templateID": "../../etc"}, http.StatusNotFound)
	errShape(t, s, "POST", "/v2/sandboxes", map[string]any{"templateID": "base", "timeout": -5}, http.StatusBadRequest)
	errShape(t, s, "POST", "/v2/sandboxes", map[string]any{"templateID": "base", "timeout": 10 * 24 * 3600}, http.StatusBadRequest)
	// 18446744074 s overflows a time.Duration; it used to wrap to 0.29 s.
	errShape(t, s, "POST", "/v2/sandboxes", map[string]any{"templateID": "base", "timeout": int64(18446744074)}, http.StatusBadRequest)
	errShape(t, s, "POST", "/sandboxes/aaaaaaaaaaaaaaaaaaaa/timeout", map[string]any{"timeout": int64(18446744074)}, http.StatusBadRequest)
	errShape(t, s, "POST", "/sandboxes/aaaaaaaaaaaaaaaaaaaa/connect", map[string]any{"timeout": int64(18446744074)}, http.StatusBadRequest)
	errShape(t, s, "POST", "/v2/sandboxes", map[string]any{"templateID": "base", "metadata": map[string]string{"k": strings.Repeat("v", 5000)}}, http.StatusBadRequest)
	big := map[string]string{}
	for i := 0; i < 100; i++ {
		big[fmt.Sprint("k", i)] = "v"
	}
	errShape(t, s, "POST", "/v2/sandboxes", map[string]any{"templateID": "base", "metadata": big}, http.StatusBadRequest)
	// Domain names are valid entries; these are neither IPs, CIDRs nor names.
	errShape(t, s, "POST", "/v2/sandboxes", map[string]any{"templateID": "base", "network": map[string]any{"denyOut": []string{"not an ip"}}}, http.StatusBadRequest)
	errShape(t, s, "POST", "/v2/sandboxes", map[string]any{"templateID": "base", "network": map[string]any{"allowOut": []string{"*"}}}, http.StatusBadRequest)
	errShape(t, s, "POST", "/v2/sandboxes", map[string]any{"templateID": "base", "network": map[string]any{"allowOut": []string{"-bad-.example"}}}, http.StatusBadRequest)
	errShape(t, s, "POST", "/v2/sandboxes", map[string]any{"templateID": "base", "envVars": map[string]string{"A=B": "x"}}, http.StatusBadRequest)
	errShape(t, s, "GET", "/v2/sandboxes?limit=0", nil, http.StatusBadRequest)
	errShape(t, s, "GET", "/v2/sandboxes?state=dead", nil, http.StatusBadRequest)
	errShape(t, s, "GET", "/v2/sandboxes?nextToken=%21%21", nil, http.StatusBadRequest)
	errShape(t, s, "POST", "/sandboxes/aaaaaaaaaaaaaaaaaaaa/timeout", map[string]any{"timeout": 5}, http.StatusNotFound)
	errShape(t, s, "GET", "/no/such/route", nil, http.StatusNotFound)
	key := s.Key
	s.Key = "e2b_0000"
	errShape(t, s, "GET", "/v2/sandboxes", nil, http.StatusUnauthorized)
	s.Key = ""
	errShape(t, s, "GET", "/v2/sandboxes", nil, http.StatusUnauthorized)
	s.Key = key
	var list []map[string]any
	if s.do("GET", "/v2/sandboxes", nil, &list); len(list) != 0 {
		t.Fatalf("bad requests left sandboxes: %v", list)
	}
	if after := s.snapshot(t); after != before {
		t.Fatalf("bad requests left host state: before %+v after %+v", before, after)
	}
}

func TestPagination(t *testing.T) {
	s := startServer(t)
	for i := 0; i < 3; i++ {
		s.create(map[string]any{"templateID": "base"})
	}
	seen := map[string]bool{}
	next := ""
	for page := 0; page < 5; page++ {
		var list []map[string]any
		s.do("GET", "/v2/sandboxes?limit=1&nextToken="+next, nil, &list)
		for _, sb := range list {
			seen[sb["sandboxID"].(string)] = true
		}
		next = s.lastHeader.Get("X-Next-Token")
		if next == "" {
			break
		}
	}
	if len(seen) != 3 {
		t.Fatalf("pagination saw %d of 3", len(seen))
	}
}

func TestTimeoutReaper(t *testing.T) {
	s := startServer(t)
	c := s.create(map[string]any{"templateID": "base", "timeout": 1})
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		if s.do("GET", "/sandboxes/"+c.SandboxID, nil, nil) == http.StatusNotFound {
			// The row is killed before the node cleanup runs (so a stopping
			// sandbox is never reported alive); the cleanup follows at once.
			clean := time.Now().Add(10 * time.Second)
			for {
				h := s.snapshot(t)
				if h.netns == 0 && h.sandboxDirs == 0 && h.mounts == 0 {
					return
				}
				if time.Now().After(clean) {
					t.Fatalf("reaped sandbox left host state: %+v", h)
				}
				time.Sleep(50 * time.Millisecond)
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatal("sandbox with 1s timeout still alive after 15s")
}

// A restart re-adopts live sandboxes and marks vanished ones killed.
func TestRestartRecovery(t *testing.T) {
	s := startServer(t)
	keep := s.create(map[string]any{"templateID": "base"})
	lost := s.create(map[string]any{"templateID": "base"})
	paused := s.create(map[string]any{"templateID": "base"})
	s.mustRun(keep, "echo kept > /tmp/state")
	if st := s.do("POST", "/sandboxes/"+paused.SandboxID+"/pause", map[string]any{}, nil); st != 204 {
		t.Fatalf("pause: %d", st)
	}
	s.stop(syscall.SIGKILL) // a crash, not a clean shutdown
	// While the server is down the "lost" sandbox dies on its own.
	runc := func(args ...string) {
		all := append([]string{"--root", filepath.Join(s.DataDir, "run", "runc")}, args...)
		exec.Command("runc", all...).Run()
	}
	runc("kill", lost.SandboxID, "KILL")
	time.Sleep(300 * time.Millisecond)
	s.start()
	if out := s.mustRun(keep, "cat /tmp/state"); out != "kept\n" {
		t.Fatalf("re-adopted sandbox lost its state: %q", out)
	}
	if st := s.do("GET", "/sandboxes/"+lost.SandboxID, nil, nil); st != http.StatusNotFound {
		t.Fatalf("vanished sandbox: want 404, got %d", st)
	}
	var detail map[string]any
	s.do("GET", "/sandboxes/"+paused.SandboxID, nil, &detail)
	if detail["state"] != "paused" {
		t.Fatalf("paused sandbox after restart: %v", detail["state"])
	}
	if st := s.do("POST", "/v2/sandboxes/"+paused.SandboxID+"/connect", map[string]any{}, nil); st != http.StatusCreated {
		t.Fatalf("resume after restart: %d", st)
	}
	s.mustRun(paused, "true")
}

// Fifty create/kill cycles leave no process, mount, netns, veth, cgroup or dir.
func TestNoLeaks(t *testing.T) {
	s := startServer(t)
	before := s.snapshot(t)
	for i := 0; i < 50; i++ {
		c := s.create(map[string]any{"templateID": "base"})
		if i%10 == 0 {
			s.mustRun(c, "sleep 60 & true")
		}
		if st := s.do("DELETE", "/sandboxes/"+c.SandboxID, nil, nil); st != 204 {
			t.Fatalf("kill %d: %d", i, st)
		}
	}
	after := s.snapshot(t)
	if after != before {
		t.Fatalf("leaked host state after 50 cycles: before %+v after %+v", before, after)
	}
	out, _ := exec.Command("runc", "--root", filepath.Join(s.DataDir, "run", "runc"), "list", "-q").Output()
	if strings.TrimSpace(string(out)) != "" {
		t.Fatalf("runc still lists containers: %q", out)
	}
}

func TestCapacityLimitIs429WithRetryAfter(t *testing.T) {
	s := startServer(t, "--max-sandboxes", "1")
	s.create(map[string]any{"templateID": "base"})
	errShape(t, s, "POST", "/v2/sandboxes", map[string]any{"templateID": "base"}, http.StatusTooManyRequests)
	if s.lastHeader.Get("Retry-After") == "" {
		t.Fatal("429 without Retry-After: the SDK will not retry it")
	}
}

func TestTemplateIDRules(t *testing.T) {
	s := startServer(t)
	errShape(t, s, "POST", "/v2/sandboxes", map[string]any{"timeout": 10}, http.StatusBadRequest)
	errShape(t, s, "POST", "/sandboxes", map[string]any{"timeout": 10}, http.StatusBadRequest)
	for tpl, want := range map[string]string{"": "base", "python": "base", "base:default": "base",
		"code-interpreter": "code-interpreter-v1", "code-interpreter-v1": "code-interpreter-v1"} {
		c := s.create(map[string]any{"templateID": tpl})
		if c.TemplateID != want {
			t.Fatalf("templateID %q resolved to %q, want %s", tpl, c.TemplateID, want)
		}
		s.do("DELETE", "/sandboxes/"+c.SandboxID, nil, nil)
	}
	errShape(t, s, "POST", "/v2/sandboxes", map[string]any{"templateID": "base:v9"}, http.StatusNotFound)
}

// Concurrent creates must all succeed (the runtime is asked about one
// container while others are half created). Small disks: the test is about
// the runtime, not about how much the host's filesystem has free.
func TestConcurrentCreates(t *testing.T) {
	s := startServer(t, "--disk-size-mb", "256")
	const n = 20
	errs := make(chan string, n)
	for i := 0; i < n; i++ {
		go func() {
			var c created
			st := s.do("POST", "/v2/sandboxes", map[string]any{"templateID": "base"}, &c)
			if st != http.StatusCreated {
				errs <- fmt.Sprintf("status %d", st)
				return
			}
			if out, _, code, err := s.run(c, "echo ok"); err != nil || code != 0 || out != "ok\n" {
				errs <- fmt.Sprintf("run: %q %d %v", out, code, err)
				return
			}
			errs <- ""
		}()
	}
	for i := 0; i < n; i++ {
		if e := <-errs; e != "" {
			t.Errorf("create %d: %s", i, e)
		}
	}
}

// Creates beyond the start slots wait briefly, then get 503 + Retry-After
// (the SDK's ServiceBusyError).
func TestBusyIs503(t *testing.T) {
	s := startServer(t, "--max-concurrent-creates", "1", "--create-queue-wait", "1ms")
	const n = 6
	statuses := make(chan int, n)
	headers := make(chan string, n)
	for i := 0; i < n; i++ {
		go func() {
			req, _ := http.NewRequest("POST", s.URL+"/v2/sandboxes", strings.NewReader(`{"templateID":"base"}`))
			req.Header.Set("X-API-Key", s.Key)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				statuses <- 0
				headers <- ""
				return
			}
			resp.Body.Close()
			statuses <- resp.StatusCode
			headers <- resp.Header.Get("Retry-After")
		}()
	}
	busy := 0
	for i := 0; i < n; i++ {
		st, ra := <-statuses, <-headers
		if st == http.StatusServiceUnavailable {
			busy++
			if ra == "" {
				t.Error("503 without Retry-After")
			}
		} else if st != http.StatusCreated {
			t.Errorf("unexpected status %d", st)
		}
	}
	if busy == 0 {
		t.Fatal("no create was refused with 503 although only one may start at a time")
	}
}

func TestLegacyRoutesAndBearer(t *testing.T) {
	s := startServer(t)
	c := s.create(map[string]any{"templateID": "base", "timeout": 30})
	var before, after map[string]any
	s.do("GET", "/sandboxes/"+c.SandboxID, nil, &before)
	if st := s.do("POST", "/sandboxes/"+c.SandboxID+"/refreshes", map[string]any{"duration": 600}, nil); st != http.StatusNoContent {
		t.Fatalf("refreshes: %d", st)
	}
	s.do("GET", "/sandboxes/"+c.SandboxID, nil, &after)
	if after["endAt"].(string) <= before["endAt"].(string) {
		t.Fatalf("refresh did not extend: %v -> %v", before["endAt"], after["endAt"])
	}
	errShape(t, s, "POST", "/sandboxes/"+c.SandboxID+"/refreshes", map[string]any{"duration": 7200}, http.StatusBadRequest)
	errShape(t, s, "POST", "/sandboxes/"+c.SandboxID+"/resume", map[string]any{}, http.StatusConflict)
	if st := s.do("POST", "/sandboxes/"+c.SandboxID+"/pause", map[string]any{"memory": true}, nil); st != http.StatusNoContent {
		t.Fatalf("pause: %d", st)
	}
	var resumed created
	if st := s.do("POST", "/sandboxes/"+c.SandboxID+"/resume", map[string]any{"timeout": 60}, &resumed); st != http.StatusCreated || resumed.SandboxID != c.SandboxID {
		t.Fatalf("deprecated resume: %d", st)
	}
	s.mustRun(c, "echo logged-line")
	var logs struct {
		Logs []struct {
			Line string `json:"line"`
		} `json:"logs"`
		LogEntries []map[string]any `json:"logEntries"`
	}
	if st := s.do("GET", "/sandboxes/"+c.SandboxID+"/logs?limit=100", nil, &logs); st != 200 || len(logs.Logs) == 0 || len(logs.LogEntries) != len(logs.Logs) {
		t.Fatalf("v1 logs: %d %+v", st, logs)
	}
	errShape(t, s, "GET", "/sandboxes/"+c.SandboxID+"/logs?start=abc", nil, http.StatusBadRequest)
	errShape(t, s, "GET", "/v2/sandboxes/"+c.SandboxID+"/logs?direction=sideways", nil, http.StatusBadRequest)
	errShape(t, s, "GET", "/sandboxes/"+c.SandboxID+"/metrics?start=20&end=10", nil, http.StatusBadRequest)
	// Authorization: Bearer works like X-API-Key.
	req, _ := http.NewRequest("GET", s.URL+"/sandboxes/"+c.SandboxID, nil)
	req.Header.Set("Authorization", "Bearer "+s.Key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("bearer auth: %v %v", resp, err)
	}
	resp.Body.Close()
}

// lifecycle.onTimeout=pause: the reaper pauses instead of killing.
func TestTimeoutAutoPause(t *testing.T) {
	s := startServer(t)
	c := s.create(map[string]any{"templateID": "base", "timeout": 1, "autoPause": true})
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		var d map[string]any
		if s.do("GET", "/sandboxes/"+c.SandboxID, nil, &d) == http.StatusOK && d["state"] == "paused" {
			if st := s.do("POST", "/v2/sandboxes/"+c.SandboxID+"/connect", map[string]any{"timeout": 60}, nil); st != http.StatusCreated {
				t.Fatalf("resume after auto-pause: %d", st)
			}
			s.mustRun(c, "true")
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatal("sandbox with autoPause and 1s timeout was not paused within 15s")
}
