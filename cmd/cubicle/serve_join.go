package main

import (
	"context"
	"crypto/tls"
	"log/slog"
	"sync"
	"time"

	"github.com/cubicle-dev/cubicle/internal/clusterpki"
	"github.com/cubicle-dev/cubicle/internal/nodejoin"
	"github.com/cubicle-dev/cubicle/internal/store"
)

// serveJoin readies POST /nodes/join: the cluster CA (made by the first
// replica that needs it) and this replica's control-plane certificate,
// which the listener presents to clients asking for
// clusterpki.JoinServerName. Without TLS there is no join: a node must
// verify the CA before it sends its token.
func serveJoin(ctx context.Context, st store.Store, sealer clusterpki.Sealer, tlsConfig *tls.Config, log *slog.Logger) (*nodejoin.Service, error) {
	if tlsConfig == nil {
		log.Info("node joins off: they need TLS (--tls-cert or --tls-self-signed)")
		return nil, nil
	}
	ca, err := clusterpki.LoadOrCreateCA(ctx, st, sealer)
	if err != nil {
		return nil, err
	}
	cp := &cpCert{ca: ca}
	if _, err := cp.get(time.Now()); err != nil {
		return nil, err
	}
	tlsConfig.GetCertificate = func(hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
		if hello.ServerName == clusterpki.JoinServerName {
			return cp.get(time.Now())
		}
		return nil, nil // the listener's own certificate
	}
	// On the cluster's server name the control plane asks for a client
	// certificate (nodes calling /nodes/* and reading /v2/). The TLS layer
	// checks only that the client holds the key; the handlers check the
	// chain and the node identity (ca.NodeID), so SDK clients on the
	// public name are never asked for one.
	base := tlsConfig.Clone()
	tlsConfig.GetConfigForClient = func(hello *tls.ClientHelloInfo) (*tls.Config, error) {
		if hello.ServerName != clusterpki.JoinServerName {
			return nil, nil
		}
		c := base.Clone()
		c.ClientAuth = tls.RequestClientCert
		return c, nil
	}
	log.Info("node joins on", "path", nodejoin.Path, "ca_pin", clusterpki.Pin(ca.Cert))
	return &nodejoin.Service{Store: st, CA: ca}, nil
}

// cpCert is this replica's control-plane certificate, reissued once a
// third of its life is left.
type cpCert struct {
	ca *clusterpki.CA
	mu sync.Mutex
	c  *tls.Certificate
}

func (p *cpCert) get(now time.Time) (*tls.Certificate, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.c == nil || now.After(p.c.Leaf.NotAfter.Add(-clusterpki.LeafValidity/3)) {
		c, err := p.ca.IssueControlPlane(now)
		if err != nil {
			return nil, err
		}
		p.c = c
	}
	return p.c, nil
}
