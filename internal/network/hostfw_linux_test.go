//go:build linux

package network

import (
	"context"
	"net/netip"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// The host firewall tests never touch the machine's own iptables: a netns
// of the test's plays the host, with its FORWARD policy set to DROP the way
// Docker, ufw and firewalld leave it. The manager, its bridge and the
// sandbox all live in that netns; the "internet" is another netns behind a
// veth.

func iptablesIn(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command("iptables", append([]string{"-w", "10"}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("iptables %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

func TestHostFirewallForwardDrop(t *testing.T) {
	requireRoot(t)
	if _, err := exec.LookPath("iptables"); err != nil {
		t.Fatal("iptables is not installed (scripts/install installs it)")
	}
	for _, docker := range []bool{false, true} {
		name := "FORWARD"
		if docker {
			name = "DOCKER-USER"
		}
		t.Run(name, func(t *testing.T) { testHostFirewall(t, docker) })
	}
}

func testHostFirewall(t *testing.T, docker bool) {
	hostNS := filepath.Join(t.TempDir(), "host")
	if err := createNetns(hostNS); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := deleteNetns(hostNS); err != nil {
			t.Error(err)
		}
	})
	cfg := testConfig(t, 24)
	err := RunInNetns(hostNS, func() error {
		iptablesIn(t, "-P", "FORWARD", "DROP")
		if docker {
			// Docker's layout: FORWARD jumps to DOCKER-USER first, which returns.
			iptablesIn(t, "-N", "DOCKER-USER")
			iptablesIn(t, "-A", "DOCKER-USER", "-j", "RETURN")
			iptablesIn(t, "-I", "FORWARD", "-j", "DOCKER-USER")
		}
		ext := newExtHost(t)
		srv := listen(t, ext.path, ext.ip)
		// DNS-like UDP, to a port of the upstream (an echo server per check).
		udp := netip.AddrPortFrom(ext.ip, 5353)
		ctx := context.Background()

		// Sanity: with the mode off the host's DROP policy wins.
		off := cfg
		off.HostFirewall = HostFirewallOff
		l, err := NewLinux(off)
		if err != nil {
			t.Fatalf("NewLinux: %v", err)
		}
		sbx := setup(t, l, "sbxfw"+randHex(4), Policy{AllowInternet: true})
		mustFail(t, "FORWARD DROP without the accept rules", sbx.NetNSPath, srv)
		if udpRoundTrip(t, sbx.NetNSPath, ext.path, udp) {
			t.Fatal("UDP passed FORWARD DROP without the accept rules")
		}
		if l.HostFirewallChain() != "" {
			t.Fatalf("mode off added rules to %s", l.HostFirewallChain())
		}

		// A restart in auto mode adds the rules: egress works, in both directions.
		l, err = NewLinux(cfg)
		if err != nil {
			t.Fatalf("NewLinux auto: %v", err)
		}
		defer func() {
			if err := l.Destroy(ctx); err != nil {
				t.Errorf("Destroy: %v", err)
			}
		}()
		want := "FORWARD"
		if docker {
			want = "DOCKER-USER"
		}
		if got := l.HostFirewallChain(); got != want {
			t.Fatalf("rules in %q, want %q", got, want)
		}
		rules := iptablesIn(t, "-S", want)
		if strings.Count(rules, "cubicle:"+cfg.Bridge) != 2 {
			t.Fatalf("want two rules tagged for %s in %s:\n%s", cfg.Bridge, want, rules)
		}
		mustConnect(t, "FORWARD DROP with the accept rules", sbx.NetNSPath, srv)
		if !udpRoundTrip(t, sbx.NetNSPath, ext.path, udp) {
			t.Fatal("DNS-like UDP failed with the accept rules")
		}

		// Cubicle's own policy still applies behind the accept rules.
		if err := l.UpdatePolicy(ctx, sbx.ID, Policy{AllowInternet: true, DenyOut: []string{"0.0.0.0/0"}}); err != nil {
			t.Fatal(err)
		}
		mustFail(t, "denyOut all behind the accept rules", sbx.NetNSPath, srv)
		if udpRoundTrip(t, sbx.NetNSPath, ext.path, udp) {
			t.Fatal("UDP passed denyOut all behind the accept rules")
		}
		if err := l.UpdatePolicy(ctx, sbx.ID, Policy{AllowInternet: false}); err != nil {
			t.Fatal(err)
		}
		mustFail(t, "no internet behind the accept rules", sbx.NetNSPath, srv)
		if err := l.UpdatePolicy(ctx, sbx.ID, Policy{AllowInternet: true}); err != nil {
			t.Fatal(err)
		}
		mustConnect(t, "internet again", sbx.NetNSPath, srv)

		// A crash leaves the rules; the next start replaces them, never doubles them.
		l2, err := NewLinux(cfg)
		if err != nil {
			t.Fatalf("NewLinux again: %v", err)
		}
		if n := strings.Count(iptablesIn(t, "-S", want), "cubicle:"+cfg.Bridge); n != 2 {
			t.Fatalf("after a restart %d tagged rules, want 2", n)
		}
		l = l2

		// Close removes exactly our rules; the policy and Docker's rules stay.
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
		all := iptablesIn(t, "-S")
		if strings.Contains(all, "cubicle:") {
			t.Fatalf("rules left after Close:\n%s", all)
		}
		if !strings.Contains(all, "-P FORWARD DROP") {
			t.Fatalf("FORWARD policy changed:\n%s", all)
		}
		if docker && !strings.Contains(all, "-A DOCKER-USER -j RETURN") {
			t.Fatalf("Docker's own rule removed:\n%s", all)
		}
		mustFail(t, "after Close the host's DROP applies again", sbx.NetNSPath, srv)
		if err := l.Close(); err != nil {
			t.Fatalf("second Close: %v", err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestHostFirewallAcceptingHostGetsNoRules(t *testing.T) {
	requireRoot(t)
	hostNS := filepath.Join(t.TempDir(), "host")
	if err := createNetns(hostNS); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = deleteNetns(hostNS) })
	cfg := testConfig(t, 24)
	err := RunInNetns(hostNS, func() error {
		l, err := NewLinux(cfg)
		if err != nil {
			return err
		}
		defer l.Destroy(context.Background())
		if ch := l.HostFirewallChain(); ch != "" {
			t.Fatalf("an accepting host got rules in %s", ch)
		}
		if out := iptablesIn(t, "-S"); strings.Contains(out, "cubicle:") {
			t.Fatalf("rules added:\n%s", out)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := NewLinux(Config{Bridge: "cbtx", HostFirewall: "sometimes"}); err == nil {
		t.Fatal("an unknown mode was accepted")
	}
}
