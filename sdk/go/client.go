package cubicle

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"
)

// Version is the SDK version sent in the User-Agent.
const Version = "0.1.0"

// DefaultAPIURL is where `cubicle serve` listens by default.
const DefaultAPIURL = "http://127.0.0.1:3000"

// DefaultTemplate is the template Create uses when neither the options
// nor the Config name one.
const DefaultTemplate = "base"

// envdPort is the in-sandbox agent's port, used for routing.
const envdPort = 49983

// Config says where Cubicle is and how to authenticate. The zero value of
// a field means its default; ConfigFromEnv fills it from the environment.
type Config struct {
	// APIURL is the control plane (default DefaultAPIURL, or
	// https://api.<Domain> when only Domain is set).
	APIURL string
	// APIKey is sent as X-API-Key.
	APIKey string
	// SandboxURL, when set, is the envd base URL for every sandbox; the
	// sandbox is then picked by the E2b-Sandbox-Id header. When empty:
	// ProxyNodeIP if set, else https://49983-<id>.<domain> when a domain is
	// known, else APIURL (Cubicle serves envd on the API port).
	SandboxURL string
	// Domain is the sandbox domain (<port>-<id>.<domain>) when the server
	// does not return one.
	Domain string
	// TemplateID is Create's default template (default "base").
	TemplateID string
	// VolumeAPIURL is the volume-content API (default APIURL).
	VolumeAPIURL string
	// ProxyNodeIP reaches sandboxes through this proxy address while
	// sending the <port>-<id>.<domain> Host (CubeSandbox's CUBE_PROXY_NODE_IP).
	ProxyNodeIP string
	// ProxyPort and ProxyScheme go with ProxyNodeIP (default 80, "http").
	ProxyPort   int
	ProxyScheme string
	// HTTPClient carries every request (default: a client without a global
	// timeout; per-request deadlines come from RequestTimeout and ctx).
	HTTPClient *http.Client
	// RequestTimeout bounds each non-streaming request (default 60 s;
	// negative: none).
	RequestTimeout time.Duration
	// Retries is how often a 429/503 is retried (default 3; negative: never).
	Retries int
	// MaxRetryWait caps one wait between retries (default 30 s).
	MaxRetryWait time.Duration
	// UserAgent is appended to the SDK's own.
	UserAgent string
}

// envFirst returns the first non-empty variable.
func envFirst(names ...string) string {
	for _, n := range names {
		if v := strings.TrimSpace(os.Getenv(n)); v != "" {
			return v
		}
	}
	return ""
}

// ConfigFromEnv reads CUBICLE_*, falling back to the e2b SDK's E2B_* and
// CubeSandbox's CUBE_* variables so existing setups work unchanged.
func ConfigFromEnv() Config {
	c := Config{
		APIURL:       envFirst("CUBICLE_API_URL", "E2B_API_URL", "CUBE_API_URL"),
		APIKey:       envFirst("CUBICLE_API_KEY", "E2B_API_KEY", "CUBE_API_KEY"),
		SandboxURL:   envFirst("CUBICLE_SANDBOX_URL", "E2B_SANDBOX_URL"),
		Domain:       envFirst("CUBICLE_DOMAIN", "E2B_DOMAIN", "CUBE_SANDBOX_DOMAIN"),
		TemplateID:   envFirst("CUBICLE_TEMPLATE_ID", "CUBE_TEMPLATE_ID"),
		VolumeAPIURL: envFirst("CUBICLE_VOLUME_API_URL", "E2B_VOLUME_API_URL"),
		ProxyNodeIP:  envFirst("CUBICLE_PROXY_NODE_IP", "CUBE_PROXY_NODE_IP"),
		ProxyScheme:  envFirst("CUBICLE_PROXY_SCHEME", "CUBE_PROXY_SCHEME"),
	}
	if p, err := strconv.Atoi(envFirst("CUBICLE_PROXY_PORT", "CUBE_PROXY_PORT_HTTP")); err == nil {
		c.ProxyPort = p
	}
	return c
}

// Client talks to one Cubicle (or e2b-compatible) control plane. It is safe
// for concurrent use.
type Client struct {
	cfg  Config
	api  *url.URL
	http *http.Client
	ua   string
}

// NewClient checks cfg and fills defaults. It makes no request.
func NewClient(cfg Config) (*Client, error) {
	if cfg.APIKey == "" {
		return nil, ErrMissingAPIKey
	}
	if cfg.APIURL == "" {
		cfg.APIURL = DefaultAPIURL
		if cfg.Domain != "" {
			cfg.APIURL = "https://api." + cfg.Domain
		}
	}
	u, err := url.Parse(strings.TrimRight(cfg.APIURL, "/"))
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("%w: API URL %q must be http(s)://host[:port]", ErrInvalidArgument, cfg.APIURL)
	}
	for _, s := range []*string{&cfg.SandboxURL, &cfg.VolumeAPIURL} {
		*s = strings.TrimRight(*s, "/")
		if *s != "" {
			if v, err := url.Parse(*s); err != nil || v.Host == "" {
				return nil, fmt.Errorf("%w: URL %q must be http(s)://host[:port]", ErrInvalidArgument, *s)
			}
		}
	}
	if cfg.TemplateID == "" {
		cfg.TemplateID = DefaultTemplate
	}
	if cfg.HTTPClient == nil {
		cfg.HTTPClient = &http.Client{}
	}
	if cfg.RequestTimeout == 0 {
		cfg.RequestTimeout = 60 * time.Second
	}
	if cfg.Retries == 0 {
		cfg.Retries = 3
	}
	if cfg.MaxRetryWait <= 0 {
		cfg.MaxRetryWait = 30 * time.Second
	}
	if cfg.ProxyPort == 0 {
		cfg.ProxyPort = 80
	}
	if cfg.ProxyScheme == "" {
		cfg.ProxyScheme = "http"
	}
	ua := "cubicle-go-sdk/" + Version
	if cfg.UserAgent != "" {
		ua += " " + cfg.UserAgent
	}
	return &Client{cfg: cfg, api: u, http: cfg.HTTPClient, ua: ua}, nil
}

// Config returns the effective configuration (defaults filled in).
func (c *Client) Config() Config { return c.cfg }

// request is one control-plane call.
type request struct {
	method string
	path   string // with escaped path segments
	query  url.Values
	body   any // JSON-encoded; nil for none
	out    any // JSON-decoded from a 2xx body when non-nil
	res    resource
	header http.Header // extra request headers
	// ok lists extra statuses that count as success (besides 2xx).
	ok []int
}

// response is what do returns on success.
type response struct {
	status int
	header http.Header
}

// do sends r with retries on 429/503 (the body is a byte slice, so always
// replayable) and maps failures to *APIError.
func (c *Client) do(ctx context.Context, r request) (*response, error) {
	var body []byte
	if r.body != nil {
		b, err := json.Marshal(r.body)
		if err != nil {
			return nil, fmt.Errorf("%w: encode request: %v", ErrInvalidArgument, err)
		}
		body = b
	}
	// r.path is already escaped segment by segment (IDs may hold ':' or '/').
	target := c.api.String() + r.path
	if q := r.query.Encode(); q != "" {
		target += "?" + q
	}
	for attempt := 0; ; attempt++ {
		resp, err := c.once(ctx, r, target, body)
		if err != nil {
			return nil, err
		}
		if resp.StatusCode/100 == 2 || containsInt(r.ok, resp.StatusCode) {
			defer resp.Body.Close()
			if r.out != nil && resp.StatusCode != http.StatusNoContent {
				if err := json.NewDecoder(resp.Body).Decode(r.out); err != nil && err != io.EOF {
					return nil, fmt.Errorf("%s %s: decode response: %w", r.method, r.path, err)
				}
			}
			io.Copy(io.Discard, resp.Body)
			return &response{status: resp.StatusCode, header: resp.Header}, nil
		}
		apiErr := apiErrorFrom(resp, r.method, r.path, r.res)
		resp.Body.Close()
		if attempt >= c.cfg.Retries || (resp.StatusCode != http.StatusTooManyRequests && resp.StatusCode != http.StatusServiceUnavailable) {
			return nil, apiErr
		}
		if err := sleepCtx(ctx, c.backoff(attempt, apiErr.RetryAfter)); err != nil {
			return nil, err
		}
	}
}

func (c *Client) once(ctx context.Context, r request, target string, body []byte) (*http.Response, error) {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	rctx, cancel := ctx, context.CancelFunc(func() {})
	if c.cfg.RequestTimeout > 0 {
		rctx, cancel = context.WithTimeout(ctx, c.cfg.RequestTimeout)
	}
	req, err := http.NewRequestWithContext(rctx, r.method, target, rd)
	if err != nil {
		cancel()
		return nil, fmt.Errorf("%w: %v", ErrInvalidArgument, err)
	}
	c.apiHeaders(req.Header)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, v := range r.header {
		req.Header[k] = v
	}
	resp, err := c.http.Do(req)
	if err != nil {
		timedOut := rctx.Err() != nil // before cancel, which sets it too
		cancel()
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if timedOut {
			return nil, fmt.Errorf("%w: %s %s: no answer within %s", ErrTimeout, r.method, r.path, c.cfg.RequestTimeout)
		}
		return nil, fmt.Errorf("%s %s: %w", r.method, c.api.Redacted(), err)
	}
	resp.Body = cancelOnClose{resp.Body, cancel}
	return resp, nil
}

func (c *Client) apiHeaders(h http.Header) {
	h.Set("X-API-Key", c.cfg.APIKey)
	h.Set("User-Agent", c.ua)
}

// backoff is Retry-After when given (capped), else exponential with jitter.
func (c *Client) backoff(attempt int, hint time.Duration) time.Duration {
	d := hint
	if d <= 0 {
		d = time.Duration(250*(1<<attempt)) * time.Millisecond
		d += time.Duration(rand.Int64N(int64(d / 2)))
	}
	return min(d, c.cfg.MaxRetryWait)
}

type cancelOnClose struct {
	io.ReadCloser
	cancel context.CancelFunc
}

// Close closes the body and releases its request context.
func (b cancelOnClose) Close() error {
	err := b.ReadCloser.Close()
	b.cancel()
	return err
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

func containsInt(list []int, v int) bool {
	for _, x := range list {
		if x == v {
			return true
		}
	}
	return false
}

// seg escapes one path segment.
func seg(s string) string { return url.PathEscape(s) }
