package node

import (
	"bufio"
	"net/netip"
	"os"
	"strings"
)

// fallbackResolvers are used when the host only has loopback resolvers
// (systemd-resolved, dnsmasq), which a sandbox cannot reach: the firewall
// drops sandbox traffic to the host.
var fallbackResolvers = []string{"1.1.1.1", "8.8.8.8"}

// WriteResolvConf derives the sandboxes' resolv.conf from the host's: the
// host's non-loopback IPv4 nameservers, else public fallbacks. It returns
// the servers written, which the network policy keeps reachable on port 53.
func WriteResolvConf(hostPath, outPath string) ([]netip.Addr, error) {
	var servers []string
	if f, err := os.Open(hostPath); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			fields := strings.Fields(sc.Text())
			if len(fields) < 2 || fields[0] != "nameserver" {
				continue
			}
			a, err := netip.ParseAddr(fields[1])
			if err != nil || a.IsLoopback() || !a.Is4() || a.IsUnspecified() {
				continue
			}
			servers = append(servers, a.String())
		}
		f.Close()
	}
	if len(servers) == 0 {
		servers = fallbackResolvers
	}
	return writeResolvConf(outPath, servers, "the host's resolvers")
}

// WriteResolvConfWith writes the sandboxes' resolv.conf with the given
// servers (serve --dns).
func WriteResolvConfWith(outPath string, addrs []netip.Addr) ([]netip.Addr, error) {
	servers := make([]string, 0, len(addrs))
	for _, a := range addrs {
		servers = append(servers, a.String())
	}
	return writeResolvConf(outPath, servers, "--dns")
}

func writeResolvConf(outPath string, servers []string, from string) ([]netip.Addr, error) {
	var b strings.Builder
	b.WriteString("# written by cubicle from " + from + "\n")
	for _, s := range servers {
		b.WriteString("nameserver " + s + "\n")
	}
	b.WriteString("options timeout:2 attempts:2\n")
	// Rewritten in place, never replaced: sandboxes that outlive a restart
	// (and paused ones, whose staged bind mounts hold the file) keep the
	// same inode, and a bind mount of a replaced file could not be made
	// again when they boot.
	if old, err := os.ReadFile(outPath); err != nil || string(old) != b.String() {
		if err := os.WriteFile(outPath, []byte(b.String()), 0o644); err != nil {
			return nil, err
		}
	}
	addrs := make([]netip.Addr, 0, len(servers))
	for _, s := range servers {
		addrs = append(addrs, netip.MustParseAddr(s))
	}
	return addrs, nil
}
