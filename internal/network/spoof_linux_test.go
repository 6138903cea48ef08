//go:build linux

package network

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// The attacks below are what root with CAP_NET_RAW could do from a sandbox
// (the runtime drops that capability too; this is the layer underneath):
// raw frames with a neighbour's MAC, a neighbour's IP, forged ARP, IPv6 NDP
// and router solicitations, and DHCP. The test process plays root inside
// the attacker's netns with an AF_PACKET socket.

func htons(v uint16) uint16 { return v<<8 | v>>8 }

// rawSocket opens an AF_PACKET socket bound to ifname in the netns at path
// ("" = host). The socket stays in that netns.
func rawSocket(t *testing.T, path, ifname string) int {
	t.Helper()
	var fd int
	open := func() error {
		lk, err := netlink.LinkByName(ifname)
		if err != nil {
			return err
		}
		fd, err = unix.Socket(unix.AF_PACKET, unix.SOCK_RAW, int(htons(unix.ETH_P_ALL)))
		if err != nil {
			return err
		}
		return unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ALL), Ifindex: lk.Attrs().Index})
	}
	var err error
	if path == "" {
		err = open()
	} else {
		err = RunInNetns(path, open)
	}
	if err != nil {
		t.Fatalf("raw socket on %s in %q: %v", ifname, path, err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	return fd
}

// capture collects frames arriving on fd for d.
func capture(t *testing.T, fd int, d time.Duration) [][]byte {
	t.Helper()
	tv := unix.NsecToTimeval((50 * time.Millisecond).Nanoseconds())
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		t.Fatal(err)
	}
	var out [][]byte
	buf := make([]byte, 65536)
	for end := time.Now().Add(d); time.Now().Before(end); {
		n, from, err := unix.Recvfrom(fd, buf, 0)
		if err != nil {
			continue // EAGAIN on timeout
		}
		if ll, ok := from.(*unix.SockaddrLinklayer); ok && ll.Pkttype == unix.PACKET_OUTGOING {
			continue
		}
		out = append(out, append([]byte(nil), buf[:n]...))
	}
	return out
}

func drain(fd int) {
	buf := make([]byte, 65536)
	for {
		if _, _, err := unix.Recvfrom(fd, buf, unix.MSG_DONTWAIT); err != nil {
			return
		}
	}
}

var bcastMAC = net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}

func ethFrame(dst, src net.HardwareAddr, ethertype uint16, payload []byte) []byte {
	f := append(append(append([]byte(nil), dst...), src...), byte(ethertype>>8), byte(ethertype))
	return append(f, payload...)
}

func ipChecksum(h []byte) uint16 {
	var sum uint32
	for i := 0; i+1 < len(h); i += 2 {
		sum += uint32(binary.BigEndian.Uint16(h[i:]))
	}
	for sum > 0xffff {
		sum = sum>>16 + sum&0xffff
	}
	return ^uint16(sum)
}

// udpPacket is an IPv4/UDP packet (UDP checksum 0: none).
func udpPacket(src, dst netip.Addr, sport, dport uint16, payload []byte) []byte {
	udp := make([]byte, 8, 8+len(payload))
	binary.BigEndian.PutUint16(udp[0:], sport)
	binary.BigEndian.PutUint16(udp[2:], dport)
	binary.BigEndian.PutUint16(udp[4:], uint16(8+len(payload)))
	udp = append(udp, payload...)
	ip := make([]byte, 20)
	ip[0] = 0x45
	binary.BigEndian.PutUint16(ip[2:], uint16(20+len(udp)))
	ip[8] = 64
	ip[9] = unix.IPPROTO_UDP
	s, d := src.As4(), dst.As4()
	copy(ip[12:], s[:])
	copy(ip[16:], d[:])
	binary.BigEndian.PutUint16(ip[10:], ipChecksum(ip))
	return append(ip, udp...)
}

// arpPacket is an Ethernet/IPv4 ARP packet.
func arpPacket(op uint16, sha net.HardwareAddr, spa netip.Addr, tha net.HardwareAddr, tpa netip.Addr) []byte {
	p := []byte{0, 1, 8, 0, 6, 4, byte(op >> 8), byte(op)}
	s, t := spa.As4(), tpa.As4()
	p = append(p, sha...)
	p = append(p, s[:]...)
	p = append(p, tha...)
	return append(p, t[:]...)
}

func send(t *testing.T, fd int, ifindex int, frame []byte) {
	t.Helper()
	if err := unix.Sendto(fd, frame, 0, &unix.SockaddrLinklayer{Ifindex: ifindex, Halen: 6}); err != nil {
		t.Fatalf("send raw frame: %v", err)
	}
}

func eth0Index(t *testing.T, path string) int {
	t.Helper()
	_, lk := eth0In(t, path)
	return lk.Attrs().Index
}

// fdbPorts returns the bridge ports on which the bridge FDB holds mac.
func fdbPorts(t *testing.T, mac net.HardwareAddr) []string {
	t.Helper()
	ns, err := netlink.NeighList(0, unix.AF_BRIDGE)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, n := range ns {
		if bytes.Equal(n.HardwareAddr, mac) {
			lk, err := netlink.LinkByIndex(n.LinkIndex)
			if err != nil {
				continue
			}
			out = append(out, lk.Attrs().Name)
		}
	}
	return out
}

func hostNeighMAC(t *testing.T, bridge string, ip netip.Addr) net.HardwareAddr {
	t.Helper()
	br := mustLink(t, bridge)
	ns, err := netlink.NeighList(br.Attrs().Index, netlink.FAMILY_V4)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range ns {
		if a, ok := netip.AddrFromSlice(n.IP.To4()); ok && a == ip {
			return n.HardwareAddr
		}
	}
	return nil
}

func TestLayer2SpoofingFromSandbox(t *testing.T) {
	cfg := testConfig(t, 24)
	l := newTestManager(t, cfg)
	victim := setup(t, l, "sbxvic"+randHex(2), Policy{AllowInternet: false})
	attacker := setup(t, l, "sbxatk"+randHex(2), Policy{AllowInternet: true})
	vMAC, aMAC := macFor(victim.Addr), macFor(attacker.Addr)
	vSrv := listen(t, victim.NetNSPath, victim.Addr)
	mustConnect(t, "host->victim before", "", vSrv)

	atk := rawSocket(t, attacker.NetNSPath, "eth0")
	atkIdx := eth0Index(t, attacker.NetNSPath)
	tap := rawSocket(t, "", cfg.Bridge) // what reaches the host through the bridge
	gwMAC := mustLink(t, cfg.Bridge).Attrs().HardwareAddr

	// A legitimate frame does reach the host, so the negative checks below
	// test the filter and not the capture.
	marker := []byte("cubicle-spoof-" + randHex(4))
	drain(tap)
	send(t, atk, atkIdx, ethFrame(bcastMAC, aMAC, unix.ETH_P_IP, udpPacket(attacker.Addr, cfg.Pool.Addr().Next(), 40000, 9, marker)))
	if !anyContains(capture(t, tap, 500*time.Millisecond), marker) {
		t.Fatal("control: a legitimate frame from the attacker did not reach the bridge")
	}

	attacks := []struct {
		name  string
		frame []byte
	}{
		{"MAC spoof (victim's source MAC, own IP)", ethFrame(bcastMAC, vMAC, unix.ETH_P_IP,
			udpPacket(attacker.Addr, cfg.Pool.Addr().Next(), 40000, 9, marker))},
		{"IP spoof (own MAC, victim's IP)", ethFrame(gwMAC, aMAC, unix.ETH_P_IP,
			udpPacket(victim.Addr, cfg.Pool.Addr().Next(), 40000, 9, marker))},
		{"ARP reply claiming the victim's IP", ethFrame(gwMAC, aMAC, unix.ETH_P_ARP,
			arpPacket(2, aMAC, victim.Addr, gwMAC, cfg.Pool.Addr().Next()))},
		{"gratuitous ARP claiming the victim's IP", ethFrame(bcastMAC, aMAC, unix.ETH_P_ARP,
			arpPacket(1, aMAC, victim.Addr, bcastMAC, victim.Addr))},
		{"ARP with the victim's sender MAC", ethFrame(bcastMAC, aMAC, unix.ETH_P_ARP,
			arpPacket(2, vMAC, attacker.Addr, bcastMAC, cfg.Pool.Addr().Next()))},
		{"802.1Q-tagged IPv4 as the victim", ethFrame(bcastMAC, aMAC, 0x8100,
			append([]byte{0, 1, 0x08, 0x00}, udpPacket(victim.Addr, cfg.Pool.Addr().Next(), 40000, 9, marker)...))},
		{"IPv6 neighbour advertisement", ethFrame(net.HardwareAddr{0x33, 0x33, 0, 0, 0, 1}, aMAC, unix.ETH_P_IPV6,
			ndpAdvert(aMAC, marker))},
	}
	for _, a := range attacks {
		drain(tap)
		for i := 0; i < 3; i++ {
			send(t, atk, atkIdx, a.frame)
		}
		for _, f := range capture(t, tap, 300*time.Millisecond) {
			if len(f) >= 12 && (bytes.Equal(f[6:12], aMAC) || bytes.Equal(f[6:12], vMAC)) && !isLegitFrom(f, aMAC, attacker.Addr) {
				t.Errorf("%s: frame reached the host: % x", a.name, f[:min(len(f), 42)])
			}
		}
	}

	if ports := fdbPorts(t, vMAC); len(ports) != 1 || ports[0] != victim.HostVeth {
		t.Errorf("bridge fdb for the victim's MAC: %v, want only %s", ports, victim.HostVeth)
	}
	if got := hostNeighMAC(t, cfg.Bridge, victim.Addr); !bytes.Equal(got, vMAC) {
		t.Errorf("host neighbour for victim %s is %v, want %v", victim.Addr, got, vMAC)
	}

	// The attack's goal: host traffic for the victim (agent calls, tokens)
	// arriving at the attacker. It must all go to the victim.
	drain(atk)
	for i := 0; i < 3; i++ {
		mustConnect(t, "host->victim after", "", vSrv)
	}
	vb := victim.Addr.As4()
	for _, f := range capture(t, atk, 300*time.Millisecond) {
		if len(f) >= 34 && (bytes.Equal(f[0:6], vMAC) || binary.BigEndian.Uint16(f[12:]) == unix.ETH_P_IP && bytes.Equal(f[30:34], vb[:])) {
			t.Fatalf("the attacker received the victim's traffic: % x", f[:34])
		}
	}
}

// isLegitFrom reports an ordinary IPv4 frame the attacker may send (its own
// MAC and address), e.g. the kernel's own traffic during the test.
func isLegitFrom(f []byte, mac net.HardwareAddr, ip netip.Addr) bool {
	if len(f) < 30 || !bytes.Equal(f[6:12], mac) {
		return false
	}
	a := ip.As4()
	switch binary.BigEndian.Uint16(f[12:]) {
	case unix.ETH_P_IP:
		return bytes.Equal(f[26:30], a[:])
	case unix.ETH_P_ARP:
		return len(f) >= 42 && bytes.Equal(f[22:28], mac) && bytes.Equal(f[28:32], a[:])
	}
	return false
}

func anyContains(frames [][]byte, marker []byte) bool {
	for _, f := range frames {
		if bytes.Contains(f, marker) {
			return true
		}
	}
	return false
}

// ndpAdvert is an IPv6 packet carrying an unsolicited neighbour
// advertisement (checksum not computed: it must not get that far).
func ndpAdvert(mac net.HardwareAddr, marker []byte) []byte {
	icmp := append([]byte{136, 0, 0, 0, 0x20, 0, 0, 0}, net.ParseIP("fe80::1").To16()...)
	icmp = append(icmp, 2, 1)
	icmp = append(icmp, mac...)
	icmp = append(icmp, marker...)
	ip6 := []byte{0x60, 0, 0, 0, byte(len(icmp) >> 8), byte(len(icmp)), 58, 255}
	ip6 = append(ip6, net.ParseIP("fe80::1").To16()...)
	ip6 = append(ip6, net.ParseIP("ff02::1").To16()...)
	return append(ip6, icmp...)
}

// Nothing on the bridge answers DHCP or IPv6 router solicitations: a
// sandbox cannot get itself another address or route.
func TestNoDHCPOrRouterAdvertisements(t *testing.T) {
	cfg := testConfig(t, 24)
	l := newTestManager(t, cfg)
	s := setup(t, l, "sbxdhcp"+randHex(2), Policy{AllowInternet: true})
	fd := rawSocket(t, s.NetNSPath, "eth0")
	idx := eth0Index(t, s.NetNSPath)
	mac := macFor(s.Addr)
	dhcp := make([]byte, 240)
	dhcp[0], dhcp[1], dhcp[2] = 1, 1, 6 // BOOTREQUEST, Ethernet
	copy(dhcp[28:], mac)
	copy(dhcp[236:], []byte{99, 130, 83, 99})
	dhcp = append(dhcp, 53, 1, 1, 255) // DHCPDISCOVER
	rs := []byte{0x60, 0, 0, 0, 0, 8, 58, 255}
	rs = append(rs, net.ParseIP("fe80::2").To16()...)
	rs = append(rs, net.ParseIP("ff02::2").To16()...)
	rs = append(rs, 133, 0, 0, 0, 0, 0, 0, 0)
	drain(fd)
	send(t, fd, idx, ethFrame(bcastMAC, mac, unix.ETH_P_IP, udpPacket(s.Addr, netip.MustParseAddr("255.255.255.255"), 68, 67, dhcp)))
	send(t, fd, idx, ethFrame(net.HardwareAddr{0x33, 0x33, 0, 0, 0, 2}, mac, unix.ETH_P_IPV6, rs))
	for _, f := range capture(t, fd, time.Second) {
		if len(f) < 14 {
			continue
		}
		switch binary.BigEndian.Uint16(f[12:]) {
		case unix.ETH_P_IPV6:
			t.Errorf("IPv6 frame reached the sandbox: % x", f[:min(len(f), 60)])
		case unix.ETH_P_IP:
			if len(f) >= 38 && f[23] == unix.IPPROTO_UDP && binary.BigEndian.Uint16(f[36:]) == 68 {
				t.Errorf("DHCP answer reached the sandbox")
			}
		}
	}
}

// Link-local (instance metadata), private networks and the host's uplink
// network are closed by default; allowOut re-opens the private ones but
// never link-local (ForbiddenRanges), not even as 0.0.0.0/0; the
// configured resolvers stay reachable on port 53 only, a link-local one
// included.
func TestInternalRangesDeniedByDefault(t *testing.T) {
	n := byte(testSeq.Add(1))
	meta := newExtHostAt(t, netip.AddrFrom4([4]byte{169, 254, n, 1}), netip.AddrFrom4([4]byte{169, 254, n, 2}))
	priv := newExtHostAt(t, netip.AddrFrom4([4]byte{172, 31, n, 1}), netip.AddrFrom4([4]byte{172, 31, n, 2}))
	pub := newExtHost(t)
	cfg := testConfig(t, 24)
	cfg.Resolvers = []netip.Addr{priv.ip, meta.ip}
	l := newTestManager(t, cfg)
	metaSrv := listen(t, meta.path, meta.ip)
	privSrv := listen(t, priv.path, priv.ip)
	pubSrv := listen(t, pub.path, pub.ip)

	s := setup(t, l, "sbxint"+randHex(2), Policy{AllowInternet: true})
	mustConnect(t, "public address", s.NetNSPath, pubSrv)
	mustFail(t, "link-local (instance metadata)", s.NetNSPath, metaSrv)
	mustFail(t, "private network (non-DNS port on the resolver)", s.NetNSPath, privSrv)

	// DNS to the resolvers: a UDP and a TCP listener on :53 in their netns.
	dnsTCP := listenAt(t, priv.path, netip.AddrPortFrom(priv.ip, 53))
	mustConnect(t, "resolver tcp/53", s.NetNSPath, dnsTCP)
	if !udpRoundTrip(t, s.NetNSPath, priv.path, netip.AddrPortFrom(priv.ip, 53)) {
		t.Fatal("resolver udp/53 unreachable")
	}
	metaDNS := listenAt(t, meta.path, netip.AddrPortFrom(meta.ip, 53))
	mustConnect(t, "link-local resolver tcp/53", s.NetNSPath, metaDNS)

	for _, allow := range [][]string{{"169.254.0.0/16", priv.ip.String()}, {"0.0.0.0/0"}} {
		if err := l.UpdatePolicy(context.Background(), s.ID, Policy{AllowInternet: true, AllowOut: allow}); err != nil {
			t.Fatal(err)
		}
		mustFail(t, fmt.Sprintf("link-local with allowOut %v", allow), s.NetNSPath, metaSrv)
		mustConnect(t, fmt.Sprintf("private address re-opened by allowOut %v", allow), s.NetNSPath, privSrv)
		mustConnect(t, fmt.Sprintf("link-local resolver tcp/53 with allowOut %v", allow), s.NetNSPath, metaDNS)
		mustConnect(t, fmt.Sprintf("public address with allowOut %v", allow), s.NetNSPath, pubSrv)
	}
	// The judgement the egress proxy asks for is the chain's.
	p := Policy{AllowInternet: true, AllowOut: []string{"0.0.0.0/0"}}
	for ip, want := range map[netip.Addr]Verdict{meta.ip: Forbidden, netip.MustParseAddr("169.254.169.254"): Forbidden,
		netip.MustParseAddr("127.0.0.1"): Forbidden, cfg.Pool.Addr().Next().Next(): Forbidden, netip.MustParseAddr("224.0.0.1"): Forbidden,
		netip.MustParseAddr("0.0.0.0"): Forbidden, priv.ip: Allowed, pub.ip: Allowed} {
		if got := l.Judge(p, ip, ByAddress); got != want {
			t.Errorf("Judge(allowOut 0.0.0.0/0, %s) = %s, want %s", ip, got, want)
		}
		if got := l.Judge(p, ip, ByName); got != want {
			t.Errorf("Judge(allowOut 0.0.0.0/0, %s, by name) = %s, want %s", ip, got, want)
		}
	}
	if got := l.Judge(p, meta.ip, ToDNS); got != Allowed {
		t.Errorf("Judge(link-local resolver, DNS) = %s", got)
	}
}

func TestMergePrefixes(t *testing.T) {
	in := []netip.Prefix{
		netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("10.1.2.0/24"),
		netip.MustParsePrefix("192.168.1.0/24"), netip.MustParsePrefix("192.168.1.0/24"),
		netip.MustParsePrefix("192.168.0.0/16"), netip.MustParsePrefix("1.2.3.4/32"),
	}
	got := mergePrefixes(in)
	want := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("192.168.0.0/16"), netip.MustParsePrefix("1.2.3.4/32")}
	if len(got) != len(want) {
		t.Fatalf("got %v want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("got %v want %v", got, want)
		}
	}
}

// udpRoundTrip sends a datagram from the netns at from to an echo server
// at ap in the netns at srvPath and reports whether the echo came back.
func udpRoundTrip(t *testing.T, from, srvPath string, ap netip.AddrPort) bool {
	t.Helper()
	var pc net.PacketConn
	if err := RunInNetns(srvPath, func() (err error) {
		pc, err = net.ListenPacket("udp", ap.String())
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	go func() {
		buf := make([]byte, 512)
		n, addr, err := pc.ReadFrom(buf)
		if err == nil {
			pc.WriteTo(buf[:n], addr)
		}
	}()
	ok := false
	err := RunInNetns(from, func() error {
		c, err := net.Dial("udp", ap.String())
		if err != nil {
			return err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(2 * time.Second))
		if _, err := c.Write([]byte("q")); err != nil {
			return err
		}
		buf := make([]byte, 16)
		n, err := c.Read(buf)
		ok = err == nil && string(buf[:n]) == "q"
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return ok
}
