package clusterpki

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"net/http"
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
