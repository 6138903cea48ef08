package interp_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/agent"
	"github.com/cubicle-dev/cubicle/internal/agent/interp"
	"github.com/cubicle-dev/cubicle/internal/agent/interp/internal/kerneltest"
)

const token = "interp-token"

// env is an interpreter on a real agent (the Host), serving over httptest,
// plus the agent's own envd API for /init.
type env struct {
	t      *testing.T
	a      *agent.Agent
	srv    *interp.Server
	ts     *httptest.Server
	envd   *httptest.Server
	python string
	cwd    string
	runDir string
}

// quietLogger discards logs unless INTERP_TEST_LOG is set.
func quietLogger() *slog.Logger {
	if os.Getenv("INTERP_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

func newEnv(t *testing.T, mutate func(*interp.Config)) *env {
	t.Helper()
	python := kerneltest.Python(t)
	a := agent.New(agent.Config{AccessToken: token, Logger: quietLogger()})
	cwd := t.TempDir()
	cfg := interp.Config{
		Python: python,
		// Only the fallback kernels, so the test does not depend on the
		// machine's kernelspecs.
		KernelSpecDirs: []string{},
		RuntimeDir:     filepath.Join(t.TempDir(), "kernels"),
		DefaultCwd:     cwd,
		Logger:         quietLogger(),
	}
	if mutate != nil {
		mutate(&cfg)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cat, err := interp.Discover(ctx, a, cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := interp.New(a, cat, cfg)
	ts := httptest.NewServer(srv.Handler())
	envd := httptest.NewServer(a.Handler())
	t.Cleanup(func() {
		ts.CloseClientConnections()
		ts.Close()
		envd.Close()
		srv.Close()
		a.Shutdown()
	})
	return &env{t: t, a: a, srv: srv, ts: ts, envd: envd, python: python, cwd: cwd, runDir: cfg.RuntimeDir}
}

type line = map[string]any

// execute posts body to /execute and returns the stream's lines.
func (e *env) execute(ctx context.Context, body any) []line {
	e.t.Helper()
	b, _ := json.Marshal(body)
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, e.ts.URL+"/execute", bytes.NewReader(b))
	req.Header.Set("X-Access-Token", token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(resp.Body)
		e.t.Fatalf("execute: %d %s", resp.StatusCode, msg)
	}
	var out []line
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 64<<20)
	for sc.Scan() {
		var l line
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			e.t.Fatalf("bad line %q: %v", sc.Text(), err)
		}
		out = append(out, l)
	}
	return out
}

func (e *env) run(code string, extra ...any) []line {
	e.t.Helper()
	body := map[string]any{"code": code}
	for i := 0; i+1 < len(extra); i += 2 {
		body[extra[i].(string)] = extra[i+1]
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	return e.execute(ctx, body)
}

func (e *env) do(method, path string, body any) (int, []byte) {
	e.t.Helper()
	var r io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		r = bytes.NewReader(b)
	}
	req, _ := http.NewRequest(method, e.ts.URL+path, r)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

func (e *env) createContext(language, cwd string) interp.Context {
	e.t.Helper()
	status, b := e.do(http.MethodPost, "/contexts", map[string]string{"language": language, "cwd": cwd})
	if status != http.StatusOK {
		e.t.Fatalf("create context: %d %s", status, b)
	}
	var c interp.Context
	if err := json.Unmarshal(b, &c); err != nil {
		e.t.Fatal(err)
	}
	return c
}

func ofType(lines []line, typ string) []line {
	var out []line
	for _, l := range lines {
		if l["type"] == typ {
			out = append(out, l)
		}
	}
	return out
}

func stdout(lines []line) string {
	var b strings.Builder
	for _, l := range ofType(lines, "stdout") {
		b.WriteString(l["text"].(string))
	}
	return b.String()
}

func mainResult(t *testing.T, lines []line) line {
	t.Helper()
	for _, l := range ofType(lines, "result") {
		if l["is_main_result"] == true {
			return l
		}
	}
	t.Fatalf("no main result in %v", lines)
	return nil
}

// endsCleanly checks the stream's last line is end_of_execution and there
// was no error.
func endsCleanly(t *testing.T, lines []line) {
	t.Helper()
	if len(lines) == 0 || lines[len(lines)-1]["type"] != "end_of_execution" {
		t.Fatalf("stream does not end with end_of_execution: %v", lines)
	}
	if errs := ofType(lines, "error"); len(errs) > 0 {
		t.Fatalf("unexpected error: %v", errs)
	}
}

func TestPythonExecution(t *testing.T) {
	e := newEnv(t, nil)
	if err := e.srv.Warm(context.Background()); err != nil {
		t.Fatal(err)
	}

	t.Run("idle kernel imports nothing heavy", func(t *testing.T) {
		lines := e.run("import sys\nprint(sorted(m for m in ('numpy', 'pandas', 'matplotlib', 'PIL') if m in sys.modules))")
		if got := stdout(lines); got != "[]\n" {
			t.Fatalf("preloaded modules: %q (%v)", got, lines)
		}
	})

	t.Run("expression result", func(t *testing.T) {
		lines := e.run("1+1")
		endsCleanly(t, lines)
		if r := mainResult(t, lines); r["text"] != "2" {
			t.Fatalf("1+1 text = %v", r["text"])
		}
		if s := e.run("'abc'"); mainResult(t, s)["text"] != "abc" {
			t.Fatalf("string result not unquoted: %v", s)
		}
	})

	t.Run("stdout and stderr", func(t *testing.T) {
		lines := e.run("import sys\nprint('hello')\nprint('world')\nprint('oops', file=sys.stderr)")
		endsCleanly(t, lines)
		if got := stdout(lines); got != "hello\nworld\n" {
			t.Fatalf("stdout = %q", got)
		}
		errs := ofType(lines, "stderr")
		if len(errs) != 1 || errs[0]["text"] != "oops\n" || errs[0]["timestamp"] == "" {
			t.Fatalf("stderr lines = %v", errs)
		}
	})

	t.Run("exception", func(t *testing.T) {
		lines := e.run("def f():\n    return 1/0\nf()")
		errs := ofType(lines, "error")
		if len(errs) != 1 {
			t.Fatalf("errors = %v", errs)
		}
		err := errs[0]
		tb, _ := err["traceback"].(string)
		if err["name"] != "ZeroDivisionError" || err["value"] != "division by zero" || !strings.Contains(tb, "ZeroDivisionError") || !strings.Contains(tb, "1/0") {
			t.Fatalf("error = %v", err)
		}
		if strings.Contains(tb, "\x1b") {
			t.Fatalf("traceback has ANSI escapes: %q", tb)
		}
		if lines[len(lines)-1]["type"] != "end_of_execution" {
			t.Fatalf("error run does not end with end_of_execution: %v", lines)
		}
	})

	t.Run("execution count increments", func(t *testing.T) {
		first := ofType(e.run("None"), "number_of_executions")
		second := ofType(e.run("None"), "number_of_executions")
		if len(first) != 1 || len(second) != 1 || second[0]["execution_count"].(float64) != first[0]["execution_count"].(float64)+1 {
			t.Fatalf("counts %v then %v", first, second)
		}
	})

	t.Run("matplotlib figure has png and chart", func(t *testing.T) {
		lines := e.run("import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [4, 5, 6])\nplt.title('t')\nplt.show()")
		endsCleanly(t, lines)
		var found bool
		for _, r := range ofType(lines, "result") {
			chart, _ := r["chart"].(map[string]any)
			if r["png"] != nil && chart != nil {
				found = true
				if chart["type"] != "line" || chart["title"] != "t" {
					t.Fatalf("chart = %v", chart)
				}
				if r["is_main_result"] != false {
					t.Fatal("a displayed figure is not the main result")
				}
			}
		}
		if !found {
			t.Fatalf("no result with png and chart: %v", lines)
		}
	})

	t.Run("dataframe has data", func(t *testing.T) {
		lines := e.run("import pandas as pd\npd.DataFrame({'a': [1, 2], 'b': ['x', None], 'c': [1.5, float('nan')]})")
		endsCleanly(t, lines)
		r := mainResult(t, lines)
		got, _ := json.Marshal(r["data"])
		if string(got) != `{"a":[1,2],"b":["x",null],"c":[1.5,null]}` {
			t.Fatalf("data = %s", got)
		}
		if r["html"] == nil {
			t.Fatal("no html")
		}
	})

	t.Run("PIL image save displays it", func(t *testing.T) {
		lines := e.run("from PIL import Image\nImage.new('RGB', (4, 4), 'red').save('red.png')")
		endsCleanly(t, lines)
		rs := ofType(lines, "result")
		if len(rs) != 1 || rs[0]["png"] == nil {
			t.Fatalf("results = %v", rs)
		}
		if _, err := os.Stat(filepath.Join(e.cwd, "red.png")); err != nil {
			t.Fatalf("the image was not saved too: %v", err)
		}
	})

	t.Run("dict has json", func(t *testing.T) {
		r := mainResult(t, e.run("{'k': [1, 2]}"))
		got, _ := json.Marshal(r["json"])
		if string(got) != `{"k":[1,2]}` {
			t.Fatalf("json = %s", got)
		}
	})

	t.Run("unknown mime types go to extra", func(t *testing.T) {
		lines := e.run("from IPython.display import display\ndisplay({'application/x-custom': 'v', 'text/plain': 'p'}, raw=True)")
		endsCleanly(t, lines)
		rs := ofType(lines, "result")
		if len(rs) != 1 || rs[0]["text"] != "p" || rs[0]["extra"].(map[string]any)["application/x-custom"] != "v" {
			t.Fatalf("results = %v", rs)
		}
	})

	t.Run("run env vars apply once", func(t *testing.T) {
		value := "it's \"quoted\"\n$(echo no) \\ é"
		lines := e.run("import os\nprint(os.environ['RUN_VAR'])\nprint(os.environ['HOME'])", "env_vars", map[string]string{"RUN_VAR": value, "HOME": "/elsewhere"})
		endsCleanly(t, lines)
		if got := stdout(lines); got != value+"\n/elsewhere\n" {
			t.Fatalf("stdout = %q", got)
		}
		lines = e.run("import os\nprint(os.environ.get('RUN_VAR'))\nprint(os.environ['HOME'] != '/elsewhere')")
		if got := stdout(lines); got != "None\nTrue\n" {
			t.Fatalf("after the run: %q", got)
		}
	})

	t.Run("sandbox env change reaches the kernel", func(t *testing.T) {
		body := strings.NewReader(`{"envVars": {"SANDBOX_LATE": "claimed"}}`)
		req, _ := http.NewRequest(http.MethodPost, e.envd.URL+"/init", body)
		req.Header.Set("X-Access-Token", token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusNoContent {
			t.Fatalf("/init: %d", resp.StatusCode)
		}
		lines := e.run("import os, subprocess\nprint(os.environ.get('SANDBOX_LATE'))\nprint(subprocess.run(['sh', '-c', 'echo $SANDBOX_LATE'], capture_output=True, text=True).stdout, end='')")
		if got := stdout(lines); got != "claimed\nclaimed\n" {
			t.Fatalf("stdout = %q", got)
		}
	})

	t.Run("executions on one context are serialized", func(t *testing.T) {
		var wg sync.WaitGroup
		var firstEnd, secondEnd time.Time
		var second []line
		wg.Add(2)
		go func() {
			defer wg.Done()
			e.run("import time\ntime.sleep(1.5)")
			firstEnd = time.Now()
		}()
		time.Sleep(300 * time.Millisecond)
		go func() {
			defer wg.Done()
			second = e.run("print('second')")
			secondEnd = time.Now()
		}()
		wg.Wait()
		if stdout(second) != "second\n" || !secondEnd.After(firstEnd) {
			t.Fatalf("second ended %v before the first; output %v", firstEnd.Sub(secondEnd), second)
		}
	})

	t.Run("keepalive while the code is quiet", func(t *testing.T) {
		lines := e.run("import time\ntime.sleep(5.5)\nprint('done')")
		endsCleanly(t, lines)
		if len(ofType(lines, "keepalive")) == 0 || stdout(lines) != "done\n" {
			t.Fatalf("no keepalive in %v", lines)
		}
	})

	t.Run("client disconnect interrupts the kernel", func(t *testing.T) {
		e.run("state = 'kept'")
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() {
			defer close(done)
			b, _ := json.Marshal(map[string]string{"code": "import time\nprint('started', flush=True)\ntime.sleep(30)"})
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, e.ts.URL+"/execute", bytes.NewReader(b))
			req.Header.Set("X-Access-Token", token)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				return
			}
			defer resp.Body.Close()
			sc := bufio.NewScanner(resp.Body)
			for sc.Scan() {
				if strings.Contains(sc.Text(), "started") {
					cancel()
				}
			}
		}()
		<-done
		cancel()
		start := time.Now()
		lines := e.run("state")
		endsCleanly(t, lines)
		if r := mainResult(t, lines); r["text"] != "kept" {
			t.Fatalf("state after interrupt = %v", r["text"])
		}
		if d := time.Since(start); d > 10*time.Second {
			t.Fatalf("next execution took %v; the sleep was not interrupted", d)
		}
	})

	t.Run("auth", func(t *testing.T) {
		req, _ := http.NewRequest(http.MethodPost, e.ts.URL+"/execute", strings.NewReader(`{"code":"1"}`))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized || !strings.Contains(string(b), `"code":401`) {
			t.Fatalf("without token: %d %s", resp.StatusCode, b)
		}
		if status, _ := e.do(http.MethodGet, "/contexts", nil); status != http.StatusOK {
			t.Fatalf("GET /contexts without token: %d", status)
		}
	})

	t.Run("bad requests", func(t *testing.T) {
		cases := []struct {
			body   string
			status int
			want   string
		}{
			{`{"code":"1","context_id":"x","language":"python"}`, 400, "Only one of context_id or language"},
			{`{"code":"1","context_id":"nope"}`, 404, "Context nope not found"},
			{`{"code":"1","language":"cobol"}`, 400, "unknown language cobol: this sandbox has kernels for bash, python"},
			{`{"code":"1","language":"cobol"}`, 400, "python"},
			{`{"code":`, 400, "invalid body"},
			{`{"context_id":"x"}`, 400, "code is required"},
			{`{"code":"1","timeout":5}`, 400, "timeout"},
			{`{"code":"1","env_vars":{"A=B":"c"}}`, 400, "invalid env var"},
		}
		for _, c := range cases {
			req, _ := http.NewRequest(http.MethodPost, e.ts.URL+"/execute", strings.NewReader(c.body))
			req.Header.Set("X-Access-Token", token)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != c.status || !strings.Contains(string(b), c.want) {
				t.Errorf("%s: %d %s; want %d containing %q", c.body, resp.StatusCode, b, c.status, c.want)
			}
		}
		if status, b := e.do(http.MethodGet, "/health", nil); status != 200 || string(b) != "\"OK\"\n" {
			t.Errorf("health: %d %q", status, b)
		}
		req, _ := http.NewRequest(http.MethodOptions, e.ts.URL+"/execute", nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusNoContent || resp.Header.Get("Access-Control-Allow-Origin") != "*" {
			t.Errorf("preflight: %d %v", resp.StatusCode, resp.Header)
		}
	})
}

func TestKernelDeathStartsFreshKernel(t *testing.T) {
	e := newEnv(t, nil)
	c := e.createContext("python", "")
	e.run("x = 41", "context_id", c.ID)
	lines := e.run("import os\nos.kill(os.getpid(), 9)", "context_id", c.ID)
	if len(lines) < 2 || lines[len(lines)-1]["type"] != "unexpected_end_of_execution" {
		t.Fatalf("stream = %v", lines)
	}
	errs := ofType(lines, "error")
	if len(errs) != 1 || errs[0]["name"] != "UnexpectedEndOfExecution" || !strings.Contains(errs[0]["value"].(string), "SIGKILL") {
		t.Fatalf("errors = %v", errs)
	}
	lines = e.run("x", "context_id", c.ID)
	if errs := ofType(lines, "error"); len(errs) != 1 || errs[0]["name"] != "NameError" {
		t.Fatalf("state survived the kernel's death: %v", lines)
	}
	if r := mainResult(t, e.run("import os\nos.getcwd()", "context_id", c.ID)); r["text"] != e.cwd {
		t.Fatalf("fresh kernel cwd = %v, want %s", r["text"], e.cwd)
	}
	// Only the live kernel's connection file is left, in a private dir.
	fi, err := os.Stat(e.runDir)
	if err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("runtime dir: %v %v", fi.Mode(), err)
	}
	if files, _ := os.ReadDir(e.runDir); len(files) != 1 {
		t.Fatalf("connection files = %v, want the live kernel's only", files)
	}
	e.srv.Close()
	if files, _ := os.ReadDir(e.runDir); len(files) != 0 {
		t.Fatalf("connection files after Close = %v", files)
	}
}

func TestBashContext(t *testing.T) {
	e := newEnv(t, nil)
	dir := t.TempDir()
	c := e.createContext("bash", dir)
	if c.Language != "bash" || c.Cwd != dir {
		t.Fatalf("context = %+v", c)
	}
	lines := e.run("echo hi; pwd", "context_id", c.ID)
	endsCleanly(t, lines)
	if got := stdout(lines); got != "hi\n"+dir+"\n" {
		t.Fatalf("stdout = %q", got)
	}
	value := "a 'b' $HOME `x`"
	lines = e.run("echo \"$RUN_VAR\"", "context_id", c.ID, "env_vars", map[string]string{"RUN_VAR": value})
	if got := stdout(lines); got != value+"\n" {
		t.Fatalf("env var in bash = %q", got)
	}
	if got := stdout(e.run("echo \"[${RUN_VAR-unset}]\"", "context_id", c.ID)); got != "[unset]\n" {
		t.Fatalf("after the run = %q", got)
	}
	// language "bash" gets its own default context, created on first use.
	if got := stdout(e.run("echo default", "language", "Bash")); got != "default\n" {
		t.Fatalf("default bash = %q", got)
	}
}

func TestContextLifecycle(t *testing.T) {
	e := newEnv(t, func(c *interp.Config) { c.MaxContexts = 3 })
	dir := t.TempDir()
	c := e.createContext("", dir)
	if c.Language != "python" || c.Cwd != dir || c.ID == "" {
		t.Fatalf("context = %+v", c)
	}
	e.run("y = 1", "context_id", c.ID)
	e.run("1", "language", "python") // the default python context

	status, b := e.do(http.MethodGet, "/contexts", nil)
	var list []interp.Context
	if err := json.Unmarshal(b, &list); status != 200 || err != nil {
		t.Fatalf("list: %d %s", status, b)
	}
	ids := map[string]int{}
	for _, l := range list {
		ids[l.ID]++
	}
	if len(list) != 2 || ids[c.ID] != 1 {
		t.Fatalf("list = %+v", list)
	}

	if status, b := e.do(http.MethodPost, "/contexts/"+c.ID+"/restart", nil); status != http.StatusNoContent {
		t.Fatalf("restart: %d %s", status, b)
	}
	if errs := ofType(e.run("y", "context_id", c.ID), "error"); len(errs) != 1 || errs[0]["name"] != "NameError" {
		t.Fatalf("state survived restart: %v", errs)
	}
	if r := mainResult(t, e.run("import os\nos.getcwd()", "context_id", c.ID)); r["text"] != dir {
		t.Fatalf("cwd after restart = %v", r["text"])
	}

	e.createContext("python", "")
	if status, b := e.do(http.MethodPost, "/contexts", map[string]string{"language": "python"}); status != http.StatusTooManyRequests || !strings.Contains(string(b), "at most 3") {
		t.Fatalf("over the cap: %d %s", status, b)
	}

	for _, bad := range []struct {
		body map[string]string
		want string
	}{
		{map[string]string{"cwd": filepath.Join(dir, "missing")}, "not a directory"},
		{map[string]string{"language": "cobol"}, "cobol"},
	} {
		if status, b := e.do(http.MethodPost, "/contexts", bad.body); status != http.StatusBadRequest || !strings.Contains(string(b), bad.want) {
			t.Errorf("create %v: %d %s", bad.body, status, b)
		}
	}

	if status, _ := e.do(http.MethodDelete, "/contexts/"+c.ID, nil); status != http.StatusNoContent {
		t.Fatalf("delete: %d", status)
	}
	if status, b := e.do(http.MethodDelete, "/contexts/"+c.ID, nil); status != http.StatusNotFound || !strings.Contains(string(b), "Context "+c.ID+" not found") {
		t.Fatalf("delete again: %d %s", status, b)
	}
	if status, _ := e.do(http.MethodPost, "/contexts/"+c.ID+"/restart", nil); status != http.StatusNotFound {
		t.Fatalf("restart deleted: %d", status)
	}
	if _, b = e.do(http.MethodGet, "/contexts", nil); strings.Contains(string(b), c.ID) {
		t.Fatalf("deleted context still listed: %s", b)
	}
}
