// Package nodeclient holds the calls a node agent makes to the control
// plane (register, heartbeat, certificate renewal, secret resolution): their
// paths and JSON bodies, shared by the control plane's handlers
// (internal/api) and the node's Client. Every call is authenticated by the
// node's mTLS certificate; the control plane reads the node ID from it,
// never from a body.
package nodeclient

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/cubicle-dev/cubicle/internal/accel"
	"github.com/cubicle-dev/cubicle/internal/clusterpki"
	"github.com/cubicle-dev/cubicle/internal/store"
)

// Paths of the node calls on the control plane's API.
const (
	RegisterPath  = "/nodes/register"
	HeartbeatPath = "/nodes/heartbeat"
	RenewPath     = "/nodes/renew"
	SecretPath    = "/nodes/secret"
)

// Status is POST /nodes/register's and /nodes/heartbeat's body: what the
// node reports about itself. Labels are not in it: they are the join
// token's, kept by the control plane, so a node cannot give itself a label
// (builder, a GPU class) it was not joined with.
type Status struct {
	Address       string         `json:"address"`     // gRPC host:port
	DataAddress   string         `json:"dataAddress"` // data plane host:port
	Capacity      store.Capacity `json:"capacity"`
	Runtime       string         `json:"runtime"`
	Version       string         `json:"version"`
	VolumeDrivers []string       `json:"volumeDrivers"`
	Accelerators  []accel.Device `json:"accelerators"`
	Templates     []string       `json:"templates"` // cached image refs
}

// Bounds of a node's reported capacity: far past any machine (4 million
// CPUs, 1 EiB), and small enough that the scheduler's arithmetic on them
// cannot overflow.
const (
	MaxMilliCPU    = 1 << 32
	MaxCapacityMiB = 1 << 40
)

// ErrInvalidStatus: a register or heartbeat body the control plane refuses.
var ErrInvalidStatus = errors.New("invalid node status")

// Validate checks what the control plane stores and dials.
func (s *Status) Validate() error {
	for _, a := range []struct{ field, v string }{{"address", s.Address}, {"dataAddress", s.DataAddress}} {
		if err := validHostPort(a.v); err != nil {
			return fmt.Errorf("%w: %s %q: %v", ErrInvalidStatus, a.field, a.v, err)
		}
	}
	if s.Capacity.MilliCPU < 0 || s.Capacity.MemoryMiB < 0 || s.Capacity.DiskMiB < 0 {
		return fmt.Errorf("%w: capacity must not be negative", ErrInvalidStatus)
	}
	// The scheduler multiplies capacity (CPU overcommit up to 100x) and
	// sums it with reservations: a reported value far past any machine
	// must not wrap around.
	if s.Capacity.MilliCPU > MaxMilliCPU || s.Capacity.MemoryMiB > MaxCapacityMiB || s.Capacity.DiskMiB > MaxCapacityMiB {
		return fmt.Errorf("%w: capacity %+v is past the bounds (%d milliCPU, %d MiB)", ErrInvalidStatus, s.Capacity, int64(MaxMilliCPU), int64(MaxCapacityMiB))
	}
	if s.Runtime == "" {
		return fmt.Errorf("%w: runtime is required", ErrInvalidStatus)
	}
	for _, l := range []struct {
		field string
		v     []string
	}{{"volumeDrivers", s.VolumeDrivers}, {"templates", s.Templates}} {
		if len(l.v) > 1024 {
			return fmt.Errorf("%w: %s: at most 1024 entries", ErrInvalidStatus, l.field)
		}
		for _, v := range l.v {
			if v == "" || len(v) > 512 {
				return fmt.Errorf("%w: %s: entries must be 1-512 bytes", ErrInvalidStatus, l.field)
			}
		}
	}
	for _, d := range s.Accelerators {
		if d.ID == "" {
			return fmt.Errorf("%w: accelerators: a device has no id", ErrInvalidStatus)
		}
	}
	return nil
}

func validHostPort(v string) error {
	host, port, err := net.SplitHostPort(v)
	if err != nil {
		return err
	}
	if host == "" {
		return errors.New("no host")
	}
	if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
		return errors.New("port must be 1-65535")
	}
	return nil
}

// RenewRequest is POST /nodes/renew's body: a CSR for a new key made on
// the node. The new certificate keeps the node ID and addresses of the one
// the call was made with.
type RenewRequest struct {
	CSR string `json:"csr"`
}

// RenewResponse is the renewed certificate (PEM).
type RenewResponse struct {
	Certificate string `json:"certificate"`
}

// SecretRequest is POST /nodes/secret's body: the egress proxy of the node
// needs secret Name to fill a rule of sandbox SandboxID.
type SecretRequest struct {
	SandboxID string `json:"sandboxID"`
	Name      string `json:"name"`
}

// SecretResponse is the secret's value.
type SecretResponse struct {
	Value string `json:"value"`
}

// Error is the control plane's e2b-shaped error answer.
type Error struct {
	Status  int
	Message string
}

func (e *Error) Error() string {
	return fmt.Sprintf("control plane answered %d: %s", e.Status, e.Message)
}

// ErrNotRegistered: a heartbeat for a node the control plane has no row
// for (forgotten, or a fresh store); the node registers again.
var ErrNotRegistered = errors.New("node not registered")

// Client makes the node calls over mTLS with the node's certificate.
type Client struct {
	base string
	http *http.Client
	tls  *tls.Config
}

// TLSConfig is the configuration the client reaches the control plane
// with (the node's certificate, the control plane's identity checked), for
// the node's other calls to it: image pulls from its registry.
func (c *Client) TLSConfig() *tls.Config { return c.tls.Clone() }

// NewClient calls the control plane at controlPlane (the https URL from
// node.json). cert returns the node's current certificate at each
// handshake, so a renewed one is used without a new Client. The server must
// present a control-plane certificate from ca.
func NewClient(controlPlane string, ca *x509.Certificate, cert func() (*tls.Certificate, error)) (*Client, error) {
	u, err := url.Parse(controlPlane)
	if err != nil || u.Scheme != "https" || u.Host == "" {
		return nil, fmt.Errorf("control plane URL %q: want https://host[:port]", controlPlane)
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca)
	conf := &tls.Config{
		MinVersion: tls.VersionTLS13,
		ServerName: clusterpki.JoinServerName,
		RootCAs:    roots,
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			return cert()
		},
		// The server name is a fixed label, not the host dialled: the
		// identity checked is the control plane's URI SAN, from ca.
		InsecureSkipVerify: true,
		VerifyConnection: func(cs tls.ConnectionState) error {
			return clusterpki.VerifyControlPlane(cs.PeerCertificates, ca)
		},
	}
	return &Client{
		tls:  conf,
		base: strings.TrimSuffix(u.String(), "/"),
		http: &http.Client{
			Timeout: 30 * time.Second,
			Transport: &http.Transport{TLSClientConfig: conf, ForceAttemptHTTP2: true, IdleConnTimeout: time.Minute,
				// A renewed certificate is presented on the next handshake.
				MaxIdleConnsPerHost: 2},
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		},
	}, nil
}

// CloseIdleConnections drops pooled connections, so the next call
// handshakes again (after a renewal).
func (c *Client) CloseIdleConnections() { c.http.CloseIdleConnections() }

// Register records the node in the control plane's registry.
func (c *Client) Register(ctx context.Context, s Status) error {
	return c.call(ctx, RegisterPath, s, nil)
}

// Heartbeat renews the node's lease; ErrNotRegistered when the control
// plane has no row for it.
func (c *Client) Heartbeat(ctx context.Context, s Status) error {
	err := c.call(ctx, HeartbeatPath, s, nil)
	var e *Error
	if errors.As(err, &e) && e.Status == http.StatusNotFound {
		return fmt.Errorf("%w: %w", ErrNotRegistered, err)
	}
	return err
}

// Renew sends a CSR and returns the new certificate (PEM).
func (c *Client) Renew(ctx context.Context, csrPEM []byte) ([]byte, error) {
	var out RenewResponse
	if err := c.call(ctx, RenewPath, RenewRequest{CSR: string(csrPEM)}, &out); err != nil {
		return nil, err
	}
	return []byte(out.Certificate), nil
}

// Secret resolves secret name for a rule of sandbox sandboxID.
func (c *Client) Secret(ctx context.Context, sandboxID, name string) (string, error) {
	var out SecretResponse
	if err := c.call(ctx, SecretPath, SecretRequest{SandboxID: sandboxID, Name: name}, &out); err != nil {
		return "", err
	}
	return out.Value, nil
}

func (c *Client) call(ctx context.Context, path string, in, out any) error {
	body, err := json.Marshal(in)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.base+path, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		var e struct {
			Message string `json:"message"`
		}
		if json.Unmarshal(raw, &e) != nil || e.Message == "" {
			e.Message = strings.TrimSpace(string(raw))
		}
		return &Error{Status: resp.StatusCode, Message: e.Message}
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(raw, out); err != nil {
		return fmt.Errorf("control plane's answer to %s: %w", path, err)
	}
	return nil
}
