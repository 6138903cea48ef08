package agent

import (
	"encoding/json"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/cubicle-dev/cubicle/internal/agentapi"
)

type agentState struct {
	token, user, workdir string
	env                  map[string]string
}

func stateOf(a *Agent) agentState {
	a.mu.RLock()
	defer a.mu.RUnlock()
	return agentState{a.token, a.defaultUser, a.defaultWorkdir, maps.Clone(a.envVars)}
}

// FuzzInitBody: POST /init answers 204, 400 or 401 with envd's error body;
// an /init that proves neither the header nor the same accessToken changes
// nothing once a token is set; an accepted one applies exactly its fields,
// and its envVars come back unchanged from GET /envs.
func FuzzInitBody(f *testing.F) {
	dir := f.TempDir()
	passwd, group := filepath.Join(dir, "passwd"), filepath.Join(dir, "group")
	if err := os.WriteFile(passwd, []byte("root:x:0:0:root:/root:/bin/sh\nuser:x:1000:1000::/home/user:/bin/sh\n"), 0o644); err != nil {
		f.Fatal(err)
	}
	if err := os.WriteFile(group, []byte("root:x:0:\nuser:x:1000:\n"), 0o644); err != nil {
		f.Fatal(err)
	}
	a := New(Config{PasswdPath: passwd, GroupPath: group, LogDir: filepath.Join(dir, "log")})
	f.Cleanup(a.Shutdown)
	h := a.Handler()
	for _, s := range []string{
		`{"accessToken":"tok","envVars":{"A":"1","PATH":"/usr/bin"},"defaultUser":"user","defaultWorkdir":"/home/user","timestamp":"2026-01-02T03:04:05Z"}`,
		`{"accessToken":"other","envVars":{"EVIL":"1"}}`,
		`{"envVars":{"B":"2"},"volumeMounts":[{"nfsTarget":"x","path":"/mnt"}],"hyperloopIP":"10.0.0.1","lifecycleID":"l","caBundle":"-----"}`,
		`{"defaultUser":"nobody-here"}`,
		`{"timestamp":"yesterday"}`,
		`{"accessToken":null}`,
		`{"accessToken":""}`,
		``, `null`, `[]`, `{"envVars":{"":"x","K=V":"y"}}`,
	} {
		f.Add(s, false)
		f.Add(s, true)
	}
	f.Fuzz(func(t *testing.T, body string, withHeader bool) {
		var req agentapi.Init
		if json.Unmarshal([]byte(body), &req) == nil && strings.TrimSpace(req.StartCmd) != "" {
			return // would start a process; startcmd_test covers it
		}
		a.mu.Lock()
		a.token, a.defaultUser, a.defaultWorkdir = "tok", "root", "/"
		a.envVars = map[string]string{"KEEP": "1"}
		a.mu.Unlock()
		before := stateOf(a)

		r := httptest.NewRequest(http.MethodPost, "/init", strings.NewReader(body))
		if withHeader {
			r.Header.Set("X-Access-Token", "tok")
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		after := stateOf(a)
		switch w.Code {
		case http.StatusNoContent:
		case http.StatusBadRequest, http.StatusUnauthorized:
			var e struct {
				Code    int    `json:"code"`
				Message string `json:"message"`
			}
			if json.Unmarshal(w.Body.Bytes(), &e) != nil || e.Code != w.Code || e.Message == "" {
				t.Fatalf("%d with body %q", w.Code, w.Body)
			}
			if !reflect.DeepEqual(before, after) {
				t.Fatalf("refused /init (%d) changed the agent: %+v -> %+v", w.Code, before, after)
			}
			if w.Code == http.StatusUnauthorized && (withHeader || (req.AccessToken != nil && *req.AccessToken == "tok")) {
				t.Fatalf("an /init proving the token got 401")
			}
			return
		default:
			t.Fatalf("status %d", w.Code)
		}
		if !withHeader && (req.AccessToken == nil || *req.AccessToken != "tok") {
			t.Fatalf("/init without the token was applied")
		}
		want := before
		want.env = maps.Clone(before.env)
		if req.AccessToken != nil {
			want.token = *req.AccessToken
		}
		maps.Copy(want.env, req.EnvVars)
		if req.DefaultUser != nil && *req.DefaultUser != "" {
			want.user = *req.DefaultUser
		}
		if req.DefaultWorkdir != nil && *req.DefaultWorkdir != "" {
			want.workdir = *req.DefaultWorkdir
		}
		if !reflect.DeepEqual(after, want) {
			t.Fatalf("state %+v, want %+v", after, want)
		}
		r = httptest.NewRequest(http.MethodGet, "/envs", nil)
		r.Header.Set("X-Access-Token", after.token)
		w = httptest.NewRecorder()
		h.ServeHTTP(w, r)
		var env map[string]string
		if w.Code != http.StatusOK || json.Unmarshal(w.Body.Bytes(), &env) != nil {
			t.Fatalf("/envs: %d %q", w.Code, w.Body)
		}
		for k, v := range want.env {
			if env[k] != v {
				t.Fatalf("/envs[%q] = %q, want %q", k, env[k], v)
			}
		}
	})
}
