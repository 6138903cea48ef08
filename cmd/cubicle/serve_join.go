package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/cubicle-dev/cubicle/internal/clusterpki"
	"github.com/cubicle-dev/cubicle/internal/dataplane"
	"github.com/cubicle-dev/cubicle/internal/node"
	"github.com/cubicle-dev/cubicle/internal/nodejoin"
	"github.com/cubicle-dev/cubicle/internal/nodeset"
	"github.com/cubicle-dev/cubicle/internal/proxy"
	"github.com/cubicle-dev/cubicle/internal/store"
)

// serveJoin readies POST /nodes/join: the cluster CA (made by the first
// replica that needs it) and this replica's control-plane certificate,
// which the listener presents to clients asking for
// clusterpki.JoinServerName. Without TLS there is no join: a node must
// verify the CA before it sends its token. The returned certificate is
// also the one this replica dials nodes with (nil without TLS).
func serveJoin(ctx context.Context, st store.Store, sealer clusterpki.Sealer, tlsConfig *tls.Config, log *slog.Logger) (*nodejoin.Service, *cpCert, error) {
	if tlsConfig == nil {
		log.Info("node joins off: they need TLS (--tls-cert or --tls-self-signed)")
		return nil, nil, nil
	}
	ca, err := clusterpki.LoadOrCreateCA(ctx, st, sealer)
	if err != nil {
		return nil, nil, err
	}
	// Revocations at the dial are cached for at most a heartbeat interval:
	// a forget holds for new connections to the node within it.
	cp := &cpCert{ca: ca, revs: clusterpki.NewRevocationCache(st, nodeHeartbeatInterval)}
	if _, err := cp.get(time.Now()); err != nil {
		return nil, nil, err
	}
	tlsConfig.GetCertificate = func(hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
		if hello.ServerName == clusterpki.JoinServerName {
			return cp.get(time.Now())
		}
		return nil, nil // the listener's own certificate
	}
	// On the cluster server name only, a client certificate from the
	// cluster CA is asked for (verified if given): the node calls
	// (/nodes/register...) and registry reads (/v2/) are authenticated by
	// it, and joins, which have none yet, still pass. SDK clients on the
	// API's name are never asked.
	roots := x509.NewCertPool()
	roots.AddCert(ca.Cert)
	base := tlsConfig.Clone()
	tlsConfig.GetConfigForClient = func(hello *tls.ClientHelloInfo) (*tls.Config, error) {
		if hello.ServerName != clusterpki.JoinServerName {
			return nil, nil
		}
		c := base.Clone()
		c.ClientAuth = tls.VerifyClientCertIfGiven
		c.ClientCAs = roots
		return c, nil
	}
	log.Info("node joins on", "path", nodejoin.Path, "ca_pin", clusterpki.Pin(ca.Cert))
	return &nodejoin.Service{Store: st, CA: ca}, cp, nil
}

// nodeSet is the nodes serve's control plane drives: the in-process node
// (nd, named nodeID; nil for a pure control plane) and, when there is a
// cluster identity (cp: serve has TLS), every node registered in st,
// dialled with cp's certificate. Without TLS no remote node can join, so
// the set is the in-process node alone.
func nodeSet(st store.Store, nodeID string, nd node.Node, cp *cpCert) *nodeset.Set {
	cfg := nodeset.Config{LocalID: nodeID, Local: nd}
	if cp != nil {
		cfg.Registry, cfg.CA, cfg.Revocations = st, cp.ca.Cert, cp.revs
		cfg.Certificate = func() (*tls.Certificate, error) { return cp.get(time.Now()) }
	}
	return nodeset.New(cfg)
}

// nodeRoutes is how the proxy reaches sandboxes on remote nodes, and the
// volume-content API their volumes: through their data planes, with this
// replica's control-plane identity. Without a cluster identity (no TLS)
// there are no remote nodes, and nil keeps the embedded proxy's direct
// dial and the content API's direct reads.
func nodeRoutes(st store.Store, o serveOptions, cp *cpCert) (*proxy.NodeRoutes, *dataplane.VolumeProxy, error) {
	if cp == nil {
		return nil, nil, nil
	}
	dialer, err := dataplane.NewClientFunc(func() (*tls.Certificate, error) { return cp.get(time.Now()) }, cp.ca.Cert, cp.revs)
	if err != nil {
		return nil, nil, err
	}
	local := ""
	if o.embeddedNode {
		local = o.nodeID
	}
	dataAddress := func(ctx context.Context, nodeID string) (string, error) {
		n, err := st.GetNode(ctx, nodeID)
		if err != nil {
			return "", err
		}
		if n.DataAddress == "" {
			return "", fmt.Errorf("node %s: %w", nodeID, nodeset.ErrNoAddress)
		}
		return n.DataAddress, nil
	}
	return &proxy.NodeRoutes{Local: local, Dialer: dialer, DataAddress: dataAddress},
		dataplane.NewVolumeProxy(dialer, dataAddress), nil
}

// clusterFlags checks serve's node flags: a pure control plane
// (--embedded-node=false) serves only remote nodes, which need TLS to
// join and to be dialled.
func clusterFlags(o *serveOptions) error {
	if err := clusterpki.ValidateNodeID(o.nodeID); err != nil {
		return fmt.Errorf("--node-id: %w", err)
	}
	// Overcommit acts on capacity reservations, made with
	// --reserve-capacity or for remote nodes, which need TLS to join.
	if o.cpuOvercommit > 1 && !o.reserveCapacity && o.tlsCert == "" && !o.tlsSelfSigned {
		return errors.New("--cpu-overcommit acts on capacity reservations: add --reserve-capacity, or serve TLS so remote nodes can join")
	}
	if !o.embeddedNode && o.buildkitd != "" && o.buildkitd != "off" {
		return fmt.Errorf("--buildkitd %q: a pure control plane (--embedded-node=false) runs no buildkitd; builds with steps go to nodes labelled builder=true (give --buildkitd to their `cubicle node run`), or --buildkitd off turns them off", o.buildkitd)
	}
	if o.publishBuiltins && o.tlsCert == "" && !o.tlsSelfSigned {
		return errors.New("--publish-builtins: this server has no node registry (nodes join only over TLS: add --tls-cert/--tls-key or --tls-self-signed)")
	}
	if !o.embeddedNode && o.tlsCert == "" && !o.tlsSelfSigned {
		return errors.New("--embedded-node=false needs TLS (--tls-cert/--tls-key or --tls-self-signed): remote nodes join and are dialled with the cluster's mTLS identities")
	}
	return nil
}

// cpCert is this replica's control-plane certificate, reissued once a
// third of its life is left.
type cpCert struct {
	ca   *clusterpki.CA
	revs clusterpki.Revocations // the nodes', checked when dialling them
	mu   sync.Mutex
	c    *tls.Certificate
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
