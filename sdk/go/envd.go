package cubicle

import (
	"context"
	"encoding/base64"
	"net/http"
	"time"

	"connectrpc.com/connect"

	"github.com/cubicle-dev/cubicle/sdk/go/envd/filesystem/filesystemconnect"
	"github.com/cubicle-dev/cubicle/sdk/go/envd/process/processconnect"
)

// keepaliveSeconds is what the e2b SDKs ask envd for on streams.
const keepaliveSeconds = "50"

// envdConn is one sandbox's agent: Connect-RPC clients (JSON codec, as the
// e2b SDKs use) and an HTTP client for the /files routes.
type envdConn struct {
	sb   *Sandbox
	base string
	http *http.Client
	proc processconnect.ProcessClient
	fs   filesystemconnect.FilesystemClient
}

func (c *Client) newEnvd(sb *Sandbox) *envdConn {
	base, _ := c.envdBase(sb)
	hc := &http.Client{Transport: &routeTransport{base: c.http.Transport, sb: sb, port: envdPort, token: true}}
	e := &envdConn{sb: sb, base: base, http: hc}
	e.proc = processconnect.NewProcessClient(hc, base, connect.WithProtoJSON())
	e.fs = filesystemconnect.NewFilesystemClient(hc, base, connect.WithProtoJSON())
	return e
}

// userHeader selects the Linux user for an RPC ("" = the sandbox default).
func userHeader(h http.Header, user string) {
	if user != "" {
		h.Set("Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte(user+":")))
	}
}

// unary applies the request timeout to a unary RPC's context.
func (e *envdConn) unaryCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	if t := e.sb.c.cfg.RequestTimeout; t > 0 {
		return context.WithTimeout(ctx, t)
	}
	return ctx, func() {}
}

func (e *envdConn) health(ctx context.Context) (bool, error) {
	ctx, cancel := e.unaryCtx(ctx)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, e.base+"/health", nil)
	if err != nil {
		return false, err
	}
	resp, err := e.http.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return false, ctx.Err()
		}
		return false, err
	}
	resp.Body.Close()
	switch {
	case resp.StatusCode/100 == 2:
		return true, nil
	case resp.StatusCode == http.StatusBadGateway || resp.StatusCode == http.StatusNotFound:
		return false, nil
	}
	return false, apiErrorFrom(resp, http.MethodGet, "/health", resSandbox)
}

// streamTimeout is the Connect-Timeout for streams: the caller's ctx
// deadline wins; a zero timeout means none.
func streamCtx(ctx context.Context, timeout time.Duration) (context.Context, context.CancelFunc) {
	if timeout > 0 {
		return context.WithTimeout(ctx, timeout)
	}
	return context.WithCancel(ctx)
}
