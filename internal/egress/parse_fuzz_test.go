package egress

import (
	"bufio"
	"bytes"
	"net/http"
	"net/netip"
	"testing"

	"github.com/miekg/dns"

	"github.com/cubicle-dev/cubicle/internal/network"
)

// countingReader counts what the parsers pull from the sandbox's stream.
type countingReader struct {
	r *bytes.Reader
	n int
}

func (c *countingReader) Read(b []byte) (int, error) {
	n, err := c.r.Read(b)
	c.n += n
	return n, err
}

// FuzzRequestHeads drives the plain-HTTP relay's reading of a kept-alive
// stream: each head is read within maxHeaderSize (plus the read-ahead
// buffer), the bodies are drained as the relay streams them.
func FuzzRequestHeads(f *testing.F) {
	f.Add([]byte("GET / HTTP/1.1\r\nHost: a.test\r\n\r\nGET /2 HTTP/1.1\r\nHost: a.test\r\nX: " + string(bytes.Repeat([]byte("a"), 70<<10))))
	f.Add([]byte("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\n\r\nabcGET / HTTP/1.1\r\nHost: a\r\n\r\n"))
	f.Add([]byte("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		src := &countingReader{r: bytes.NewReader(data)}
		lim := &limited{r: src, n: maxHeaderSize}
		cr := bufio.NewReaderSize(lim, readBuf)
		for i := 0; i < 64; i++ {
			before := src.n - cr.Buffered()
			lim.n = maxHeaderSize
			req, err := http.ReadRequest(cr)
			lim.n = -1
			if used := src.n - before; used > maxHeaderSize+readBuf {
				t.Fatalf("a head took %d bytes of the stream, over %d", used, maxHeaderSize+readBuf)
			}
			if err != nil {
				return
			}
			if err := req.Write(discard{}); err != nil {
				return
			}
		}
	})
}

type discard struct{}

func (discard) Write(b []byte) (int, error) { return len(b), nil }

// FuzzServerName: the SNI peek reads at most maxHelloSize of the stream
// and never panics.
func FuzzServerName(f *testing.F) {
	f.Add([]byte{0x16, 0x03, 0x01, 0x00, 0x05, 0x01, 0x00, 0x00, 0x01, 0x00})
	f.Add(append([]byte{0x16, 0x03, 0x01, 0xff, 0xff}, bytes.Repeat([]byte{1}, 80<<10)...))
	f.Fuzz(func(t *testing.T, data []byte) {
		src := &countingReader{r: bytes.NewReader(data)}
		_ = serverName(&limited{r: src, n: maxHelloSize})
		if src.n > maxHelloSize {
			t.Fatalf("the ClientHello peek read %d bytes", src.n)
		}
	})
}

// tunnelled is the Policies of one sandbox with an upstream proxy, for the
// DNS fuzz target: answerDNS asks nothing else.
type tunnelled struct{ Policies }

func (tunnelled) SandboxPolicy(netip.Addr) (string, network.Policy, bool) {
	return "fuzz", network.Policy{AllowInternet: true, Upstream: &network.Upstream{Address: "198.51.100.1:1080"}}, true
}

// FuzzDNSQuery: whatever a tunnelled sandbox sends as a DNS query, the
// answer is made locally, packs, and holds at most one stand-in address.
func FuzzDNSQuery(f *testing.F) {
	m := new(dns.Msg)
	m.SetQuestion("a.test.", dns.TypeA)
	q, _ := m.Pack()
	f.Add(q)
	m.SetQuestion("a.test.", dns.TypeAAAA)
	q, _ = m.Pack()
	f.Add(q)
	p := &Proxy{pol: tunnelled{}}
	f.Fuzz(func(t *testing.T, data []byte) {
		q := new(dns.Msg)
		if q.Unpack(data) != nil {
			return
		}
		r := p.answerDNS(netip.MustParseAddr("10.0.0.2"), q)
		if _, err := r.Pack(); err != nil {
			t.Fatalf("answer does not pack: %v", err)
		}
		if len(r.Answer) > 1 {
			t.Fatalf("%d answers", len(r.Answer))
		}
		for _, rr := range r.Answer {
			a, ok := rr.(*dns.A)
			if !ok {
				t.Fatalf("answer %v is not an A record", rr)
			}
			if ip, _ := netip.AddrFromSlice(a.A.To4()); !fakeNet.Contains(ip) {
				t.Fatalf("answer %v is not a stand-in address", rr)
			}
		}
	})
}
