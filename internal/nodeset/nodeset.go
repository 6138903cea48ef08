// Package nodeset is the control plane's view of its nodes: the optional
// in-process node and the remote ones in the registry, each behind
// node.Node. Remote nodes are dialled lazily over gRPC with the control
// plane's mTLS identity; one connection per node ID is kept, re-dialled
// when the node's registered address changes and closed when its row is
// forgotten.
package nodeset

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/cubicle-dev/cubicle/internal/clusterpki"
	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/node"
	"github.com/cubicle-dev/cubicle/internal/node/nodegrpc"
	"github.com/cubicle-dev/cubicle/internal/store"
)

// ErrUnknownNode: no node of that ID is in the set (not the local node,
// and no registry row). It is in errdefs' NotFound class.
var ErrUnknownNode = errdefs.NewReason(errdefs.ErrNotFound, "nodeset_unknown_node", "unknown node")

// ErrNoAddress: the node's row has no gRPC address to dial (registered by
// something that is not a node agent). Unavailable class: another node may
// serve the request.
var ErrNoAddress = errdefs.NewReason(errdefs.ErrUnavailable, "nodeset_no_address", "node has no address")

// ErrNoIdentity: the set has remote nodes to dial but no control-plane
// certificate (serve runs without TLS).
var ErrNoIdentity = errdefs.NewReason(errdefs.ErrUnavailable, "nodeset_no_identity", "no control-plane certificate to dial nodes with (serve needs TLS)")

// Registry is the part of the store the set reads.
type Registry interface {
	GetNode(ctx context.Context, id string) (*store.Node, error)
	ListNodes(ctx context.Context) ([]*store.Node, error)
}

// Config builds a Set.
type Config struct {
	// LocalID and Local are the in-process node; Local nil = none (a
	// pure control plane).
	LocalID string
	Local   node.Node
	// Registry holds the remote nodes' rows; nil = only the local node.
	Registry Registry
	// Certificate is the control plane's client certificate (called at
	// each handshake, so a reissued one is used at once); CA is the
	// cluster CA every node's certificate must chain to.
	Certificate func() (*tls.Certificate, error)
	CA          *x509.Certificate
	// Revocations is checked at every handshake with a node: a node whose
	// certificate predates its ID's last forget is refused
	// (clusterpki.RefuseRevoked). Required with Certificate; pass a
	// clusterpki.RevocationCache over the store.
	Revocations clusterpki.Revocations
	// DialOptions are added to every dial (tests).
	DialOptions []grpc.DialOption
	// Dial replaces the gRPC dial (Certificate, CA and DialOptions are
	// then unused): it connects to a registered node, returning the node
	// and what closes the connection. Tests and simulations answer nodes
	// in-process with it.
	Dial func(row *store.Node) (node.Node, io.Closer, error)
}

// Set is the nodes the control plane drives. Safe for concurrent use.
type Set struct {
	cfg Config

	mu     sync.Mutex
	remote map[string]*remote
}

type remote struct {
	addr   string
	conn   io.Closer
	client node.Node
}

// New returns a set. With Local set and no Registry it is embedded mode:
// one node, no network.
func New(cfg Config) *Set {
	if cfg.Local != nil && cfg.LocalID == "" {
		cfg.LocalID = "local"
	}
	return &Set{cfg: cfg, remote: map[string]*remote{}}
}

// Single is the set of one in-process node (embedded mode, tests).
func Single(id string, n node.Node) *Set { return New(Config{LocalID: id, Local: n}) }

// Local returns the in-process node's ID, if there is one.
func (s *Set) Local() (string, bool) { return s.cfg.LocalID, s.cfg.Local != nil }

// LocalNode returns the in-process node, or nil.
func (s *Set) LocalNode() node.Node { return s.cfg.Local }

// Get returns node id: the local node, or a client for the registered
// remote node (dialled on first use). ErrUnknownNode when neither.
func (s *Set) Get(ctx context.Context, id string) (node.Node, error) {
	if s.cfg.Local != nil && id == s.cfg.LocalID {
		return s.cfg.Local, nil
	}
	if s.cfg.Registry == nil || id == "" {
		return nil, fmt.Errorf("%w: %q", ErrUnknownNode, id)
	}
	row, err := s.cfg.Registry.GetNode(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		s.drop(id)
		return nil, fmt.Errorf("%w: %q is not registered", ErrUnknownNode, id)
	}
	if err != nil {
		return nil, fmt.Errorf("node registry: %w", err)
	}
	return s.client(row)
}

// client returns the cached client for row, dialling when there is none
// or the row's address changed.
func (s *Set) client(row *store.Node) (node.Node, error) {
	if row.Address == "" {
		return nil, fmt.Errorf("%w: %s", ErrNoAddress, row.ID)
	}
	if s.cfg.Dial == nil && (s.cfg.Certificate == nil || s.cfg.CA == nil) {
		return nil, fmt.Errorf("%w: node %s", ErrNoIdentity, row.ID)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if r := s.remote[row.ID]; r != nil {
		if r.addr == row.Address {
			return r.client, nil
		}
		r.conn.Close()
		delete(s.remote, row.ID)
	}
	if s.cfg.Dial != nil {
		n, c, err := s.cfg.Dial(row)
		if err != nil {
			return nil, fmt.Errorf("node %s at %s: %w", row.ID, row.Address, err)
		}
		s.remote[row.ID] = &remote{addr: row.Address, conn: c, client: n}
		return n, nil
	}
	tc, err := s.TLSConfig(row.ID)
	if err != nil {
		return nil, err
	}
	opts := append([]grpc.DialOption{grpc.WithTransportCredentials(credentials.NewTLS(tc))}, s.cfg.DialOptions...)
	// grpc.NewClient does not connect: the first call does, so a node
	// that is down costs its caller one failed call, not this lock.
	conn, err := grpc.NewClient("passthrough:///"+row.Address, opts...)
	if err != nil {
		return nil, fmt.Errorf("node %s at %s: %w", row.ID, row.Address, err)
	}
	r := &remote{addr: row.Address, conn: conn, client: nodegrpc.NewClient(conn)}
	s.remote[row.ID] = r
	return r.client, nil
}

// TLSConfig is the control plane's client configuration for node id: its
// current certificate (read at each handshake) and a peer that must be
// that node (clusterpki.ControlPlaneClientConfig) with a certificate not
// revoked (clusterpki.RefuseRevoked). The gRPC dial uses it; so does
// anything else that calls the node (its data-plane listener).
func (s *Set) TLSConfig(id string) (*tls.Config, error) {
	if s.cfg.Certificate == nil || s.cfg.CA == nil {
		return nil, fmt.Errorf("%w: node %s", ErrNoIdentity, id)
	}
	if s.cfg.Revocations == nil {
		return nil, fmt.Errorf("%w: node %s: no revocation source to check its certificate against", ErrNoIdentity, id)
	}
	tc := clusterpki.ControlPlaneClientConfig(tls.Certificate{}, s.cfg.CA, id)
	clusterpki.RefuseRevoked(tc, id, s.cfg.Revocations)
	tc.Certificates = nil
	getCert := s.cfg.Certificate
	tc.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return getCert() }
	return tc, nil
}

func (s *Set) drop(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if r := s.remote[id]; r != nil {
		r.conn.Close()
		delete(s.remote, id)
	}
}

// Member is one node of the set with its registry row (nil for a local
// node that has not registered).
type Member struct {
	ID  string
	Row *store.Node
}

// Members lists the local node and every registered node, by ID, and
// closes the connections of nodes no longer registered. A row is listed
// whatever its heartbeat: callers judge liveness (Live).
func (s *Set) Members(ctx context.Context) ([]Member, error) {
	var rows []*store.Node
	if s.cfg.Registry != nil {
		var err error
		if rows, err = s.cfg.Registry.ListNodes(ctx); err != nil {
			return nil, fmt.Errorf("node registry: %w", err)
		}
	}
	out := make([]Member, 0, len(rows)+1)
	seen := map[string]bool{}
	for _, r := range rows {
		out = append(out, Member{ID: r.ID, Row: r})
		seen[r.ID] = true
	}
	if s.cfg.Local != nil && !seen[s.cfg.LocalID] {
		out = append(out, Member{ID: s.cfg.LocalID})
		seen[s.cfg.LocalID] = true
	}
	slices.SortFunc(out, func(a, b Member) int {
		switch {
		case a.ID < b.ID:
			return -1
		case a.ID > b.ID:
			return 1
		}
		return 0
	})
	s.mu.Lock()
	for id, r := range s.remote {
		if !seen[id] {
			r.conn.Close()
			delete(s.remote, id)
		}
	}
	s.mu.Unlock()
	return out, nil
}

// Live is Members less the nodes whose heartbeat is older than ttl (the
// local node is always live: it is this process).
func (s *Set) Live(ctx context.Context, ttl time.Duration, now time.Time) ([]Member, error) {
	all, err := s.Members(ctx)
	if err != nil {
		return nil, err
	}
	live := all[:0]
	for _, m := range all {
		if s.IsLocal(m.ID) || (m.Row != nil && now.Sub(m.Row.HeartbeatAt) <= ttl) {
			live = append(live, m)
		}
	}
	return live, nil
}

// IsLocal reports whether id is the in-process node.
func (s *Set) IsLocal(id string) bool { return s.cfg.Local != nil && id == s.cfg.LocalID }

// Remote reports whether the set can hold nodes other than the local one.
func (s *Set) Remote() bool { return s.cfg.Registry != nil }

// Close closes every remote connection.
func (s *Set) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	var errs []error
	for id, r := range s.remote {
		errs = append(errs, r.conn.Close())
		delete(s.remote, id)
	}
	return errors.Join(errs...)
}
