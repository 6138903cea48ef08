//go:build linux

package network

import (
	"errors"
	"fmt"
	"os/exec"
	"strings"

	"github.com/coreos/go-iptables/iptables"
)

// Host firewalls. A forwarded packet must be accepted by every base chain on
// the forward hook, so Cubicle's own nftables table accepting a sandbox's
// egress is not enough on a host whose iptables filter FORWARD chain drops
// (Docker sets its policy to DROP; ufw and firewalld drop too). On such a
// host the manager adds two accept rules for its bridge: in DOCKER-USER when
// that chain exists (Docker's place for user rules, evaluated before its
// own), else at the top of FORWARD. They only let the packet go on to
// Cubicle's own table, whose per-sandbox chains still apply each sandbox's
// policy. Every rule carries a comment naming the bridge, so the manager
// finds and removes exactly its own rules: stale ones at start, all of them
// at Close. Policies and other rules are never touched.

// Host firewall modes (Config.HostFirewall).
const (
	HostFirewallAuto = "auto" // add the accept rules when the FORWARD chain would drop
	HostFirewallOff  = "off"  // never touch iptables
)

// ErrHostFirewall wraps failures to read or change the host's iptables.
var ErrHostFirewall = errors.New("network: host firewall")

const dockerUserChain = "DOCKER-USER"

type hostFirewall struct {
	ipt     *iptables.IPTables
	bridge  string
	comment string
	chain   string // where our rules are, "" when none were needed
}

func (f *hostFirewall) rules() [][]string {
	return [][]string{
		// Sandbox egress (Cubicle's table still filters it per sandbox).
		{"-i", f.bridge, "!", "-o", f.bridge, "-m", "comment", "--comment", f.comment, "-j", "ACCEPT"},
		// Replies to sandboxes.
		{"-o", f.bridge, "-m", "conntrack", "--ctstate", "RELATED,ESTABLISHED", "-m", "comment", "--comment", f.comment, "-j", "ACCEPT"},
	}
}

// openHostFirewall removes rules a crashed predecessor left for this bridge
// and adds the accept rules when the host's FORWARD chain would drop the
// sandboxes' traffic. A host without the iptables binary has no iptables
// rules to coexist with (nft-only firewalls are separate tables whose
// chains Cubicle cannot reason about): it returns nil, nil.
func openHostFirewall(bridge string) (*hostFirewall, error) {
	if _, err := exec.LookPath("iptables"); err != nil {
		return nil, nil
	}
	ipt, err := iptables.New(iptables.IPFamily(iptables.ProtocolIPv4), iptables.Timeout(10))
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrHostFirewall, err)
	}
	f := &hostFirewall{ipt: ipt, bridge: bridge, comment: "cubicle:" + bridge}
	if err := f.removeOwn(); err != nil {
		return nil, err
	}
	drops, err := f.forwardDrops()
	if err != nil {
		return nil, err
	}
	docker, err := ipt.ChainExists("filter", dockerUserChain)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrHostFirewall, err)
	}
	if !drops && !docker {
		return f, nil
	}
	f.chain = "FORWARD"
	if docker {
		f.chain = dockerUserChain
	}
	rules := f.rules()
	// Inserted last-first at position 1, so they end up in order at the top.
	for i := len(rules) - 1; i >= 0; i-- {
		if err := ipt.Insert("filter", f.chain, 1, rules[i]...); err != nil {
			_ = f.removeOwn()
			return nil, fmt.Errorf("%w: add rule to %s: %v", ErrHostFirewall, f.chain, err)
		}
	}
	return f, nil
}

// forwardDrops reports whether the filter FORWARD chain's policy is not
// ACCEPT or the chain has a rule that drops or rejects.
func (f *hostFirewall) forwardDrops() (bool, error) {
	exists, err := f.ipt.ChainExists("filter", "FORWARD")
	if err != nil || !exists {
		return false, wrapFW(err)
	}
	lines, err := f.ipt.List("filter", "FORWARD")
	if err != nil {
		return false, wrapFW(err)
	}
	for _, l := range lines {
		fs := strings.Fields(l)
		switch {
		case len(fs) == 3 && fs[0] == "-P":
			if fs[2] != "ACCEPT" {
				return true, nil
			}
		case len(fs) > 2 && fs[0] == "-A":
			if v := target(fs); v == "DROP" || v == "REJECT" {
				return true, nil
			}
		}
	}
	return false, nil
}

func target(fs []string) string {
	for i := 0; i+1 < len(fs); i++ {
		if fs[i] == "-j" {
			return fs[i+1]
		}
	}
	return ""
}

// removeOwn deletes every rule in FORWARD and DOCKER-USER that carries this
// bridge's comment, and nothing else.
func (f *hostFirewall) removeOwn() error {
	var errs []error
	for _, chain := range []string{"FORWARD", dockerUserChain} {
		exists, err := f.ipt.ChainExists("filter", chain)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if !exists {
			continue
		}
		lines, err := f.ipt.List("filter", chain)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for _, l := range lines {
			fs := strings.Fields(l)
			if len(fs) < 3 || fs[0] != "-A" || !hasComment(fs, f.comment) {
				continue
			}
			if err := f.ipt.Delete("filter", chain, unquote(fs[2:])...); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return wrapFW(errors.Join(errs...))
}

func hasComment(fs []string, c string) bool {
	for i := 0; i+1 < len(fs); i++ {
		if fs[i] == "--comment" && strings.Trim(fs[i+1], `"`) == c {
			return true
		}
	}
	return false
}

// unquote strips the quotes iptables -S puts around some values; our rules
// hold no spaces, so fields map one to one onto arguments.
func unquote(fs []string) []string {
	out := make([]string, len(fs))
	for i, s := range fs {
		out[i] = strings.Trim(s, `"`)
	}
	return out
}

// Chain says where the accept rules are ("" when the host needed none).
func (f *hostFirewall) Chain() string {
	if f == nil {
		return ""
	}
	return f.chain
}

// close removes this bridge's rules. Idempotent.
func (f *hostFirewall) close() error {
	if f == nil {
		return nil
	}
	err := f.removeOwn()
	if err == nil {
		f.chain = ""
	}
	return err
}

func wrapFW(err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("%w: %v", ErrHostFirewall, err)
}
