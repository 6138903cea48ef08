// Package dataplanetest gives tests and benchmarks real cluster
// identities (a cluster CA in a throwaway SQLite store, the control
// plane's certificate, nodes' certificates issued from CSRs as a join
// does) and a data-plane server on loopback.
package dataplanetest

import (
	"errors"
	"net"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/clusterpki/pkitest"
	"github.com/cubicle-dev/cubicle/internal/dataplane"
)

// PKI is a cluster CA with the control plane's certificate
// (pkitest's), and data-plane clients and servers made from it.
type PKI struct{ *pkitest.PKI }

// NewPKI makes a cluster CA the way a control plane does on first start.
func NewPKI(tb testing.TB) *PKI { return &PKI{pkitest.New(tb)} }

// Client is a data-plane client with the control plane's identity,
// reading the revocations from Store with no cache.
func (p *PKI) Client(tb testing.TB) *dataplane.Client {
	tb.Helper()
	c, err := dataplane.NewClient(p.ControlPlane, p.CA.Cert, p.Store)
	if err != nil {
		tb.Fatal(err)
	}
	return c
}

// Serve runs node id's data-plane server on a loopback port with cfg
// (Cert and CA are filled in) and returns its address; the server is
// closed, and Serve's result checked, at cleanup.
func (p *PKI) Serve(tb testing.TB, id string, cfg dataplane.ServerConfig) (addr string, srv *dataplane.Server) {
	tb.Helper()
	return p.ServeAfter(tb, id, time.Time{}, cfg)
}

// ServeAfter is Serve with a certificate from NodeAfter.
func (p *PKI) ServeAfter(tb testing.TB, id string, revokedAt time.Time, cfg dataplane.ServerConfig) (addr string, srv *dataplane.Server) {
	tb.Helper()
	cfg.Cert, cfg.CA = pkitest.NodeCertAfter(tb, p.CA, id, revokedAt, "127.0.0.1"), p.CA.Cert
	srv, err := dataplane.NewServer(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	tb.Cleanup(func() {
		srv.Close()
		if err := <-done; !errors.Is(err, dataplane.ErrServerClosed) {
			tb.Errorf("Serve: %v", err)
		}
	})
	return ln.Addr().String(), srv
}
