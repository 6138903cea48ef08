package egress

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"

	"golang.org/x/net/proxy"

	"github.com/cubicle-dev/cubicle/internal/network"
)

// ErrUpstream: the sandbox's SOCKS5 egress proxy could not be reached or
// refused the connection. The sandbox's connection is closed: egress fails
// closed, never falling back to a direct dial.
var ErrUpstream = errors.New("egress: upstream proxy")

// dialUpstream opens target ("host:port"; a name is resolved by the proxy,
// SOCKS5 ATYP domain) through u. The proxy's own address is resolved and
// judged at each dial (Policies.ResolveUpstream) and the connection pinned
// to the address that was judged.
func (p *Proxy) dialUpstream(ctx context.Context, u *network.Upstream, target string) (net.Conn, error) {
	var auth *proxy.Auth
	if u.Username != "" {
		auth = &proxy.Auth{User: u.Username, Password: u.Password}
	}
	d, err := proxy.SOCKS5("tcp", u.Address, auth, upstreamDialer{p: p, u: u})
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrUpstream, err)
	}
	c, err := d.(proxy.ContextDialer).DialContext(ctx, "tcp", target)
	if err != nil {
		return nil, fmt.Errorf("%w %s: %v", ErrUpstream, u.Address, err)
	}
	return c, nil
}

// upstreamDialer reaches the SOCKS5 server itself: at an address
// ResolveUpstream allows, over TLS when u asks for it.
type upstreamDialer struct {
	p *Proxy
	u *network.Upstream
}

func (d upstreamDialer) Dial(nw, addr string) (net.Conn, error) {
	return d.DialContext(context.Background(), nw, addr)
}

func (d upstreamDialer) DialContext(ctx context.Context, _, _ string) (net.Conn, error) {
	addrs, err := d.p.pol.ResolveUpstream(ctx, d.u.Address)
	if err != nil {
		return nil, err
	}
	var c net.Conn
	for _, a := range addrs {
		if c, err = d.p.dialer.DialContext(ctx, "tcp", a.String()); err == nil {
			break
		}
	}
	if c == nil {
		return nil, err
	}
	if d.u.TLS == nil {
		return c, nil
	}
	cfg := &tls.Config{ServerName: d.u.TLS.ServerName, MinVersion: tls.VersionTLS12}
	if cfg.ServerName == "" {
		cfg.ServerName, _, _ = net.SplitHostPort(d.u.Address)
	}
	if d.u.TLS.CACert != "" {
		cfg.RootCAs = x509.NewCertPool()
		cfg.RootCAs.AppendCertsFromPEM([]byte(d.u.TLS.CACert))
	} else if d.p.icpt != nil {
		cfg.RootCAs = d.p.icpt.roots
	}
	tc := tls.Client(c, cfg)
	if err := tc.HandshakeContext(ctx); err != nil {
		c.Close()
		return nil, fmt.Errorf("TLS to the proxy: %w", err)
	}
	return tc, nil
}
