package clusterpki

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"
)

// ErrRevoked is what a RevokedError matches: the certificate names a node
// that was forgotten after the certificate was issued.
var ErrRevoked = errors.New("clusterpki: node certificate revoked")

// RevokedError says which node was forgotten, and when.
type RevokedError struct {
	Node string
	At   time.Time
}

func (e *RevokedError) Error() string {
	return fmt.Sprintf("node %s was forgotten (`cubicle node forget`) at %s, which revokes its certificate: join it again with a new token",
		e.Node, e.At.UTC().Format(time.RFC3339))
}
func (e *RevokedError) Unwrap() error { return ErrRevoked }

// Revocations tells when a node ID was last forgotten (zero: never): a
// whole second, since certificate times are. Every certificate issued
// before the forget starts before that second (they are backdated a
// minute, or start at an earlier forget's second), and every one issued
// after starts at it or later. store.ClusterStore implements it with one
// read by primary key.
type Revocations interface {
	NodeRevokedAt(ctx context.Context, id string) (time.Time, error)
}

// AuthenticateNode is NodeID plus revocation: a certificate whose
// NotBefore is before its node's last forget is refused with a
// *RevokedError. The check reads the store on every call, with no cache,
// so a forget takes effect on every replica at the node's next call; a
// node calls every few seconds, and the read is one primary-key lookup.
// Store errors are returned as they are (neither ErrIdentity nor
// ErrRevoked).
func (ca *CA) AuthenticateNode(ctx context.Context, cert *x509.Certificate, now time.Time, revs Revocations) (string, error) {
	id, err := ca.NodeID(cert, now)
	if err != nil {
		return "", err
	}
	if revs == nil {
		return "", errors.New("clusterpki: no revocation source to check node certificates against")
	}
	at, err := revs.NodeRevokedAt(ctx, id)
	if err != nil {
		return "", fmt.Errorf("node %s revocation: %w", id, err)
	}
	if !at.IsZero() && cert.NotBefore.Before(at) {
		return "", &RevokedError{Node: id, At: at}
	}
	return id, nil
}

// RequestNode is the node an HTTPS request comes from: the client
// certificate it presented (the TLS layer has already checked that the
// client holds its key) must chain to ca, name a node and not be revoked
// (AuthenticateNode). A request without one is ErrIdentity.
func (ca *CA) RequestNode(r *http.Request, now time.Time, revs Revocations) (string, error) {
	if r.TLS == nil || len(r.TLS.PeerCertificates) == 0 {
		return "", fmt.Errorf("%w: no client certificate", ErrIdentity)
	}
	return ca.AuthenticateNode(r.Context(), r.TLS.PeerCertificates[0], now, revs)
}

// RenewNode is SignNode for a node that proves who it is with the
// certificate it presented over mTLS (peer), checked by AuthenticateNode:
// the new certificate, for a new key, keeps the node ID of the old one, so
// neither the control plane's certificate nor a forgotten node's renews.
// It starts no earlier than peer, so it is never older than the
// certificate that earned it.
func (ca *CA) RenewNode(ctx context.Context, peer *x509.Certificate, csrPEM []byte, addresses []string, now time.Time, revs Revocations) ([]byte, error) {
	id, err := ca.AuthenticateNode(ctx, peer, now, revs)
	if err != nil {
		return nil, err
	}
	return ca.signNode(csrPEM, id, addresses, now, peer.NotBefore)
}

// RefuseRevoked makes cfg, a ControlPlaneClientConfig for nodeID, also
// refuse a node certificate that revs says is revoked (its NotBefore is
// before nodeID's last forget), after cfg's own checks: a forgotten machine
// that kept its certificate cannot pass for a node that joined again under
// its ID. A failed read of revs refuses the connection too. The check runs
// in the handshake, which has no context of its own: the read is bounded
// by revocationReadTimeout.
func RefuseRevoked(cfg *tls.Config, nodeID string, revs Revocations) {
	verify := cfg.VerifyConnection
	cfg.VerifyConnection = func(cs tls.ConnectionState) error {
		if verify != nil {
			if err := verify(cs); err != nil {
				return err
			}
		}
		if len(cs.PeerCertificates) == 0 {
			return fmt.Errorf("%w: the node presented no certificate", ErrIdentity)
		}
		ctx, cancel := context.WithTimeout(context.Background(), revocationReadTimeout)
		defer cancel()
		at, err := revs.NodeRevokedAt(ctx, nodeID)
		if err != nil {
			return fmt.Errorf("node %s revocation: %w", nodeID, err)
		}
		if !at.IsZero() && cs.PeerCertificates[0].NotBefore.Before(at) {
			return &RevokedError{Node: nodeID, At: at}
		}
		return nil
	}
}

const revocationReadTimeout = 5 * time.Second

// RevocationCache is Revocations read through a cache: a node ID's answer
// is kept for at most ttl (the control plane dials a node's data plane per
// tunnel; a read per tunnel would put the store on the data path). A
// forget then holds for new connections within ttl; pass the node
// heartbeat interval or less. Errors are not kept. Safe for concurrent use.
type RevocationCache struct {
	src Revocations
	ttl time.Duration
	now func() time.Time

	mu sync.Mutex
	m  map[string]cachedRevocation
}

type cachedRevocation struct {
	at, read time.Time
}

// revocationCacheMax bounds the cache; past it expired entries are dropped
// (the IDs dialled are the registered nodes').
const revocationCacheMax = 4096

// NewRevocationCache caches src for ttl (> 0).
func NewRevocationCache(src Revocations, ttl time.Duration) *RevocationCache {
	if src == nil || ttl <= 0 {
		panic("clusterpki: a revocation cache needs a source and a positive TTL")
	}
	return &RevocationCache{src: src, ttl: ttl, now: time.Now, m: map[string]cachedRevocation{}}
}

// NodeRevokedAt implements Revocations.
func (c *RevocationCache) NodeRevokedAt(ctx context.Context, id string) (time.Time, error) {
	now := c.now()
	c.mu.Lock()
	e, ok := c.m[id]
	c.mu.Unlock()
	if ok && now.Sub(e.read) < c.ttl && !now.Before(e.read) {
		return e.at, nil
	}
	at, err := c.src.NodeRevokedAt(ctx, id)
	if err != nil {
		return time.Time{}, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.m) >= revocationCacheMax {
		for k, v := range c.m {
			if now.Sub(v.read) >= c.ttl {
				delete(c.m, k)
			}
		}
	}
	if len(c.m) < revocationCacheMax {
		c.m[id] = cachedRevocation{at: at, read: now}
	}
	return at, nil
}
