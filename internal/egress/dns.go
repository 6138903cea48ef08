package egress

import (
	"encoding/binary"
	"errors"
	"io"
	"net"
	"net/netip"
	"strings"
	"sync"
	"time"

	"github.com/miekg/dns"

	"github.com/cubicle-dev/cubicle/internal/network"
)

// DNS for sandboxes with an upstream proxy (network.egressProxy). Nothing of
// theirs leaves the host except through the upstream, so their DNS is never
// forwarded: nftables redirects their UDP and TCP to port 53 here, and an A
// query is answered with an address from fakeNet that stands for the name.
// Every TCP connection of such a sandbox comes to the proxy anyway, which
// turns the address back into the name and has the upstream resolve it
// (SOCKS5 remote DNS). Other query types get an empty answer; with
// dnsServers [] (no resolvers) every query is refused.

// fakeNet is where the stand-in addresses are (in the benchmarking range,
// never routed); they mean something only to the sandbox that asked.
var fakeNet = netip.MustParsePrefix("198.18.0.0/17")

const (
	// maxFakeNames bounds a sandbox's table: past it the oldest name's
	// address is handed out again (the TTL keeps that rare).
	maxFakeNames = 4096
	fakeTTL      = 30
	// maxDNSPerConn bounds the queries on one TCP connection.
	maxDNSPerConn = 64
)

type fakeTable struct {
	src   netip.Addr // the sandbox's address, to drop the table once it is gone
	names map[string]netip.Addr
	addrs map[netip.Addr]string
	next  uint32
}

type fakeDNS struct {
	mu     sync.Mutex
	tables map[string]*fakeTable // by sandbox ID
}

// addr returns the stand-in address of name for sandbox id (at src).
func (p *Proxy) fakeAddr(id string, src netip.Addr, name string) netip.Addr {
	f := &p.fake
	f.mu.Lock()
	defer f.mu.Unlock()
	t := f.tables[id]
	if t == nil || t.src != src {
		// A new sandbox: forget those that are gone, so the tables stay
		// as many as the live sandboxes that use them.
		for oid, ot := range f.tables {
			if lid, _, ok := p.pol.SandboxPolicy(ot.src); !ok || lid != oid {
				delete(f.tables, oid)
			}
		}
		t = &fakeTable{src: src, names: map[string]netip.Addr{}, addrs: map[netip.Addr]string{}}
		if f.tables == nil {
			f.tables = map[string]*fakeTable{}
		}
		f.tables[id] = t
	}
	if a, ok := t.names[name]; ok {
		return a
	}
	base := fakeNet.Addr().As4()
	var b4 [4]byte
	binary.BigEndian.PutUint32(b4[:], binary.BigEndian.Uint32(base[:])+1+t.next%maxFakeNames)
	a := netip.AddrFrom4(b4)
	t.next++
	if old, ok := t.addrs[a]; ok {
		delete(t.names, old)
	}
	t.names[name], t.addrs[a] = a, name
	return a
}

// fakeName is the name sandbox id resolved to a, if any.
func (p *Proxy) fakeName(id string, a netip.Addr) string {
	p.fake.mu.Lock()
	defer p.fake.mu.Unlock()
	if t := p.fake.tables[id]; t != nil {
		return t.addrs[a]
	}
	return ""
}

// answerDNS answers query q from the sandbox at src, locally.
func (p *Proxy) answerDNS(src netip.Addr, q *dns.Msg) *dns.Msg {
	m := new(dns.Msg)
	m.SetReply(q)
	m.RecursionAvailable = true
	id, pol, ok := p.pol.SandboxPolicy(src)
	if !ok || !pol.Tunnels() || (pol.HasDomains() && pol.DNSServers != nil && len(*pol.DNSServers) == 0) ||
		q.Opcode != dns.OpcodeQuery || len(q.Question) != 1 || q.Question[0].Qclass != dns.ClassINET {
		m.Rcode = dns.RcodeRefused
		return m
	}
	qq := q.Question[0]
	name := strings.TrimSuffix(strings.ToLower(qq.Name), ".")
	if _, err := network.ParseDomain(name); err != nil || strings.HasPrefix(name, "*.") {
		m.Rcode = dns.RcodeNameError
		return m
	}
	if qq.Qtype == dns.TypeA {
		m.Answer = []dns.RR{&dns.A{Hdr: dns.RR_Header{Name: qq.Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: fakeTTL},
			A: p.fakeAddr(id, src, name).AsSlice()}}
	}
	return m
}

// WithDNS has the proxy answer, on pc (UDP, the proxy's port on the
// gateway), the DNS of sandboxes with an upstream proxy.
func WithDNS(pc net.PacketConn) Option {
	return func(p *Proxy) { p.dnsConn = pc }
}

// serveDNS answers UDP queries on pc until it is closed.
func (p *Proxy) serveDNS(pc net.PacketConn) {
	buf := make([]byte, dns.MaxMsgSize)
	for {
		n, from, err := pc.ReadFrom(buf)
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return
		}
		src, err := netip.ParseAddrPort(from.String())
		if err != nil {
			continue
		}
		q := new(dns.Msg)
		if q.Unpack(buf[:n]) != nil || q.Response {
			continue
		}
		m := p.answerDNS(src.Addr().Unmap(), q)
		m.Truncate(dns.MinMsgSize)
		if out, err := m.Pack(); err == nil {
			_, _ = pc.WriteTo(out, from)
		}
	}
}

// serveDNSTCP answers DNS over a sandbox's TCP connection to port 53:
// each message within its 16-bit length and peekTimeout.
func (p *Proxy) serveDNSTCP(c net.Conn, r io.Reader, src netip.Addr, b *budget) {
	for range maxDNSPerConn {
		release := p.reserve(b, dns.MaxMsgSize)
		if release == nil {
			return
		}
		deadline(c, true)
		var n uint16
		err := binary.Read(r, binary.BigEndian, &n)
		var msg []byte
		if err == nil {
			msg = make([]byte, n)
			_, err = io.ReadFull(r, msg)
		}
		release()
		if err != nil {
			return
		}
		q := new(dns.Msg)
		if q.Unpack(msg) != nil || q.Response {
			return
		}
		out, err := p.answerDNS(src, q).Pack()
		if err != nil {
			return
		}
		_ = c.SetWriteDeadline(time.Now().Add(peekTimeout))
		if _, err := c.Write(append(binary.BigEndian.AppendUint16(nil, uint16(len(out))), out...)); err != nil {
			return
		}
	}
}
