package cubicle

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// These cover behaviour a real server cannot be made to show on demand
// (429/503 storms, Retry-After, odd bodies); everything else is tested
// against a real `cubicle serve` in test/integration/sdk_test.go.

func testClient(t *testing.T, h http.HandlerFunc, mod func(*Config)) *Client {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	cfg := Config{APIURL: srv.URL, APIKey: "k", MaxRetryWait: 50 * time.Millisecond}
	if mod != nil {
		mod(&cfg)
	}
	c, err := NewClient(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestRetriesHonourRetryAfter(t *testing.T) {
	var calls atomic.Int32
	c := testClient(t, func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-API-Key") != "k" {
			t.Errorf("no api key")
		}
		n := calls.Add(1)
		switch n {
		case 1:
			w.Header().Set("Retry-After", "0")
			w.WriteHeader(429)
			fmt.Fprint(w, `{"code":429,"message":"no capacity"}`)
		case 2:
			w.WriteHeader(503)
			fmt.Fprint(w, `{"code":503,"message":"busy"}`)
		default:
			fmt.Fprint(w, `{"sandboxID":"sb1","templateID":"base","state":"running"}`)
		}
	}, nil)
	info, err := c.Get(context.Background(), "sb1")
	if err != nil || info.SandboxID != "sb1" || calls.Load() != 3 {
		t.Fatalf("%+v %v after %d calls", info, err, calls.Load())
	}
}

func TestRetriesGiveUpTyped(t *testing.T) {
	var calls atomic.Int32
	c := testClient(t, func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		w.Header().Set("Retry-After", "1")
		w.WriteHeader(429)
		fmt.Fprint(w, `{"code":429,"message":"sandbox limit reached","error_code":"sandbox_capacity_unavailable"}`)
	}, func(c *Config) { c.Retries = 2 })
	start := time.Now()
	_, err := c.Create(context.Background(), CreateOptions{})
	var ae *APIError
	if !errors.Is(err, ErrRateLimited) || !errors.As(err, &ae) || ae.RetryAfter != time.Second || ae.ErrorCode != "sandbox_capacity_unavailable" {
		t.Fatalf("err %#v", err)
	}
	if calls.Load() != 3 {
		t.Fatalf("%d calls, want 1 + 2 retries", calls.Load())
	}
	// Retry-After of 1 s is capped by MaxRetryWait (50 ms) here.
	if time.Since(start) > 5*time.Second {
		t.Fatalf("waited %v", time.Since(start))
	}
}

func TestNoRetryOnClientErrors(t *testing.T) {
	var calls atomic.Int32
	c := testClient(t, func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		w.WriteHeader(400)
		fmt.Fprint(w, `{"code":400,"message":"bad"}`)
	}, nil)
	if _, err := c.Get(context.Background(), "x"); !errors.Is(err, ErrInvalidArgument) || calls.Load() != 1 {
		t.Fatalf("%v after %d calls", err, calls.Load())
	}
	c2 := testClient(t, func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		w.WriteHeader(429)
	}, func(c *Config) { c.Retries = -1 })
	calls.Store(0)
	if _, err := c2.Get(context.Background(), "x"); !errors.Is(err, ErrRateLimited) || calls.Load() != 1 {
		t.Fatalf("retries disabled: %v after %d calls", err, calls.Load())
	}
}

func TestCancelDuringBackoff(t *testing.T) {
	c := testClient(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Retry-After", "30")
		w.WriteHeader(503)
	}, func(c *Config) { c.MaxRetryWait = time.Minute })
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if _, err := c.Get(ctx, "x"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("%v", err)
	}
}

func TestRequestTimeout(t *testing.T) {
	block := make(chan struct{})
	t.Cleanup(func() { close(block) })
	c := testClient(t, func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-block:
		case <-r.Context().Done():
		}
	}, func(c *Config) { c.RequestTimeout = 100 * time.Millisecond })
	if _, err := c.Get(context.Background(), "x"); !errors.Is(err, ErrTimeout) {
		t.Fatalf("%v", err)
	}
}

func TestErrorMapping(t *testing.T) {
	cases := []struct {
		status int
		body   string
		res    resource
		is     []error
		isNot  []error
	}{
		{404, `{"code":404,"message":"x"}`, resSandbox, []error{ErrNotFound, ErrSandboxNotFound}, []error{ErrVolumeNotFound, ErrTemplateNotFound}},
		// error_code decides over the resource the call was about.
		{404, `{"code":404,"message":"x","error_code":"volume_not_found"}`, resTemplate, []error{ErrNotFound, ErrVolumeNotFound}, []error{ErrTemplateNotFound}},
		{409, `{"code":409,"message":"in use","error_code":"volume_in_use"}`, resNone, []error{ErrConflict, ErrVolumeInUse}, nil},
		{409, `{"code":409,"message":"exists"}`, resNone, []error{ErrConflict}, []error{ErrVolumeInUse}},
		{409, `{"code":409,"message":"in use"}`, resVolume, []error{ErrVolumeInUse}, nil},
		{401, `not json`, resNone, []error{ErrUnauthorized}, []error{ErrNotFound}},
		// The volume-content API puts a string in code: only the status counts.
		{404, `{"code":"not_found","message":"no such path"}`, resFile, []error{ErrFileNotFound, ErrNotFound}, nil},
		{507, `{"code":507,"message":"full"}`, resFile, []error{ErrNotEnoughSpace}, nil},
		{504, ``, resNone, []error{ErrTimeout}, nil},
		{403, `{"code":403,"message":"other team"}`, resTemplate, []error{ErrForbidden}, []error{ErrTemplateNotFound}},
		{404, `{"code":404,"message":"secret x not found"}`, resSecret, []error{ErrNotFound, ErrSecretNotFound}, []error{ErrVolumeNotFound, ErrSandboxNotFound}},
		{404, `{"code":404,"message":"x"}`, resVolume, []error{ErrVolumeNotFound}, []error{ErrSecretNotFound}},
	}
	for i, tc := range cases {
		rec := httptest.NewRecorder()
		rec.WriteHeader(tc.status)
		rec.WriteString(tc.body)
		e := apiErrorFrom(rec.Result(), "GET", "/x", tc.res)
		for _, want := range tc.is {
			if !errors.Is(e, want) {
				t.Errorf("case %d: %v is not %v", i, e, want)
			}
		}
		for _, no := range tc.isNot {
			if errors.Is(e, no) {
				t.Errorf("case %d: %v is %v", i, e, no)
			}
		}
		if e.Message == "" {
			t.Errorf("case %d: empty message", i)
		}
	}
}

func TestConfigFromEnvPrecedence(t *testing.T) {
	for _, k := range []string{"CUBICLE_API_URL", "E2B_API_URL", "CUBE_API_URL", "CUBICLE_API_KEY", "E2B_API_KEY", "CUBE_API_KEY",
		"CUBICLE_SANDBOX_URL", "E2B_SANDBOX_URL", "CUBICLE_DOMAIN", "E2B_DOMAIN", "CUBE_SANDBOX_DOMAIN", "CUBICLE_TEMPLATE_ID",
		"CUBE_TEMPLATE_ID", "CUBICLE_VOLUME_API_URL", "E2B_VOLUME_API_URL", "CUBICLE_PROXY_NODE_IP", "CUBE_PROXY_NODE_IP",
		"CUBICLE_PROXY_PORT", "CUBE_PROXY_PORT_HTTP", "CUBICLE_PROXY_SCHEME", "CUBE_PROXY_SCHEME"} {
		t.Setenv(k, "")
	}
	t.Setenv("CUBE_API_URL", "http://cube:3000")
	t.Setenv("CUBE_API_KEY", "cube-key")
	t.Setenv("CUBE_TEMPLATE_ID", "tpl-cube")
	t.Setenv("CUBE_PROXY_NODE_IP", "10.0.0.9")
	t.Setenv("CUBE_PROXY_PORT_HTTP", "8080")
	c := ConfigFromEnv()
	if c.APIURL != "http://cube:3000" || c.APIKey != "cube-key" || c.TemplateID != "tpl-cube" || c.ProxyNodeIP != "10.0.0.9" || c.ProxyPort != 8080 {
		t.Fatalf("CUBE_*: %+v", c)
	}
	t.Setenv("E2B_API_URL", "http://e2b:3000")
	t.Setenv("E2B_API_KEY", "e2b-key")
	t.Setenv("E2B_SANDBOX_URL", "http://e2b:49983")
	t.Setenv("E2B_DOMAIN", "e2b.example")
	c = ConfigFromEnv()
	if c.APIURL != "http://e2b:3000" || c.APIKey != "e2b-key" || c.SandboxURL != "http://e2b:49983" || c.Domain != "e2b.example" {
		t.Fatalf("E2B_* over CUBE_*: %+v", c)
	}
	t.Setenv("CUBICLE_API_URL", "http://cubicle:3000")
	t.Setenv("CUBICLE_API_KEY", "cubicle-key")
	t.Setenv("CUBICLE_SANDBOX_URL", "http://cubicle:3000")
	t.Setenv("CUBICLE_TEMPLATE_ID", "mine")
	c = ConfigFromEnv()
	if c.APIURL != "http://cubicle:3000" || c.APIKey != "cubicle-key" || c.SandboxURL != "http://cubicle:3000" || c.TemplateID != "mine" {
		t.Fatalf("CUBICLE_* first: %+v", c)
	}
}

func TestNewClientDefaults(t *testing.T) {
	if _, err := NewClient(Config{}); !errors.Is(err, ErrMissingAPIKey) || !errors.Is(err, ErrUnauthorized) {
		t.Fatalf("no key: %v", err)
	}
	if _, err := NewClient(Config{APIKey: "k", APIURL: "ftp://x"}); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("bad url: %v", err)
	}
	c, err := NewClient(Config{APIKey: "k"})
	if err != nil || c.Config().APIURL != DefaultAPIURL || c.Config().TemplateID != DefaultTemplate || c.Config().Retries != 3 {
		t.Fatalf("defaults: %+v %v", c.Config(), err)
	}
	c, _ = NewClient(Config{APIKey: "k", Domain: "cubicle.example"})
	if c.Config().APIURL != "https://api.cubicle.example" {
		t.Fatalf("domain → api url: %s", c.Config().APIURL)
	}
}

// Where envd traffic goes for each configuration, and the headers it carries.
func TestEnvdRouting(t *testing.T) {
	type seen struct{ host, id, port, token, path string }
	got := make(chan seen, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got <- seen{r.Host, r.Header.Get("E2b-Sandbox-Id"), r.Header.Get("E2b-Sandbox-Port"), r.Header.Get("X-Access-Token"), r.URL.Path}
		w.WriteHeader(204)
	}))
	defer srv.Close()
	hostport := srv.Listener.Addr().String()
	ip, port, _ := splitHostPort(hostport)
	cases := []struct {
		name     string
		cfg      Config
		wantHost string
	}{
		{"sandbox url", Config{APIURL: "http://127.0.0.1:1", SandboxURL: srv.URL}, hostport},
		{"api url", Config{APIURL: srv.URL}, hostport},
		{"proxy node", Config{APIURL: "http://127.0.0.1:1", ProxyNodeIP: ip, ProxyPort: port, Domain: "cube.test"}, "49983-sb1.cube.test"},
	}
	for _, tc := range cases {
		tc.cfg.APIKey = "k"
		c, err := NewClient(tc.cfg)
		if err != nil {
			t.Fatal(err)
		}
		sb := c.sandboxFrom(sandboxJSON{SandboxID: "sb1", EnvdAccessToken: "tok"})
		if ok, err := sb.IsRunning(context.Background()); !ok || err != nil {
			t.Fatalf("%s: %v %v", tc.name, ok, err)
		}
		s := <-got
		if s.host != tc.wantHost || s.id != "sb1" || s.port != "49983" || s.token != "tok" || s.path != "/health" {
			t.Errorf("%s: %+v", tc.name, s)
		}
	}
	// With a domain and nothing else, envd is https://49983-<id>.<domain>.
	c, _ := NewClient(Config{APIKey: "k", Domain: "cubicle.example"})
	sb := c.sandboxFrom(sandboxJSON{SandboxID: "sb1"})
	if base, _ := c.envdBase(sb); base != "https://49983-sb1.cubicle.example" {
		t.Errorf("domain base %s", base)
	}
	if h := sb.GetHost(8080); h != "8080-sb1.cubicle.example" {
		t.Errorf("host %s", h)
	}
	if u := sb.PortURL(8080); u != "https://8080-sb1.cubicle.example" {
		t.Errorf("port url %s", u)
	}
}

func splitHostPort(hp string) (string, int, error) {
	host, p, err := net.SplitHostPort(hp)
	if err != nil {
		return "", 0, err
	}
	port, err := strconv.Atoi(p)
	return host, port, err
}

func TestRefusedIsNotTimeout(t *testing.T) {
	c, _ := NewClient(Config{APIURL: "http://127.0.0.1:1", APIKey: "k"})
	_, err := c.Get(context.Background(), "x")
	if err == nil || errors.Is(err, ErrTimeout) || !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("%v", err)
	}
}
