package integration

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestAgentRefusesBeforeInit holds a create after the sandbox's process
// started and before the control plane's first /init (the node's test
// hook), then calls the agent directly on its bridge address, as another
// tenant that guessed the address would: envd, /files, /init and the code
// interpreter all refuse without the token. Released, the create completes
// and the same calls with the token are answered (the positive control).
func TestAgentRefusesBeforeInit(t *testing.T) {
	hold := t.TempDir()
	s := startServerEnv(t, []string{"CUBICLE_TEST_HOLD_INIT=" + hold})

	type result struct {
		status int
		body   []byte
		err    error
	}
	done := make(chan result, 1)
	go func() {
		b, _ := json.Marshal(map[string]any{"templateID": "code-interpreter-v1", "timeout": 120})
		req, _ := http.NewRequest("POST", s.URL+"/v2/sandboxes", bytes.NewReader(b))
		req.Header.Set("X-API-Key", s.Key)
		req.Header.Set("Content-Type", "application/json")
		resp, err := s.client.Do(req)
		if err != nil {
			done <- result{err: err}
			return
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		done <- result{status: resp.StatusCode, body: body}
	}()
	released := false
	release := func(id string) {
		if !released {
			released = true
			os.WriteFile(filepath.Join(hold, id+".release"), nil, 0o600)
		}
	}

	// The node writes <hold>/<id> with the sandbox's address, then waits.
	var id, addr string
	for deadline := time.Now().Add(90 * time.Second); id == ""; {
		ents, _ := os.ReadDir(hold)
		for _, e := range ents {
			if !strings.HasSuffix(e.Name(), ".release") {
				b, _ := os.ReadFile(filepath.Join(hold, e.Name()))
				if len(b) > 0 {
					id, addr = e.Name(), string(b)
				}
			}
		}
		if id == "" {
			select {
			case r := <-done:
				t.Fatalf("create finished before the hold: %d %s %v", r.status, r.body, r.err)
			default:
			}
			if time.Now().After(deadline) {
				t.Fatal("the create never reached the init hold")
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	defer release(id)

	direct := &http.Client{Timeout: 60 * time.Second}
	call := func(method, url, body, token string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest(method, url, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		if token != "" {
			req.Header.Set("X-Access-Token", token)
		}
		resp, err := direct.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", method, url, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return resp.StatusCode, string(b)
	}
	envd := "http://" + addr + ":49983"
	interp := "http://" + addr + ":49999"
	// The agent is up (health needs no token) while /init is held.
	for deadline := time.Now().Add(30 * time.Second); ; {
		resp, err := direct.Get(envd + "/health")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode/100 == 2 {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("agent at %s never answered /health: %v", envd, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	refused := []struct{ method, url, body string }{
		{"GET", envd + "/envs", ""},
		{"POST", envd + "/process.Process/List", "{}"},
		{"POST", envd + "/process.Process/Start", `{"process":{"cmd":"/bin/true"}}`},
		{"GET", envd + "/files?path=/etc/hostname", ""},
		{"POST", envd + "/init", `{"accessToken":"taken-over"}`},
		{"POST", interp + "/execute", `{"code":"print(1)"}`},
	}
	for _, c := range refused {
		if st, b := call(c.method, c.url, c.body, ""); st != http.StatusUnauthorized {
			t.Errorf("%s %s before /init without the token: %d %s, want 401", c.method, c.url, st, b)
		}
	}
	// A made-up token is no better.
	if st, b := call("GET", envd+"/envs", "", "guessed"); st != http.StatusUnauthorized {
		t.Errorf("/envs with a guessed token: %d %s", st, b)
	}

	release(id)
	var r result
	select {
	case r = <-done:
	case <-time.After(2 * time.Minute):
		t.Fatal("create did not finish after the release")
	}
	if r.err != nil || r.status != http.StatusCreated {
		t.Fatalf("create after the release: %d %s %v", r.status, r.body, r.err)
	}
	var c created
	if err := json.Unmarshal(r.body, &c); err != nil || c.SandboxID != id || c.EnvdAccessToken == "" {
		t.Fatalf("created %s: %+v %v", r.body, c, err)
	}
	s.seen[c.SandboxID] = true
	// Positive control: the same agent answers the token it was given, and
	// the refused /init above changed nothing.
	if st, b := call("GET", envd+"/envs", "", c.EnvdAccessToken); st != http.StatusOK {
		t.Fatalf("/envs with the token: %d %s", st, b)
	}
	if st, b := call("POST", interp+"/execute", `{"code":"print(6*7)"}`, c.EnvdAccessToken); st != http.StatusOK || !strings.Contains(b, "42") {
		t.Fatalf("/execute with the token: %d %s", st, b)
	}
	if st, b := call("GET", envd+"/envs", "", "taken-over"); st != http.StatusUnauthorized {
		t.Fatalf("the refused /init's token works: %d %s", st, b)
	}
	// The token file is root-only inside, the agent can be neither read
	// through /proc nor traced, and the workload it starts stays dumpable.
	out := s.mustRun(c, `set +e
su -s /bin/sh user -c 'cat /.cubicle/envd-token' >/dev/null 2>&1; echo "user-reads-token=$?"
cat /proc/1/environ >/dev/null 2>&1; echo "root-reads-environ=$?"
python3 -c 'import ctypes,sys; l=ctypes.CDLL(None,use_errno=True); sys.exit(0 if l.ptrace(16,1,0,0)==0 else 1)'; echo "root-ptraces-agent=$?"
cat /proc/$$/environ >/dev/null 2>&1; echo "workload-dumpable=$?"`)
	for _, want := range []string{"user-reads-token=1", "root-reads-environ=1", "root-ptraces-agent=1", "workload-dumpable=0"} {
		if !strings.Contains(out, want) {
			t.Errorf("want %s in:\n%s", want, out)
		}
	}
}
