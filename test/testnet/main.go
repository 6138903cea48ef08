// Command cubicle-testnet is the end-to-end suites' stand-in for the
// internet: a network namespace behind a veth on the host (an address in the
// benchmarking range 198.18.0.0/15, never routed) with a DNS server that
// answers every *.test name with its own address, and HTTP (:80, :8080) and
// HTTPS (:443, any *.test name, from a CA it makes) servers that echo what
// they received as JSON. Suites start `cubicle serve --dns <dns>
// --ca-certificates <bundle>` against it, so sandboxes resolve and trust it.
//
// UDP on <addr>:443 and :8080 is echoed ("echo " and the datagram), as a
// stand-in for QUIC.
//
// It also runs a SOCKS5 server on <addr>:1080 (CONNECT to IPv4 or domain
// targets; with --socks-user/--socks-pass it requires exactly those RFC 1929
// credentials, else no auth). It resolves names with the DNS records above and
// dials from inside the namespace, so tunnelled requests reach the echo
// servers from the fixture's own address ("remote" in the echo). Every
// CONNECT is logged, and GET http://<addr>:8081/socks-log returns the log as a
// JSON array, oldest first, at most 1000 entries: {"time", "client", "user",
// "target" (as asked), "addr" (resolved, when it was), "error" (when it
// failed)}.
//
// It prints one JSON line when ready (Ready; "socks" is the SOCKS address,
// "socksLog" the log's URL). Then stdin is a line protocol, one answer line
// on stdout per line read: "socks stop" closes the SOCKS listener and cuts its
// tunnels, "socks start" reopens it; each answers "ok" (also when already
// in that state) or "error: ...", "dns queries" answers how many DNS
// queries its server has received, anything else "error: unknown command". It
// runs until stdin closes or it gets SIGTERM/SIGINT, then removes the
// namespace, the veth and its files.
//
// With --attach-netns NAME the host end of the veth (and "hostAddr") is in
// the existing namespace /run/netns/NAME instead of the root one, so a
// `cubicle serve` run inside NAME (a test's stand-in for a host with its own
// firewall) reaches the fixture; the /30 is one that neither the root nor
// NAME uses. NAME itself is left alone (attach.go).
package main

import (
	"bufio"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"flag"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/miekg/dns"

	"github.com/cubicle-dev/cubicle/internal/network"
)

type records map[string]string

func (r records) String() string { return fmt.Sprint(map[string]string(r)) }
func (r records) Set(v string) error {
	name, ip, ok := strings.Cut(v, "=")
	if _, err := netip.ParseAddr(ip); !ok || err != nil {
		return fmt.Errorf("want name=IPv4, got %q", v)
	}
	r[dns.Fqdn(strings.ToLower(name))] = ip
	return nil
}

// Ready is what the fixture prints.
type Ready struct {
	Netns    string `json:"netns"`
	HostAddr string `json:"hostAddr"`
	Addr     string `json:"addr"`
	DNS      string `json:"dns"`
	CACert   string `json:"caCert"`
	// CABundle is the machine's CA bundle plus CACert, for --ca-certificates.
	CABundle string `json:"caBundle"`
	Socks    string `json:"socks"`    // SOCKS5 server, addr:1080
	SocksLog string `json:"socksLog"` // http://addr:8081/socks-log
	// AttachNetns is --attach-netns: the namespace HostAddr is in (omitted for the root).
	AttachNetns string `json:"attachNetns,omitempty"`
}

func main() {
	dir := flag.String("dir", "", "where to write the CA (default: a new temp dir, removed at exit)")
	recs := records{}
	flag.Var(recs, "record", "name=IP: answer this name with IP instead of the fixture's address (repeatable)")
	socksUser := flag.String("socks-user", "", "SOCKS5: require this user name (RFC 1929; default: no auth)")
	socksPass := flag.String("socks-pass", "", "SOCKS5: require this password (RFC 1929; default: no auth)")
	attach := flag.String("attach-netns", "", "put the veth's host end in this existing network namespace (/run/netns/NAME) instead of the root one")
	flag.Parse()
	if err := run(*dir, recs, *socksUser, *socksPass, hostSide{netns: *attach}); err != nil {
		fmt.Fprintln(os.Stderr, "cubicle-testnet:", err)
		os.Exit(1)
	}
}

func sh(args ...string) error {
	out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s: %v: %s", strings.Join(args, " "), err, out)
	}
	return nil
}

// freeSlash30 picks a /30 in 198.18.128.0/17 that no interface on the host
// side (see hostSide.usedPrefixes) overlaps.
func freeSlash30(side hostSide) (host, peer netip.Addr, err error) {
	used, err := side.usedPrefixes()
	if err != nil {
		return netip.Addr{}, netip.Addr{}, err
	}
	for range 64 {
		b := make([]byte, 2)
		_, _ = rand.Read(b)
		base := netip.AddrFrom4([4]byte{198, 18, 128 | b[0]&0x7f, b[1] &^ 3})
		cand := netip.PrefixFrom(base, 30)
		free := true
		for _, p := range used {
			free = free && !p.Overlaps(cand)
		}
		if free {
			return base.Next(), base.Next().Next(), nil
		}
	}
	return netip.Addr{}, netip.Addr{}, errNoSlash30
}

func run(dir string, recs records, socksUser, socksPass string, side hostSide) (err error) {
	var cleanup []func()
	defer func() {
		for i := len(cleanup) - 1; i >= 0; i-- {
			cleanup[i]()
		}
	}()
	if dir == "" {
		if dir, err = os.MkdirTemp("", "cubicle-testnet-"); err != nil {
			return err
		}
		cleanup = append(cleanup, func() { os.RemoveAll(dir) })
	}
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	name := fmt.Sprintf("cbtn%x", b)
	if err := side.check(); err != nil {
		return err
	}
	hostAddr, addr, err := freeSlash30(side)
	if err != nil {
		return err
	}
	if err := sh("ip", "netns", "add", name); err != nil {
		return err
	}
	cleanup = append(cleanup, func() { _ = sh("ip", "netns", "del", name) })
	if err := sh(side.ip("link", "add", name, "type", "veth", "peer", "name", "eth0", "netns", name)...); err != nil {
		return err
	}
	// Also gone with either namespace; deleting it first is harmless then.
	cleanup = append(cleanup, func() { _ = sh(side.ip("link", "del", name)...) })
	for _, c := range [][]string{
		side.ip("addr", "add", hostAddr.String()+"/30", "dev", name),
		side.ip("link", "set", name, "up"),
		{"ip", "-n", name, "addr", "add", addr.String() + "/30", "dev", "eth0"},
		{"ip", "-n", name, "link", "set", "eth0", "up"},
		{"ip", "-n", name, "link", "set", "lo", "up"},
	} {
		if err := sh(c...); err != nil {
			return err
		}
	}
	ca, caKey, err := makeCA()
	if err != nil {
		return err
	}
	caPath := filepath.Join(dir, "testnet-ca.pem")
	caPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.Raw})
	if err := os.WriteFile(caPath, caPEM, 0o644); err != nil {
		return err
	}
	host, _ := os.ReadFile("/etc/ssl/certs/ca-certificates.crt")
	bundle := filepath.Join(dir, "testnet-bundle.pem")
	if err := os.WriteFile(bundle, append(append(host, '\n'), caPEM...), 0o644); err != nil {
		return err
	}

	// Sockets opened in the namespace stay there; they are served from here.
	nsPath := "/run/netns/" + name
	var udp, udp443, udp8080 net.PacketConn
	var tcp53, l80, l443, l8080 net.Listener
	if err := network.RunInNetns(nsPath, func() error {
		var err error
		if udp, err = net.ListenPacket("udp", addr.String()+":53"); err != nil {
			return err
		}
		listen := func(port int) (net.Listener, error) { return net.Listen("tcp", fmt.Sprintf("%s:%d", addr, port)) }
		if udp443, err = net.ListenPacket("udp", addr.String()+":443"); err != nil {
			return err
		}
		if udp8080, err = net.ListenPacket("udp", addr.String()+":8080"); err != nil {
			return err
		}
		if tcp53, err = listen(53); err != nil {
			return err
		}
		if l80, err = listen(80); err != nil {
			return err
		}
		if l443, err = listen(443); err != nil {
			return err
		}
		l8080, err = listen(8080)
		return err
	}); err != nil {
		return err
	}
	// lookup is the fixture's name table, for its DNS and its SOCKS server.
	lookup := func(name string) (string, bool) {
		n := dns.Fqdn(strings.ToLower(name))
		ip, ok := recs[n]
		if !ok && (n == "test." || strings.HasSuffix(n, ".test.")) {
			ip, ok = addr.String(), true
		}
		return ip, ok
	}
	var dnsQueries atomic.Int64
	dnsH := dns.HandlerFunc(func(w dns.ResponseWriter, q *dns.Msg) {
		dnsQueries.Add(1)
		m := new(dns.Msg)
		m.SetReply(q)
		for _, qq := range q.Question {
			ip, ok := lookup(qq.Name)
			if !ok {
				m.Rcode = dns.RcodeNameError
				continue
			}
			if qq.Qtype == dns.TypeA {
				m.Answer = append(m.Answer, &dns.A{Hdr: dns.RR_Header{Name: qq.Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 5}, A: net.ParseIP(ip)})
			}
		}
		_ = w.WriteMsg(m)
	})
	servers := []*dns.Server{{PacketConn: udp, Handler: dnsH}, {Listener: tcp53, Handler: dnsH}}
	for _, s := range servers {
		go func() { _ = s.ActivateAndServe() }()
		cleanup = append(cleanup, func() { _ = s.Shutdown() })
	}
	for _, pc := range []net.PacketConn{udp443, udp8080} {
		go serveUDPEcho(pc)
		cleanup = append(cleanup, func() { pc.Close() })
	}
	leaves := &leafCache{ca: ca, key: caKey, m: map[string]*tls.Certificate{}}
	echo := http.HandlerFunc(serveEcho)
	for _, l := range []net.Listener{l80, l8080, l443} {
		srv := &http.Server{Handler: echo, ReadHeaderTimeout: 10 * time.Second}
		if l == l443 {
			// HTTP/2 and HTTP/1.1, a certificate for whatever name is asked.
			srv.TLSConfig = &tls.Config{GetCertificate: leaves.get}
			go func() { _ = srv.ServeTLS(l, "", "") }()
		} else {
			go func() { _ = srv.Serve(l) }()
		}
		cleanup = append(cleanup, func() { srv.Close() })
	}
	socks, err := newSocksServer(nsPath, addr, socksUser, socksPass, lookup)
	if err != nil {
		return err
	}
	if err := socks.start(); err != nil {
		return err
	}
	cleanup = append(cleanup, socks.stop)
	lLog, err := listenInNetns(nsPath, fmt.Sprintf("%s:%d", addr, socksLogPort))
	if err != nil {
		return err
	}
	logSrv := &http.Server{Handler: http.HandlerFunc(socks.serveLog), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = logSrv.Serve(lLog) }()
	cleanup = append(cleanup, func() { logSrv.Close() })

	ready, _ := json.Marshal(Ready{Netns: name, AttachNetns: side.netns, HostAddr: hostAddr.String(), Addr: addr.String(), DNS: addr.String(), CACert: caPath, CABundle: bundle,
		Socks: socks.listenAddr, SocksLog: fmt.Sprintf("http://%s:%d/socks-log", addr, socksLogPort)})
	fmt.Println(string(ready))

	done := make(chan struct{}, 2)
	go func() {
		sc := bufio.NewScanner(os.Stdin)
		for sc.Scan() {
			if strings.Join(strings.Fields(sc.Text()), " ") == "dns queries" {
				fmt.Println(dnsQueries.Load())
				continue
			}
			fmt.Println(socks.control(sc.Text()))
		}
		done <- struct{}{}
	}()
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	go func() { <-sig; done <- struct{}{} }()
	<-done
	return nil
}

// serveUDPEcho answers each datagram with "echo " and its payload (QUIC
// stands in: a test sees whether UDP leaves a sandbox).
func serveUDPEcho(pc net.PacketConn) {
	buf := make([]byte, 2048)
	for {
		n, from, err := pc.ReadFrom(buf)
		if err != nil {
			return
		}
		_, _ = pc.WriteTo(append([]byte("echo "), buf[:n]...), from)
	}
}

// serveEcho answers with what it received, so tests see the Host, SNI and
// headers a request arrived with.
//
// With ?sha256=<Header> it answers only {"sha256": hex of that header's
// value, "present": bool}: a test can check a secret a proxy added without
// the value ever reaching the client (the sandbox).
func serveEcho(w http.ResponseWriter, r *http.Request) {
	if h := r.URL.Query().Get("sha256"); h != "" {
		sum := sha256.Sum256([]byte(r.Header.Get(h)))
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{"sha256": hex.EncodeToString(sum[:]), "present": len(r.Header.Values(h)) > 0})
		return
	}
	e := map[string]any{
		"host": r.Host, "method": r.Method, "path": r.URL.RequestURI(), "proto": r.Proto,
		"headers": r.Header, "remote": r.RemoteAddr, "tls": r.TLS != nil,
	}
	if r.TLS != nil {
		e["sni"] = r.TLS.ServerName
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(e)
}

func makeCA() (*x509.Certificate, *ecdsa.PrivateKey, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: "cubicle-testnet CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, err
	}
	c, err := x509.ParseCertificate(der)
	return c, key, err
}

type leafCache struct {
	ca  *x509.Certificate
	key *ecdsa.PrivateKey
	mu  sync.Mutex
	m   map[string]*tls.Certificate
}

// get mints a certificate for any SNI (an IP literal when there is none).
func (l *leafCache) get(hi *tls.ClientHelloInfo) (*tls.Certificate, error) {
	name := hi.ServerName
	l.mu.Lock()
	defer l.mu.Unlock()
	if c := l.m[name]; c != nil {
		return c, nil
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	if name != "" {
		tmpl.DNSNames = []string{name}
	} else if a, _, err := net.SplitHostPort(hi.Conn.LocalAddr().String()); err == nil {
		tmpl.IPAddresses = []net.IP{net.ParseIP(a)}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, l.ca, &key.PublicKey, l.key)
	if err != nil {
		return nil, err
	}
	c := &tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
	l.m[name] = c
	return c, nil
}
