package proxy

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"

	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/store"
)

// NodeRoutes reaches sandboxes held by nodes other than the in-process
// one. Their addresses are on their own node's bridge, which this machine
// cannot route to, so the proxy opens a data-plane tunnel to the node
// instead (internal/dataplane), one per pooled upstream connection.
type NodeRoutes struct {
	// Local is the in-process node's ID, "" for a control plane without
	// one. Its sandboxes are dialled directly, as in embedded mode.
	Local string
	// DataAddress returns a node's data-plane host:port (the registry's
	// store.Node.DataAddress).
	DataAddress func(ctx context.Context, nodeID string) (string, error)
	// Dialer opens tunnels (a *dataplane.Client).
	Dialer Dialer
}

// Dialer opens a connection to port of a sandbox through its node's data
// plane. A node that cannot be reached must match errdefs.ErrUnavailable
// (whatever its cause: a refused dial to the node says nothing of the
// sandbox's port); a port the sandbox refused syscall.ECONNREFUSED (it is
// reported as a closed port); a sandbox the node does not hold
// errdefs.ErrNotFound; a node at its tunnel limit
// errdefs.ErrResourceExhausted.
type Dialer interface {
	Dial(ctx context.Context, nodeID, dataAddr, sandboxID string, port int) (net.Conn, error)
}

// remoteDomain ends the pool hosts of sandboxes on other nodes.
const remoteDomain = ".node.cubicle.invalid"

// remote reports whether sb is held by another node and must be reached
// through the data plane.
func (p *Proxy) remote(nodeID string) bool {
	return p.cfg.Nodes != nil && nodeID != p.cfg.Nodes.Local
}

// remoteHost is the pool host of a sandbox on node nodeID: like
// node.SandboxHost it names the sandbox and its address, so a sandbox gets
// its own keep-alive pool, and one that moved (resumed elsewhere, given
// another address) does not inherit its old connections.
func remoteHost(nodeID, id string, addr netip.AddrPort) string {
	return id + "." + hex.EncodeToString(addr.Addr().AsSlice()) + "." + nodeID + remoteDomain + ":" + strconv.Itoa(int(addr.Port()))
}

// parseRemoteHost decodes a remoteHost host:port.
func parseRemoteHost(hostport string) (nodeID, id string, port int, ok bool) {
	host, ps, err := net.SplitHostPort(hostport)
	if err != nil {
		return "", "", 0, false
	}
	rest, ok := strings.CutSuffix(host, remoteDomain)
	if !ok {
		return "", "", 0, false
	}
	parts := strings.Split(rest, ".")
	if len(parts) != 3 {
		return "", "", 0, false
	}
	port, err = strconv.Atoi(ps)
	if err != nil {
		return "", "", 0, false
	}
	return parts[2], parts[0], port, true
}

// dial is the transports' DialContext: tunnels for remoteHost hosts,
// node.DialSandbox (a direct dial) for the rest.
func (p *Proxy) dial(direct func(ctx context.Context, network, addr string) (net.Conn, error)) func(ctx context.Context, network, addr string) (net.Conn, error) {
	if p.cfg.Nodes == nil {
		return direct
	}
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		nodeID, id, port, ok := parseRemoteHost(addr)
		if !ok {
			return direct(ctx, network, addr)
		}
		dataAddr, err := p.cfg.Nodes.DataAddress(ctx, nodeID)
		if err == nil && dataAddr == "" {
			err = errors.New("the node has not reported a data-plane address")
		}
		if err != nil {
			return nil, &nodeError{node: nodeID, err: err}
		}
		return p.cfg.Nodes.Dialer.Dial(ctx, nodeID, dataAddr, id, port)
	}
}

// nodeError: the node holding a sandbox could not be looked up.
type nodeError struct {
	node string
	err  error
}

func (e *nodeError) Error() string {
	return fmt.Sprintf("looking up node %s's data address: %v", e.node, e.err)
}
func (e *nodeError) Unwrap() error { return e.err }

// remoteUnreachable answers the failures particular to the data plane and
// reports whether it did: the node is unknown to the registry or cannot be
// reached, or does not hold the sandbox (it is gone there, or the row is
// stale), all of which the SDKs read as "not running"; or the node is at
// its tunnel limit, a condition that passes.
func remoteUnreachable(w http.ResponseWriter, sb *store.Sandbox, err error) bool {
	var ne *nodeError
	switch {
	case errors.As(err, &ne):
		writeSandboxError(w, sandboxError{Code: http.StatusBadGateway, SandboxID: sb.ID,
			Message: "The sandbox's node " + ne.node + " is not reachable: " + ne.err.Error()})
	case errors.Is(err, errdefs.ErrUnavailable):
		writeSandboxError(w, sandboxError{Code: http.StatusBadGateway, SandboxID: sb.ID,
			Message: "The sandbox's node " + sb.Node + " is not reachable: " + err.Error()})
	case errors.Is(err, errdefs.ErrNotFound):
		writeSandboxError(w, sandboxError{Code: http.StatusBadGateway, SandboxID: sb.ID,
			Message: "The sandbox was not found on its node " + sb.Node})
	case errors.Is(err, errdefs.ErrResourceExhausted):
		w.Header().Set("Retry-After", "1")
		writeSandboxError(w, sandboxError{Code: http.StatusServiceUnavailable, SandboxID: sb.ID,
			Message: "the sandbox's node " + sb.Node + " has too many connections open; retry"})
	default:
		return false
	}
	return true
}
