package dataplane

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/cubicle-dev/cubicle/internal/clusterpki"
)

// Client is the control plane's side: it opens tunnels to nodes. It is
// safe for concurrent use.
type Client struct {
	cert tls.Certificate
	// getCert, when set, gives the certificate at each handshake (the
	// control plane's is reissued while it runs).
	getCert func() (*tls.Certificate, error)
	ca      *x509.Certificate
	// revs refuses a node whose certificate is revoked (RefuseRevoked).
	revs   clusterpki.Revocations
	dialer net.Dialer
	// sessions lets a new tunnel resume the TLS session of an earlier one
	// to the same node, skipping the certificate signatures. Resumption
	// still runs VerifyConnection on both sides, so identities are checked
	// as in a full handshake.
	sessions tls.ClientSessionCache
}

// NewClientFunc is NewClient with the certificate read from get at each
// handshake, so a reissued certificate is used without a new client.
func NewClientFunc(get func() (*tls.Certificate, error), ca *x509.Certificate, revs clusterpki.Revocations) (*Client, error) {
	if get == nil || ca == nil || revs == nil {
		return nil, errors.New("dataplane: a client needs the control plane's certificate, the cluster CA and the nodes' revocations")
	}
	return &Client{getCert: get, ca: ca, revs: revs, dialer: net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second},
		sessions: tls.NewLRUClientSessionCache(1024)}, nil
}

// NewClient makes a client presenting cert (the control plane's
// certificate) and trusting nodes certified by ca whose certificates revs
// does not revoke (pass a clusterpki.RevocationCache over the store).
func NewClient(cert tls.Certificate, ca *x509.Certificate, revs clusterpki.Revocations) (*Client, error) {
	if len(cert.Certificate) == 0 || ca == nil || revs == nil {
		return nil, errors.New("dataplane: a client needs the control plane's certificate, the cluster CA and the nodes' revocations")
	}
	return &Client{cert: cert, ca: ca, revs: revs, dialer: net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second},
		sessions: tls.NewLRUClientSessionCache(1024)}, nil
}

// Dial opens a tunnel to port of sandbox sandboxID on node nodeID, whose
// data plane listens at dataAddr (host:port). The server must prove it is
// exactly nodeID (clusterpki.ControlPlaneClientConfig), whatever answers at
// dataAddr. A refused tunnel is a *TunnelError, a node that could not be
// reached (or proved another identity) a *NodeError. ctx bounds the dial and
// the CONNECT exchange, not the returned connection.
//
// The connection supports CloseWrite (a TLS close_notify, which the node
// passes on to the sandbox as a FIN).
func (c *Client) Dial(ctx context.Context, nodeID, dataAddr, sandboxID string, port int) (net.Conn, error) {
	if !validID(sandboxID) || port < 1 || port > 65535 {
		return nil, fmt.Errorf("%w: sandbox %q port %d", ErrBadTarget, sandboxID, port)
	}
	return c.open(ctx, nodeID, dataAddr, target(sandboxID, port))
}

// DialVolumes opens a connection to node nodeID's volume-content server
// (ServerConfig.Volumes): after it, the connection speaks HTTP/1.1 to the
// node's internal/volume/content handler, which serves only the volumes
// the node holds attached for the volume-content API. Errors as Dial's.
func (c *Client) DialVolumes(ctx context.Context, nodeID, dataAddr string) (net.Conn, error) {
	return c.open(ctx, nodeID, dataAddr, volumesTarget)
}

// DialBuilder opens a tunnel to the template builder (buildkitd's gRPC
// socket) of node nodeID, as Dial does to a sandbox. A node that runs no
// builder refuses with a *TunnelError matching ErrNotBuilder.
func (c *Client) DialBuilder(ctx context.Context, nodeID, dataAddr string) (net.Conn, error) {
	return c.open(ctx, nodeID, dataAddr, BuilderTarget)
}

// open dials the node, proves both identities and asks for target.
func (c *Client) open(ctx context.Context, nodeID, dataAddr, t string) (net.Conn, error) {
	raw, err := c.dialer.DialContext(ctx, "tcp", dataAddr)
	if err != nil {
		return nil, &NodeError{Node: nodeID, Addr: dataAddr, Err: err}
	}
	cfg := clusterpki.ControlPlaneClientConfig(c.cert, c.ca, nodeID)
	clusterpki.RefuseRevoked(cfg, nodeID, c.revs)
	if get := c.getCert; get != nil {
		cfg.Certificates = nil
		cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return get() }
	}
	cfg.ClientSessionCache = c.sessions
	// The session cache is keyed by ServerName: the node's identity, not
	// the address that answered. No host name is checked (the config
	// verifies the node's URI instead).
	cfg.ServerName = nodeID + ".node.cubicle.invalid"
	tc := tls.Client(raw, cfg)
	// One deadline for handshake and exchange, lifted on success; a
	// cancelled ctx ends a stalled exchange at once.
	if dl, ok := ctx.Deadline(); ok {
		raw.SetDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { raw.SetDeadline(time.Unix(1, 0)) })
	conn, err := c.connect(ctx, tc, nodeID, t)
	if err != nil && !errors.As(err, new(*TunnelError)) {
		err = &NodeError{Node: nodeID, Addr: dataAddr, Err: err}
	}
	if stopped := stop(); err == nil && !stopped {
		err = ctx.Err() // cancelled just as the exchange ended: the deadline is spoilt
	}
	if err != nil {
		raw.Close()
		if cerr := ctx.Err(); cerr != nil && !errors.Is(err, cerr) {
			err = fmt.Errorf("%w: %w", cerr, err)
		}
		return nil, err
	}
	raw.SetDeadline(time.Time{})
	return conn, nil
}

// connect runs the handshake and the CONNECT exchange; a refusal is a
// *TunnelError, anything else the node's failure.
func (c *Client) connect(ctx context.Context, tc *tls.Conn, nodeID, t string) (net.Conn, error) {
	if err := tc.HandshakeContext(ctx); err != nil {
		return nil, fmt.Errorf("TLS: %w", err)
	}
	host := t
	if t == volumesTarget {
		host = "volumes"
	}
	if _, err := io.WriteString(tc, "CONNECT "+t+" HTTP/1.1\r\nHost: "+host+"\r\n\r\n"); err != nil {
		return nil, err
	}
	// A node is not trusted with the control plane's memory: its answer
	// is read through a limit (bufConn reads the connection itself once
	// br is empty).
	br := bufio.NewReader(io.LimitReader(tc, maxHeader))
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	if err != nil {
		return nil, fmt.Errorf("reading the tunnel's answer: %w", err)
	}
	if resp.StatusCode == http.StatusOK {
		return &bufConn{Conn: tc, r: br}, nil
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body) // within maxHeader with the headers
	te := &TunnelError{Node: nodeID, Status: resp.StatusCode}
	var body errorBody
	if json.Unmarshal(b, &body) == nil {
		te.Reason, te.Message = body.Reason, body.Message
	} else {
		te.Message = string(b)
	}
	return nil, te
}
