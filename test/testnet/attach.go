package main

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"

	"github.com/cubicle-dev/cubicle/internal/network"
)

// hostSide is where the host end of the fixture's veth lives: the root
// network namespace (netns ""), or with --attach-netns NAME an existing
// named namespace (/run/netns/NAME) that plays the host, so a `cubicle
// serve` run inside it (with its own firewall, e.g. FORWARD policy DROP)
// reaches the fixture without the root namespace being involved. The
// fixture never creates or removes that namespace; it only adds, and at exit
// deletes, its veth end there.
type hostSide struct{ netns string }

func (h hostSide) path() string { return "/run/netns/" + h.netns }

// check refuses a name that is not a plain existing /run/netns entry.
func (h hostSide) check() error {
	if h.netns == "" {
		return nil
	}
	if strings.ContainsAny(h.netns, "/\x00") || h.netns == "." || h.netns == ".." {
		return fmt.Errorf("--attach-netns %q: want a name under /run/netns", h.netns)
	}
	if _, err := os.Stat(h.path()); err != nil {
		return fmt.Errorf("--attach-netns: %w", err)
	}
	return nil
}

// ip is an ip(8) command line run in the host side's namespace.
func (h hostSide) ip(args ...string) []string {
	if h.netns == "" {
		return append([]string{"ip"}, args...)
	}
	return append([]string{"ip", "-n", h.netns}, args...)
}

// usedPrefixes are the IPv4 prefixes of the root namespace's interfaces and,
// when attached, the host namespace's too: a /30 overlapping any of them is
// not free (the root's are checked either way, so two fixtures never share
// one even when only one is attached).
func (h hostSide) usedPrefixes() ([]netip.Prefix, error) {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil, err
	}
	if h.netns != "" {
		var in []net.Addr
		if err := network.RunInNetns(h.path(), func() error {
			var err error
			in, err = net.InterfaceAddrs()
			return err
		}); err != nil {
			return nil, err
		}
		addrs = append(addrs, in...)
	}
	var out []netip.Prefix
	for _, a := range addrs {
		if p, err := netip.ParsePrefix(a.String()); err == nil && p.Addr().Is4() {
			out = append(out, p.Masked())
		}
	}
	return out, nil
}

var errNoSlash30 = errors.New("no free /30 in 198.18.128.0/17")
