//go:build linux

package egress

import (
	"context"
	"net"
	"net/netip"
	"syscall"

	"golang.org/x/sys/unix"
)

// ListenFreebind listens on an address that may not be assigned yet: the
// proxy binds the bridge's gateway address before the network manager makes
// the bridge, so the manager's redirect rules know the port from the start.
func ListenFreebind(ap netip.AddrPort) (net.Listener, error) {
	return freebind.Listen(context.Background(), "tcp4", ap.String())
}

// ListenPacketFreebind is ListenFreebind for UDP: the proxy answers
// tunnelled sandboxes' DNS on the same port (WithDNS).
func ListenPacketFreebind(ap netip.AddrPort) (net.PacketConn, error) {
	return freebind.ListenPacket(context.Background(), "udp4", ap.String())
}

var freebind = net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
	var serr error
	if err := c.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.SOL_IP, unix.IP_FREEBIND, 1)
	}); err != nil {
		return err
	}
	return serr
}}
