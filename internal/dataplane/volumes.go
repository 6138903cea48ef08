package dataplane

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"strings"
	"sync"
	"time"

	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/node"
	"github.com/cubicle-dev/cubicle/internal/volume/content"
)

// VolumeDirs is what a node's volume-content target needs: node.Local's
// ContentDir, the directory of a volume the node holds attached for the
// volume-content API, from the node's own durable reference.
type VolumeDirs interface {
	// ContentDir: node.ErrVolumeNotAttached when the node holds no
	// such attachment.
	ContentDir(ctx context.Context, volumeID string) (string, error)
}

var _ VolumeDirs = (*node.Local)(nil)

// volumeIdle is how long the node keeps an idle volume-content tunnel;
// the control plane's pool drops its side first (volumeClientIdle).
const (
	volumeIdle       = 90 * time.Second
	volumeClientIdle = 60 * time.Second
)

// nodeResolver is the node's side of content.Resolver. The token is not
// looked at: only the control plane reaches this server (mTLS), and it
// checked the volume's token and attached the volume here first.
type nodeResolver struct{ dirs VolumeDirs }

func (r nodeResolver) Open(ctx context.Context, volumeID, _ string) (string, func(), error) {
	dir, err := r.dirs.ContentDir(ctx, volumeID)
	if errors.Is(err, node.ErrVolumeNotAttached) {
		return "", nil, fmt.Errorf("%w: %v", content.ErrConflict, err)
	}
	return dir, nil, err
}

func volumeHandler(dirs VolumeDirs, log *slog.Logger) http.Handler {
	return content.NewHandler(nodeResolver{dirs}, log)
}

// connListener hands accepted tunnels to an http.Server.
type connListener struct {
	ch     chan net.Conn
	closed chan struct{}
	once   sync.Once
}

func newConnListener() *connListener {
	return &connListener{ch: make(chan net.Conn), closed: make(chan struct{})}
}

// hand gives c to the server; false (and c closed) once the listener is closed.
func (l *connListener) hand(c net.Conn) bool {
	select {
	case l.ch <- c:
		return true
	case <-l.closed:
		c.Close()
		return false
	}
}

func (l *connListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.ch:
		return c, nil
	case <-l.closed:
		return nil, net.ErrClosed
	}
}

func (l *connListener) Close() error {
	l.once.Do(func() { close(l.closed) })
	return nil
}

func (l *connListener) Addr() net.Addr { return volumesAddr{} }

type volumesAddr struct{}

func (volumesAddr) Network() string { return "dataplane" }
func (volumesAddr) String() string  { return volumesTarget }

// servedConn reports when the HTTP server has closed it.
type servedConn struct {
	net.Conn
	once sync.Once
	done chan struct{}
}

func (c *servedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { close(c.done) })
	return err
}

// volumeDomain ends the pool host of a node's volume-content server.
const volumeDomain = ".volumes.cubicle.invalid"

// VolumeProxy is the control plane's side of the volume-content target:
// it passes a volume-content request, bodies streamed both ways, to the
// node that holds the volume attached, through that node's data plane.
// Connections are pooled per node. Safe for concurrent use.
type VolumeProxy struct {
	tr *http.Transport
}

// NewVolumeProxy makes a proxy that opens tunnels with c; dataAddress
// gives a node's data-plane host:port (the registry's DataAddress).
func NewVolumeProxy(c *Client, dataAddress func(ctx context.Context, nodeID string) (string, error)) *VolumeProxy {
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, addr string) (net.Conn, error) {
			host, _, err := net.SplitHostPort(addr)
			nodeID, ok := strings.CutSuffix(host, volumeDomain)
			if err != nil || !ok || nodeID == "" {
				return nil, fmt.Errorf("%w: %q is not a node's volume server", ErrBadTarget, addr)
			}
			da, err := dataAddress(ctx, nodeID)
			if err == nil && da == "" {
				err = errors.New("the node has not reported a data-plane address")
			}
			if err != nil {
				return nil, &NodeError{Node: nodeID, Err: err}
			}
			return c.DialVolumes(ctx, nodeID, da)
		},
		MaxIdleConnsPerHost: 16,
		IdleConnTimeout:     volumeClientIdle,
		// Bodies are passed as they are: no transparent gzip.
		DisableCompression: true,
	}
	return &VolumeProxy{tr: tr}
}

// Handler passes requests to node nodeID's volume-content server. The
// volume token is not sent on: the node does not need it.
func (p *VolumeProxy) Handler(nodeID string) http.Handler {
	host := nodeID + volumeDomain
	return &httputil.ReverseProxy{
		Transport: p.tr,
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme, pr.Out.URL.Host, pr.Out.Host = "http", host, host
			pr.Out.Header.Del("Authorization")
		},
		// Bodies stream through in ReverseProxy's 32 KiB pieces, never
		// whole; a response of unknown length is flushed as it comes.
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			status := http.StatusBadGateway
			if errors.Is(err, errdefs.ErrUnavailable) || errors.Is(err, ErrBusy) {
				status = http.StatusServiceUnavailable
			}
			content.WriteError(w, status, "volume file access through node %s: %v", nodeID, err)
		},
	}
}

// Close drops the pooled connections.
func (p *VolumeProxy) Close() { p.tr.CloseIdleConnections() }
