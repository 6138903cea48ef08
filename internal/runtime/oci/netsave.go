package oci

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// gVisor's netstack takes over the interfaces of the sandbox netns and
// removes their addresses from the host kernel (so the host stack does not
// answer for them). `runsc restore` re-reads the netns and, finding no
// addresses, brings the sandbox back without networking. So before the
// first start we record the netns config, and re-apply it before restore.

type savedAddr struct {
	Link string `json:"link"`
	CIDR string `json:"cidr"`
}

type savedRoute struct {
	Link    string `json:"link"`
	Dst     string `json:"dst,omitempty"` // "" = default
	Gateway string `json:"gw,omitempty"`
	Family  int    `json:"family"`
}

type savedNet struct {
	Addrs  []savedAddr  `json:"addrs"`
	Routes []savedRoute `json:"routes"`
}

func netHandle(path string) (*netlink.Handle, func(), error) {
	ns, err := netns.GetFromPath(path)
	if err != nil {
		return nil, nil, fmt.Errorf("oci: open netns %s: %w", path, err)
	}
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		ns.Close()
		return nil, nil, fmt.Errorf("oci: netlink in %s: %w", path, err)
	}
	return h, func() { h.Close(); ns.Close() }, nil
}

// saveNetns records global-scope addresses and non-kernel routes of every
// non-loopback link in the netns at path into file.
func saveNetns(path, file string) error {
	h, done, err := netHandle(path)
	if err != nil {
		return err
	}
	defer done()
	links, err := h.LinkList()
	if err != nil {
		return err
	}
	var s savedNet
	for _, l := range links {
		a := l.Attrs()
		if a.Flags&net.FlagLoopback != 0 {
			continue
		}
		addrs, err := h.AddrList(l, netlink.FAMILY_ALL)
		if err != nil {
			return err
		}
		for _, ad := range addrs {
			if ad.IP.IsLinkLocalUnicast() {
				continue // the kernel recreates these
			}
			s.Addrs = append(s.Addrs, savedAddr{Link: a.Name, CIDR: ad.IPNet.String()})
		}
		routes, err := h.RouteList(l, netlink.FAMILY_ALL)
		if err != nil {
			return err
		}
		for _, r := range routes {
			if r.Protocol == unix.RTPROT_KERNEL || (r.Dst != nil && r.Dst.IP.IsLinkLocalUnicast()) {
				continue // come back with the address
			}
			sr := savedRoute{Link: a.Name, Family: r.Family}
			if r.Dst != nil {
				sr.Dst = r.Dst.String()
			}
			if r.Gw != nil {
				sr.Gateway = r.Gw.String()
			}
			s.Routes = append(s.Routes, sr)
		}
	}
	b, err := json.Marshal(s)
	if err != nil {
		return err
	}
	return os.WriteFile(file, b, 0o600)
}

// loadNetns reads what saveNetns recorded in file; (nil, nil) when there is
// no file, as for sandboxes saveNetns skips (not runsc, or no netns): there
// is then nothing to act on.
func loadNetns(file string) (*savedNet, error) {
	b, err := os.ReadFile(file)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var s savedNet
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, err
	}
	return &s, nil
}

// restoreNetns re-adds what saveNetns recorded (idempotently).
func restoreNetns(path, file string) error {
	s, err := loadNetns(file)
	if s == nil || err != nil {
		return err
	}
	h, done, err := netHandle(path)
	if err != nil {
		return err
	}
	defer done()
	for _, a := range s.Addrs {
		l, err := h.LinkByName(a.Link)
		if err != nil {
			return fmt.Errorf("oci: netns link %s: %w", a.Link, err)
		}
		addr, err := netlink.ParseAddr(a.CIDR)
		if err != nil {
			return err
		}
		if err := h.AddrReplace(l, addr); err != nil {
			return fmt.Errorf("oci: restore addr %s on %s: %w", a.CIDR, a.Link, err)
		}
	}
	for _, r := range s.Routes {
		l, err := h.LinkByName(r.Link)
		if err != nil {
			return fmt.Errorf("oci: netns link %s: %w", r.Link, err)
		}
		rt := netlink.Route{LinkIndex: l.Attrs().Index, Family: r.Family}
		if r.Dst != "" {
			if _, rt.Dst, err = net.ParseCIDR(r.Dst); err != nil {
				return err
			}
		}
		if r.Gateway != "" {
			rt.Gw = net.ParseIP(r.Gateway)
		}
		if err := h.RouteReplace(&rt); err != nil {
			return fmt.Errorf("oci: restore route %+v: %w", r, err)
		}
	}
	return nil
}

// abortHostConns aborts the host's TCP connections to the sandbox addresses
// recorded in file, once its gVisor sandbox has stopped (deleted, or
// checkpointed for a pause). When a runc container dies, the kernel closes
// its sockets and the host's connections to it end with a FIN or RST, so
// keep-alive pools drop them. gVisor's netstack lives in the sandbox process
// and dies without a word: the host's side stays ESTABLISHED, and the next
// netstack at that address (the same sandbox restored, or a new one given
// the freed address) answers the next request on it with a reset. Aborting
// them (SOCK_DESTROY, as `ss -K` does) makes a runsc stop look like a runc
// one to every host client: the proxy, the node's agent client, anything else.
func abortHostConns(file string) error {
	s, err := loadNetns(file)
	if s == nil || err != nil {
		return err
	}
	ips := map[[4]byte]bool{}
	for _, a := range s.Addrs {
		if p, err := netlink.ParseAddr(a.CIDR); err == nil {
			if v4 := p.IP.To4(); v4 != nil {
				ips[[4]byte(v4)] = true
			}
		}
	}
	if len(ips) == 0 {
		return nil
	}
	socks, err := netlink.SocketDiagTCP(unix.AF_INET)
	if err != nil && !errors.Is(err, netlink.ErrDumpInterrupted) {
		return fmt.Errorf("oci: list host TCP sockets: %w", err)
	}
	var errs []error
	for _, sk := range socks {
		dst := sk.ID.Destination.To4()
		if dst == nil || !ips[[4]byte(dst)] {
			continue
		}
		switch sk.State {
		case unix.BPF_TCP_LISTEN, unix.BPF_TCP_TIME_WAIT, unix.BPF_TCP_CLOSE:
			continue
		}
		local := &net.TCPAddr{IP: sk.ID.Source, Port: int(sk.ID.SourcePort)}
		remote := &net.TCPAddr{IP: dst, Port: int(sk.ID.DestinationPort)}
		if err := netlink.SocketDestroy(local, remote); err != nil && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("oci: abort %s->%s: %w", local, remote, err))
		}
	}
	return errors.Join(errs...)
}
