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

// restoreNetns re-adds what saveNetns recorded (idempotently).
func restoreNetns(path, file string) error {
	b, err := os.ReadFile(file)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var s savedNet
	if err := json.Unmarshal(b, &s); err != nil {
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
