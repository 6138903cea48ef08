// Package dataplane carries the control plane's sandbox traffic to the
// node that holds the sandbox. Sandboxes live on their node's bridge, which
// no other machine can route to, so the node runs a Server on its data
// address and the control plane opens one tunnel per upstream connection
// with a Client.
//
// A tunnel is an HTTP/1.1 CONNECT over mutual TLS (the node's certificate
// on the server, the control plane's on the client, both from the cluster
// CA). The request names a sandbox and a port, never an address: the node
// resolves the sandbox among its own and dials only that sandbox's address,
// so a caller cannot use a node to reach anything else. After the 200 the
// connection is a byte pipe both ways; a half-close on one side (TLS
// close_notify, TCP FIN) is passed on to the other.
//
// Two other targets exist. BuilderTarget reaches a builder node's
// buildkitd (ServerConfig.Builder). CONNECT /volumes reaches the node's own
// volume-content server (ServerConfig.Volumes): HTTP/1.1 on the tunnel,
// served by internal/volume/content over the directory of a volume the
// node holds attached for the volume-content API, never over a path the
// request names. The control plane has checked the volume's token and
// attached it there (its lease) before it sends a request; VolumeProxy is
// its side.
package dataplane

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"syscall"

	"github.com/cubicle-dev/cubicle/internal/errdefs"
)

var (
	// ErrUnknownSandbox: the node holds no sandbox with that ID (404).
	ErrUnknownSandbox = errdefs.New(errdefs.ErrNotFound, "the sandbox is not on this node")
	// ErrBusy: the node is at its tunnel limit (503); a later dial may pass.
	ErrBusy = errdefs.New(errdefs.ErrResourceExhausted, "the node's data plane is at its tunnel limit")
	// ErrBadTarget: the tunnel request does not name a sandbox ID and a
	// port in 1-65535, nor the volume-content server of a node that has
	// one (400).
	ErrBadTarget = errdefs.New(errdefs.ErrInvalidArgument, "a tunnel names <sandboxID>:<port>")
	// ErrNotBuilder: the node runs no template builder (it is not labelled
	// builder=true), so it has no builder target (404).
	ErrNotBuilder = errdefs.New(errdefs.ErrNotFound, "this node runs no template builder (not labelled builder=true)")
	// ErrServerClosed is what Serve returns after Close.
	ErrServerClosed = errors.New("dataplane: server closed")
)

// Reasons carried in an error body, for the failures a caller tells apart.
const (
	reasonUnknownSandbox = "unknown_sandbox"
	reasonBadTarget      = "bad_target"
	reasonBusy           = "too_many_tunnels"
	reasonRefused        = "connection_refused"
	reasonDial           = "dial_failed"
	reasonLookup         = "lookup_failed"
	reasonNotBuilder     = "not_builder"
)

// errorBody is the JSON of a refused tunnel: e2b's {code, message} plus the
// reason the client maps back to a typed error.
type errorBody struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
	Reason  string `json:"reason,omitempty"`
}

// TunnelError is a tunnel the node refused. It matches ErrUnknownSandbox,
// ErrBusy or ErrBadTarget by reason, and syscall.ECONNREFUSED when the
// sandbox refused the connection (the port is closed), so a caller treats
// it as it would a refused direct dial.
type TunnelError struct {
	Node   string
	Status int
	Reason string
	// Message is the node's, for people.
	Message string
}

func (e *TunnelError) Error() string {
	return fmt.Sprintf("dataplane: node %s refused the tunnel (%d %s): %s", e.Node, e.Status, e.Reason, e.Message)
}

func (e *TunnelError) Unwrap() error {
	switch e.Reason {
	case reasonUnknownSandbox:
		return ErrUnknownSandbox
	case reasonBusy:
		return ErrBusy
	case reasonBadTarget:
		return ErrBadTarget
	case reasonNotBuilder:
		return ErrNotBuilder
	case reasonRefused:
		return syscall.ECONNREFUSED
	}
	return nil
}

// NodeError is a failure to reach a node's data plane at all: the dial,
// the TLS handshake (a wrong identity included), or reading its answer.
// It matches errdefs.ErrUnavailable and its cause, so a caller tells "the
// node is unreachable" from "the node refused" (*TunnelError) before it
// looks at the cause: a refused dial to the node is ECONNREFUSED too, but
// it says nothing about the sandbox's port.
type NodeError struct {
	Node, Addr string
	Err        error
}

func (e *NodeError) Error() string {
	return fmt.Sprintf("dataplane: node %s at %s: %v", e.Node, e.Addr, e.Err)
}

func (e *NodeError) Unwrap() []error { return []error{errdefs.ErrUnavailable, e.Err} }

// volumesTarget is the CONNECT request-target of the node's volume-content
// server. It is a path, so it can never parse as a sandbox's
// <sandboxID>:<port>.
const volumesTarget = "/volumes"

// BuilderTarget is the CONNECT authority of a node's template builder
// (its buildkitd's gRPC socket). The '.' keeps it apart from every sandbox
// ID, and the reserved .invalid name from any host a sandbox could be.
const BuilderTarget = "buildkitd.cubicle.invalid:1"

// target formats and parses the CONNECT authority <sandboxID>:<port>.
func target(sandboxID string, port int) string {
	return net.JoinHostPort(sandboxID, strconv.Itoa(port))
}

func parseTarget(s string) (id string, port int, err error) {
	id, ps, err := net.SplitHostPort(s)
	if err != nil {
		return "", 0, fmt.Errorf("%w: %q: %v", ErrBadTarget, s, err)
	}
	if !validID(id) {
		return "", 0, fmt.Errorf("%w: %q is not a sandbox ID", ErrBadTarget, id)
	}
	port, err = strconv.Atoi(ps)
	if err != nil || port < 1 || port > 65535 || strings.HasPrefix(ps, "0") || strings.HasPrefix(ps, "+") {
		return "", 0, fmt.Errorf("%w: port %q is not in 1-65535", ErrBadTarget, ps)
	}
	return id, port, nil
}

// validID: sandbox IDs are lower-case letters and digits (control's IDs);
// anything else, an address above all, is not a sandbox.
func validID(id string) bool {
	if id == "" || len(id) > 64 {
		return false
	}
	for _, c := range id {
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') {
			return false
		}
	}
	return true
}
