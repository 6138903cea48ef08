package node

import (
	"context"
	"encoding/hex"
	"net"
	"net/netip"
	"strconv"
	"strings"
)

// sandboxDomain ends the hosts SandboxHost makes; nothing resolves it.
const sandboxDomain = ".sandbox.cubicle.invalid"

// SandboxHost is the URL host (host:port) for requests to port on the
// sandbox id at addr. http.Transport pools keep-alive connections by URL
// host, so naming the sandbox in it gives every sandbox its own pool, and
// DialSandbox dials the address the host carries.
//
// Pooling by address alone hands the next sandbox that gets a freed address
// (the lowest free one is reused, with the MAC derived from it) the idle
// connections to its dead predecessor. Under runc the kernel closes those
// when the container's processes die, so the pool drops them; gVisor's
// netstack dies with its sandbox without a FIN or RST, so they stay
// ESTABLISHED on the host, and the new sandbox's netstack answers the first
// request on one with a reset. A POST (process.Process/Start) is not retried
// by the transport, so the first command failed in every other runsc sandbox.
func SandboxHost(id string, addr netip.AddrPort) string {
	return id + "." + hex.EncodeToString(addr.Addr().AsSlice()) + sandboxDomain + ":" + strconv.Itoa(int(addr.Port()))
}

// sandboxAddr decodes a SandboxHost host:port.
func sandboxAddr(hostport string) (netip.AddrPort, bool) {
	host, port, err := net.SplitHostPort(hostport)
	if err != nil {
		return netip.AddrPort{}, false
	}
	rest, ok := strings.CutSuffix(host, sandboxDomain)
	if !ok {
		return netip.AddrPort{}, false
	}
	_, enc, ok := strings.Cut(rest, ".")
	if !ok {
		return netip.AddrPort{}, false
	}
	raw, err := hex.DecodeString(enc)
	if err != nil {
		return netip.AddrPort{}, false
	}
	a, ok := netip.AddrFromSlice(raw)
	p, err := strconv.ParseUint(port, 10, 16)
	if !ok || err != nil {
		return netip.AddrPort{}, false
	}
	return netip.AddrPortFrom(a, uint16(p)), true
}

// DialSandbox wraps d for an http.Transport: SandboxHost hosts dial the
// address they carry, other hosts are dialled as given.
func DialSandbox(d *net.Dialer) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		if ap, ok := sandboxAddr(addr); ok {
			addr = ap.String()
		}
		return d.DialContext(ctx, network, addr)
	}
}
