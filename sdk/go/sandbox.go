package cubicle

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// VolumeMount attaches a volume (by name or ID) at Path.
type VolumeMount struct {
	Name     string `json:"name"`
	Path     string `json:"path"`
	ReadOnly bool   `json:"readOnly,omitempty"`
}

// NetworkConfig is the sandbox's egress and ingress policy, as set at
// Create (CreateOptions.Network) and as SandboxInfo.Network reports it.
// Every field is optional; the zero value changes nothing. UpdateNetwork
// changes the egress part (AllowOut, DenyOut, Rules, EgressProxy,
// DNSServers) of a running sandbox; the other fields are fixed at create.
type NetworkConfig struct {
	// AllowPublicTraffic false makes sandbox ports need the traffic token.
	AllowPublicTraffic *bool `json:"allowPublicTraffic,omitempty"`
	// AllowOut and DenyOut are CIDRs, IPs, domains or *.domain wildcards
	// (domains in DenyOut are a Cubicle extension). Allow wins over deny,
	// so DenyOut ["0.0.0.0/0"] with AllowOut ["pypi.org"] reaches only
	// pypi.org.
	AllowOut []string `json:"allowOut,omitempty"`
	DenyOut  []string `json:"denyOut,omitempty"`
	// MaskRequestHost is the Host header the proxy sends to the sandbox's
	// ports; "${PORT}" in it is replaced by the port (create only).
	MaskRequestHost string `json:"maskRequestHost,omitempty"`
	// HTTPSPorts lists the sandbox ports whose services speak HTTPS
	// themselves: the proxy reaches them over TLS (without verifying the
	// certificate) instead of plain HTTP. Not envd's port (create only).
	HTTPSPorts []int `json:"httpsPorts,omitempty"`
	// Rules are per-host transforms applied by the egress proxy to the
	// sandbox's HTTPS requests: the key is a host name or *.domain
	// (lower-cased by the server), the value its rules in order. Header
	// values may hold SecretPlaceholder(name), filled in with the secret's
	// current value at request time, so the sandbox never sees it. A rule
	// does not open the host: list it in AllowOut too when egress is
	// restricted.
	Rules map[string][]NetworkRule `json:"rules,omitempty"`
	// EgressProxy tunnels all of the sandbox's TCP through a SOCKS5 proxy
	// of yours, after AllowOut/DenyOut filtering; it fails closed when the
	// proxy is down. Info never reports its Password or TLS.CACert.
	EgressProxy *EgressProxy `json:"egressProxy,omitempty"`
	// DNSServers, when the policy has domain entries, replaces the default
	// opening of the node's resolvers (port 53) with all traffic to each
	// listed IPv4 address. nil leaves the default; a non-nil empty list
	// (&[]string{}) opens none. It does not change the sandbox's
	// resolv.conf. At most 10, IPv4 only.
	DNSServers *[]string `json:"dnsServers,omitempty"`
}

// NetworkRule is one entry of NetworkConfig.Rules (e2b's
// SandboxNetworkRule).
type NetworkRule struct {
	Transform *NetworkTransform `json:"transform,omitempty"`
}

// NetworkTransform is what a NetworkRule does to a matching request.
type NetworkTransform struct {
	// Headers are set on the request, replacing any of the same name
	// (names are case-insensitive). Framing and routing headers (Host,
	// Content-Length, Transfer-Encoding, Connection, ...) are refused.
	Headers map[string]string `json:"headers,omitempty"`
}

// EgressProxy is a SOCKS5 proxy the sandbox's outbound TCP goes through
// (e2b's SandboxEgressProxyConfig).
type EgressProxy struct {
	// Address is host:port, without a scheme (always SOCKS5).
	Address string `json:"address"`
	// Username and Password are RFC 1929 credentials; a Password needs a
	// Username. The Password is write-only: Info leaves it empty.
	Username string `json:"username,omitempty"`
	Password string `json:"password,omitempty"`
	// TLS wraps the hop to the proxy in TLS.
	TLS *EgressProxyTLS `json:"tls,omitempty"`
}

// EgressProxyTLS configures TLS to the egress proxy.
type EgressProxyTLS struct {
	Enabled bool `json:"enabled"`
	// ServerName overrides the name the proxy's certificate is checked
	// against (default: Address's host). Only with Enabled.
	ServerName string `json:"serverName,omitempty"`
	// CACert is the PEM CA the proxy's certificate must chain to (default:
	// the server host's trust store). Only with Enabled; write-only, Info
	// leaves it empty.
	CACert string `json:"caCert,omitempty"`
}

// NetworkUpdate is the egress configuration UpdateNetwork sets (e2b's
// SandboxNetworkUpdateConfig). It replaces the whole configuration: a field
// left zero is cleared, not kept (an update without EgressProxy stops
// tunnelling, one without Rules drops them). AllowPublicTraffic,
// MaskRequestHost and HTTPSPorts are fixed at create and kept.
type NetworkUpdate struct {
	// AllowInternetAccess false cuts all egress not in AllowOut; nil is true.
	AllowInternetAccess *bool                    `json:"allow_internet_access,omitempty"`
	AllowOut            []string                 `json:"allowOut,omitempty"`
	DenyOut             []string                 `json:"denyOut,omitempty"`
	Rules               map[string][]NetworkRule `json:"rules,omitempty"`
	EgressProxy         *EgressProxy             `json:"egressProxy,omitempty"`
	// DNSServers: nil is the default, &[]string{} none (see NetworkConfig).
	DNSServers *[]string `json:"dnsServers,omitempty"`
}

// dnsWire keeps a non-nil DNSServers that points at a nil slice meaning
// "none": encoding/json would send it as null, which the server reads as
// "the default".
func dnsWire(p *[]string) *[]string {
	if p != nil && *p == nil {
		return &[]string{}
	}
	return p
}

// AcceleratorRequest asks for devices (a Cubicle extension to e2b's create).
type AcceleratorRequest struct {
	Class       string            `json:"class"` // gpu, tpu, xpu, other
	Count       int               `json:"count"`
	Labels      map[string]string `json:"labels,omitempty"`
	Backend     string            `json:"backend,omitempty"` // passthrough, vfio
	Vendor      string            `json:"vendor,omitempty"`
	MinMemoryMB int64             `json:"minMemoryMB,omitempty"`
}

// CreateOptions configures Create. Only Template has a default of its own
// (Config.TemplateID); the server defaults the rest.
type CreateOptions struct {
	Template string
	// Timeout is the sandbox's lifetime before it is killed (or paused with
	// AutoPause); 0 means the server's default (300 s).
	Timeout   time.Duration
	AutoPause bool
	// PauseWithoutMemory makes the AutoPause a filesystem pause: processes
	// end, files stay, and the next connect boots the sandbox afresh
	// (e2b's onTimeout keepMemory: false).
	PauseWithoutMemory bool
	Env                map[string]string
	Metadata           map[string]string
	// AllowInternetAccess false cuts all egress.
	AllowInternetAccess *bool
	// Network is the sandbox's network policy (nil: the server's default,
	// all egress allowed).
	Network      *NetworkConfig
	VolumeMounts []VolumeMount
	Accelerators []AcceleratorRequest
	// IdempotencyKey makes retried creates return the first sandbox.
	IdempotencyKey string
}

// SandboxInfo is what the API reports about a sandbox.
type SandboxInfo struct {
	SandboxID    string               `json:"sandboxID"`
	TemplateID   string               `json:"templateID"`
	Alias        string               `json:"alias,omitempty"`
	ClientID     string               `json:"clientID"`
	StartedAt    time.Time            `json:"startedAt"`
	EndAt        time.Time            `json:"endAt"`
	CPUCount     int                  `json:"cpuCount"`
	MemoryMB     int                  `json:"memoryMB"`
	DiskSizeMB   int                  `json:"diskSizeMB"`
	Metadata     map[string]string    `json:"metadata,omitempty"`
	State        string               `json:"state"` // running, paused
	EnvdVersion  string               `json:"envdVersion"`
	VolumeMounts []VolumeMount        `json:"volumeMounts,omitempty"`
	Accelerators []AcceleratorRequest `json:"accelerators,omitempty"`
	// Detail fields (Get only). Network is the stored policy, without the
	// egress proxy's Password and TLS.CACert.
	EnvdAccessToken     string         `json:"envdAccessToken,omitempty"`
	AllowInternetAccess *bool          `json:"allowInternetAccess,omitempty"`
	Domain              *string        `json:"domain,omitempty"`
	Network             *NetworkConfig `json:"network,omitempty"`
	Lifecycle           *struct {
		AutoResume bool   `json:"autoResume"`
		OnTimeout  string `json:"onTimeout"`
	} `json:"lifecycle,omitempty"`
}

// sandboxJSON is e2b's Sandbox (the create/connect answer).
type sandboxJSON struct {
	SandboxID          string  `json:"sandboxID"`
	TemplateID         string  `json:"templateID"`
	ClientID           string  `json:"clientID"`
	EnvdVersion        string  `json:"envdVersion"`
	EnvdAccessToken    string  `json:"envdAccessToken"`
	TrafficAccessToken *string `json:"trafficAccessToken"`
	Domain             *string `json:"domain"`
	Alias              string  `json:"alias"`
}

// Sandbox is a handle on one running sandbox: its commands, files and ports.
type Sandbox struct {
	c *Client
	// ID is the sandbox ID.
	ID string
	// TemplateID is the template it was made from.
	TemplateID string
	// EnvdVersion is the in-sandbox agent's protocol version.
	EnvdVersion string
	// AccessToken authenticates envd calls (X-Access-Token); empty when the
	// sandbox is not secured.
	AccessToken string
	// TrafficAccessToken guards private sandbox ports.
	TrafficAccessToken string
	// Domain is the sandbox domain the server returned ("" when none).
	Domain string
	envd   *envdConn
}

func (c *Client) sandboxFrom(j sandboxJSON) *Sandbox {
	sb := &Sandbox{c: c, ID: j.SandboxID, TemplateID: j.TemplateID, EnvdVersion: j.EnvdVersion, AccessToken: j.EnvdAccessToken}
	if j.TrafficAccessToken != nil {
		sb.TrafficAccessToken = *j.TrafficAccessToken
	}
	if j.Domain != nil {
		sb.Domain = *j.Domain
	}
	sb.envd = c.newEnvd(sb)
	return sb
}

// Create starts a sandbox and returns a handle on it.
func (c *Client) Create(ctx context.Context, o CreateOptions) (*Sandbox, error) {
	tpl := o.Template
	if tpl == "" {
		tpl = c.cfg.TemplateID
	}
	body := map[string]any{"templateID": tpl}
	if o.Timeout > 0 {
		body["timeout"] = int64((o.Timeout + time.Second - 1) / time.Second)
	} else if o.Timeout < 0 {
		return nil, fmt.Errorf("%w: negative timeout", ErrInvalidArgument)
	}
	if o.AutoPause {
		body["autoPause"] = true
	}
	if o.PauseWithoutMemory {
		if !o.AutoPause {
			return nil, fmt.Errorf("%w: PauseWithoutMemory needs AutoPause", ErrInvalidArgument)
		}
		body["autoPauseMemory"] = false
	}
	if len(o.Env) > 0 {
		body["envVars"] = o.Env
	}
	if len(o.Metadata) > 0 {
		body["metadata"] = o.Metadata
	}
	if o.AllowInternetAccess != nil {
		body["allow_internet_access"] = *o.AllowInternetAccess
	}
	if o.Network != nil {
		n := *o.Network
		n.DNSServers = dnsWire(n.DNSServers)
		body["network"] = &n
	}
	if len(o.VolumeMounts) > 0 {
		body["volumeMounts"] = o.VolumeMounts
	}
	if len(o.Accelerators) > 0 {
		body["accelerators"] = o.Accelerators
	}
	var h http.Header
	if o.IdempotencyKey != "" {
		h = http.Header{"Idempotency-Key": {o.IdempotencyKey}}
	}
	var j sandboxJSON
	if _, err := c.do(ctx, request{method: http.MethodPost, path: "/v2/sandboxes", body: body, out: &j, res: resTemplate, header: h}); err != nil {
		return nil, err
	}
	return c.sandboxFrom(j), nil
}

// Connect returns a handle on an existing sandbox, resuming it when paused.
// timeout extends its lifetime to at least now+timeout (0: server default).
func (c *Client) Connect(ctx context.Context, sandboxID string, timeout time.Duration) (*Sandbox, error) {
	body := map[string]any{}
	if timeout > 0 {
		body["timeout"] = int64((timeout + time.Second - 1) / time.Second)
	}
	var j sandboxJSON
	if _, err := c.do(ctx, request{method: http.MethodPost, path: "/v2/sandboxes/" + seg(sandboxID) + "/connect", body: body, out: &j, res: resSandbox}); err != nil {
		return nil, err
	}
	return c.sandboxFrom(j), nil
}

// Attach returns a handle on a running sandbox without resuming it or
// touching its lifetime (Connect does both). A paused sandbox is an
// ErrConflict.
func (c *Client) Attach(ctx context.Context, sandboxID string) (*Sandbox, error) {
	info, err := c.Get(ctx, sandboxID)
	if err != nil {
		return nil, err
	}
	if info.State != "running" {
		return nil, fmt.Errorf("%w: sandbox %s is %s; Connect resumes it", ErrConflict, sandboxID, info.State)
	}
	return c.sandboxFrom(sandboxJSON{SandboxID: info.SandboxID, TemplateID: info.TemplateID, ClientID: info.ClientID,
		EnvdVersion: info.EnvdVersion, EnvdAccessToken: info.EnvdAccessToken, Domain: info.Domain}), nil
}

// Resume is Connect for a paused sandbox (the e2b SDKs resume by connecting).
func (c *Client) Resume(ctx context.Context, sandboxID string, timeout time.Duration) (*Sandbox, error) {
	return c.Connect(ctx, sandboxID, timeout)
}

// Get reports one sandbox.
func (c *Client) Get(ctx context.Context, sandboxID string) (*SandboxInfo, error) {
	var info SandboxInfo
	if _, err := c.do(ctx, request{method: http.MethodGet, path: "/sandboxes/" + seg(sandboxID), out: &info, res: resSandbox}); err != nil {
		return nil, err
	}
	return &info, nil
}

// Kill ends a sandbox. It reports false (and no error) when there was no
// such sandbox, as the e2b SDKs do.
func (c *Client) Kill(ctx context.Context, sandboxID string) (bool, error) {
	_, err := c.do(ctx, request{method: http.MethodDelete, path: "/sandboxes/" + seg(sandboxID), res: resSandbox})
	return existed(err)
}

// existed is a delete's answer: true when it removed something, false
// (and no error) on a 404.
func existed(err error) (bool, error) {
	if isStatus(err, http.StatusNotFound) {
		return false, nil
	}
	return err == nil, err
}

// SetTimeout sets the sandbox's expiry to now+timeout (it may shorten it).
func (c *Client) SetTimeout(ctx context.Context, sandboxID string, timeout time.Duration) error {
	if timeout <= 0 {
		return fmt.Errorf("%w: timeout must be positive", ErrInvalidArgument)
	}
	_, err := c.do(ctx, request{method: http.MethodPost, path: "/sandboxes/" + seg(sandboxID) + "/timeout",
		body: map[string]any{"timeout": int64((timeout + time.Second - 1) / time.Second)}, res: resSandbox})
	return err
}

// Pause pauses a sandbox; false (no error) when it was already paused.
// GPU sandboxes cannot be paused: that is an ErrConflict with a message
// saying so, told apart from "already paused" by a Get.
func (c *Client) Pause(ctx context.Context, sandboxID string) (bool, error) {
	_, err := c.do(ctx, request{method: http.MethodPost, path: "/sandboxes/" + seg(sandboxID) + "/pause", body: map[string]any{}, res: resSandbox})
	if err == nil {
		return true, nil
	}
	if isStatus(err, http.StatusConflict) {
		if info, gerr := c.Get(ctx, sandboxID); gerr == nil && info.State == "paused" {
			return false, nil
		}
	}
	return false, err
}

// UpdateNetwork replaces a running sandbox's egress configuration
// (PUT /sandboxes/{id}/network). It applies at once: established
// connections the new policy drops stop passing packets. Fields of n left zero are cleared (see NetworkUpdate);
// a refused option is an ErrInvalidArgument naming it.
func (c *Client) UpdateNetwork(ctx context.Context, sandboxID string, n NetworkUpdate) error {
	n.DNSServers = dnsWire(n.DNSServers)
	_, err := c.do(ctx, request{method: http.MethodPut, path: "/sandboxes/" + seg(sandboxID) + "/network", body: n, res: resSandbox})
	return err
}

func isStatus(err error, status int) bool {
	var e *APIError
	return errors.As(err, &e) && e.status() == status
}

// ListOptions filters List. Zero values mean "any".
type ListOptions struct {
	// States is any of "running", "paused" (default both).
	States   []string
	Metadata map[string]string
	Template string
	// Limit is the page size (1..100, default 100).
	Limit int
}

// SandboxPager walks List's pages; the server's X-Next-Token is the cursor.
type SandboxPager struct {
	c     *Client
	q     url.Values
	next  string
	done  bool
	total int
}

// List returns a pager over the sandboxes matching o. No request is made
// until NextPage or All.
func (c *Client) List(o ListOptions) *SandboxPager {
	q := url.Values{}
	if len(o.States) > 0 {
		q.Set("state", strings.Join(o.States, ","))
	}
	if len(o.Metadata) > 0 {
		mq := url.Values{}
		for k, v := range o.Metadata {
			mq.Set(url.QueryEscape(k), url.QueryEscape(v))
		}
		// e2b encodes each pair, then the whole string (see the protocol notes).
		q.Set("metadata", mq.Encode())
	}
	if o.Template != "" {
		q.Set("template", o.Template)
	}
	if o.Limit > 0 {
		q.Set("limit", strconv.Itoa(o.Limit))
	}
	return &SandboxPager{c: c, q: q}
}

// HasNext reports whether NextPage may return more.
func (p *SandboxPager) HasNext() bool { return !p.done }

// TotalRunning is the server's X-Total-Running from the last page.
func (p *SandboxPager) TotalRunning() int { return p.total }

// NextPage fetches the next page (empty and HasNext false at the end).
func (p *SandboxPager) NextPage(ctx context.Context) ([]SandboxInfo, error) {
	if p.done {
		return nil, nil
	}
	q := url.Values{}
	for k, v := range p.q {
		q[k] = v
	}
	if p.next != "" {
		q.Set("nextToken", p.next)
	}
	var page []SandboxInfo
	resp, err := p.c.do(ctx, request{method: http.MethodGet, path: "/v2/sandboxes", query: q, out: &page})
	if err != nil {
		return nil, err
	}
	p.next = resp.header.Get("X-Next-Token")
	p.total, _ = strconv.Atoi(resp.header.Get("X-Total-Running"))
	if p.next == "" || len(page) == 0 {
		p.done = true
	}
	return page, nil
}

// All iterates every sandbox across pages; iteration stops at the first
// error, which is yielded.
func (p *SandboxPager) All(ctx context.Context) iter.Seq2[SandboxInfo, error] {
	return func(yield func(SandboxInfo, error) bool) {
		for p.HasNext() {
			page, err := p.NextPage(ctx)
			if err != nil {
				yield(SandboxInfo{}, err)
				return
			}
			for _, s := range page {
				if !yield(s, nil) {
					return
				}
			}
		}
	}
}

// Kill ends the sandbox (false when it was already gone).
func (s *Sandbox) Kill(ctx context.Context) (bool, error) { return s.c.Kill(ctx, s.ID) }

// SetTimeout sets the sandbox's expiry to now+timeout.
func (s *Sandbox) SetTimeout(ctx context.Context, timeout time.Duration) error {
	return s.c.SetTimeout(ctx, s.ID, timeout)
}

// Pause pauses the sandbox (false when already paused). Resume with
// Client.Connect.
func (s *Sandbox) Pause(ctx context.Context) (bool, error) { return s.c.Pause(ctx, s.ID) }

// UpdateNetwork replaces the sandbox's egress configuration; fields of n
// left zero are cleared (see Client.UpdateNetwork).
func (s *Sandbox) UpdateNetwork(ctx context.Context, n NetworkUpdate) error {
	return s.c.UpdateNetwork(ctx, s.ID, n)
}

// Info reports the sandbox.
func (s *Sandbox) Info(ctx context.Context) (*SandboxInfo, error) { return s.c.Get(ctx, s.ID) }

// IsRunning asks the sandbox's agent for its health.
func (s *Sandbox) IsRunning(ctx context.Context) (bool, error) { return s.envd.health(ctx) }

// domain is the sandbox's domain, the config's, or "" for header routing.
func (s *Sandbox) domain() string {
	if s.Domain != "" {
		return s.Domain
	}
	return s.c.cfg.Domain
}

// GetHost returns <port>-<id>.<domain>, the host serving port inside the
// sandbox (put https:// or http:// in front). Without a domain it is
// <port>-<id>.localhost:<API port>: Cubicle's proxy routes any Host of that
// shape; use PortURL and PortClient where such names do not resolve.
func (s *Sandbox) GetHost(port int) string {
	if d := s.domain(); d != "" {
		return fmt.Sprintf("%d-%s.%s", port, s.ID, d)
	}
	host := "localhost"
	if p := s.c.api.Port(); p != "" {
		host += ":" + p
	}
	return fmt.Sprintf("%d-%s.%s", port, s.ID, host)
}

// PortURL is a base URL that reaches port inside the sandbox when used with
// PortClient (which adds the routing headers).
func (s *Sandbox) PortURL(port int) string {
	base, host := s.c.envdBase(s)
	if host == "" && s.c.cfg.SandboxURL == "" && s.domain() != "" {
		return "https://" + s.GetHost(port)
	}
	return base
}

// PortClient is an *http.Client whose requests reach port inside the
// sandbox through Cubicle's proxy (E2b-Sandbox-Id/-Port headers, the
// traffic token when the sandbox has one).
func (s *Sandbox) PortClient(port int) *http.Client {
	return &http.Client{Transport: &routeTransport{base: s.c.http.Transport, sb: s, port: port}}
}

// routeTransport adds the sandbox routing headers.
type routeTransport struct {
	base http.RoundTripper
	sb   *Sandbox
	port int
	// token adds X-Access-Token (envd calls only).
	token bool
}

// RoundTrip implements http.RoundTripper.
func (t *routeTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("E2b-Sandbox-Id", t.sb.ID)
	r.Header.Set("E2b-Sandbox-Port", strconv.Itoa(t.port))
	if _, host := t.sb.c.envdBase(t.sb); host != "" {
		r.Host = strings.Replace(host, strconv.Itoa(envdPort)+"-", strconv.Itoa(t.port)+"-", 1)
	}
	if t.token && t.sb.AccessToken != "" {
		r.Header.Set("X-Access-Token", t.sb.AccessToken)
	}
	if !t.token && t.sb.TrafficAccessToken != "" {
		r.Header.Set("E2b-Traffic-Access-Token", t.sb.TrafficAccessToken)
	}
	if r.Header.Get("User-Agent") == "" {
		r.Header.Set("User-Agent", t.sb.c.ua)
	}
	base := t.base
	if base == nil {
		base = http.DefaultTransport
	}
	return base.RoundTrip(r)
}

// envdBase is the base URL for the sandbox's agent and, with a proxy node,
// the Host header to send.
func (c *Client) envdBase(s *Sandbox) (base, host string) {
	switch {
	case c.cfg.SandboxURL != "":
		return c.cfg.SandboxURL, ""
	case c.cfg.ProxyNodeIP != "":
		d := s.domain()
		if d == "" {
			d = "cube.app"
		}
		return fmt.Sprintf("%s://%s:%d", c.cfg.ProxyScheme, c.cfg.ProxyNodeIP, c.cfg.ProxyPort), fmt.Sprintf("%d-%s.%s", envdPort, s.ID, d)
	case s.domain() != "":
		return fmt.Sprintf("https://%d-%s.%s", envdPort, s.ID, s.domain()), ""
	}
	return c.api.String(), ""
}
