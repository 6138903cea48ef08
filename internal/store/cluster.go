package store

import (
	"context"
	"errors"
	"time"
)

// Join token errors. RedeemJoinToken tells them apart for the log and the
// tests; the join API answers all three alike (401), so a caller guessing
// tokens learns nothing about which exist.
var (
	// ErrTokenUnknown: no token has this ID, or its secret does not match.
	ErrTokenUnknown = errors.New("store: join token unknown")
	// ErrTokenUsed: the token was redeemed already (tokens are single-use).
	ErrTokenUsed = errors.New("store: join token already used")
	// ErrTokenExpired: the token's expiry has passed.
	ErrTokenExpired = errors.New("store: join token expired")
	// ErrNodeExists: a node with the joining node's ID has joined (whether
	// or not it has registered yet); the operator forgets it first
	// (`cubicle node forget`).
	ErrNodeExists = errors.New("store: a node with this ID has joined")
)

// ClusterCA is the certificate authority every control-plane replica
// shares: it signs node and control-plane certificates. There is at most
// one. KeySealed is the private key sealed by internal/secret with the
// secrets key, never plaintext.
type ClusterCA struct {
	CertPEM   []byte
	KeySealed []byte
	CreatedAt time.Time
}

// JoinToken admits one node once. The store keeps only a hash of the
// token's secret.
type JoinToken struct {
	ID         string
	SecretHash string // hex SHA-256 of the secret
	Labels     map[string]string
	CreatedAt  time.Time
	ExpiresAt  time.Time
	UsedAt     time.Time // zero while unused
	UsedBy     string    // the node ID that redeemed it
	// NodeRevokedAt is set by RedeemJoinToken only: when UsedBy was last
	// forgotten (zero: never), read in the redeem's transaction. The new
	// certificate must start after it, or it would be refused as revoked.
	NodeRevokedAt time.Time
}

// ClusterStore is the cluster's join state: the CA and the join tokens.
type ClusterStore interface {
	// InitClusterCA stores ca unless a CA exists already, and returns the
	// stored one: when replicas race to make the first CA, every one of
	// them gets the winner's, so there is never more than one.
	InitClusterCA(ctx context.Context, ca *ClusterCA) (*ClusterCA, error)
	// ClusterCA returns the CA; ErrNotFound before InitClusterCA.
	ClusterCA(ctx context.Context) (*ClusterCA, error)

	// CreateJoinToken inserts a token; ErrConflict when the ID exists.
	CreateJoinToken(ctx context.Context, t *JoinToken) error
	// ListJoinTokens returns every token, oldest first.
	ListJoinTokens(ctx context.Context) ([]*JoinToken, error)
	// DeleteJoinToken revokes a token; ErrNotFound when missing.
	DeleteJoinToken(ctx context.Context, id string) error
	// RedeemJoinToken marks the token used by nodeID at now, in one atomic
	// step, and returns it: of two concurrent redeems of one token exactly
	// one succeeds. ErrTokenUnknown when the ID is missing or secretHash
	// differs, ErrTokenUsed when it was redeemed before, ErrTokenExpired
	// when now is past its expiry, ErrNodeExists (and the token stays
	// unused) when the registry has a row for nodeID or a token was
	// redeemed for nodeID since its last ForgetNode. The check, the mark
	// and the reservation of nodeID are one transaction: of two tokens
	// redeemed for one node ID, exactly one succeeds.
	RedeemJoinToken(ctx context.Context, id, secretHash, nodeID string, now time.Time) (*JoinToken, error)
	// NodeRevokedAt is when node id was last forgotten (ForgetNode), zero
	// when never: a whole second, later than any earlier forget's. A
	// certificate for id whose NotBefore is before it is revoked. One read
	// by primary key.
	NodeRevokedAt(ctx context.Context, id string) (time.Time, error)
	// NodeJoined reports whether a join token was redeemed for node id
	// since its last ForgetNode: a remote node holds that ID (registered
	// or not yet). One read by primary key.
	NodeJoined(ctx context.Context, id string) (bool, error)
}
