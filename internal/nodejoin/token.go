// Package nodejoin admits a node to the cluster: single-use join tokens,
// the join exchange (a node's CSR for a certificate from the cluster CA),
// and the node side of it, which sends its token only to a server that
// proves it holds the pinned CA's certificate.
package nodejoin

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"regexp"
	"time"

	"github.com/cubicle-dev/cubicle/internal/store"
)

var (
	// ErrMalformedToken: not <id>.<secret> as Create makes them.
	ErrMalformedToken = errors.New("nodejoin: malformed join token")
	// ErrInvalidTTL: the TTL is not within (0, MaxTTL].
	ErrInvalidTTL = errors.New("nodejoin: invalid token TTL")
	// ErrInvalidLabel: a label key or value breaks the label rules.
	ErrInvalidLabel = errors.New("nodejoin: invalid label")
)

const (
	// DefaultTTL is a token's life when none is given.
	DefaultTTL = time.Hour
	// MaxTTL bounds a token's life: a token is a credential that admits a
	// machine, so an old forgotten one must not stay usable.
	MaxTTL = 7 * 24 * time.Hour

	idBytes     = 6  // 12 hex digits: names the row, not secret
	secretBytes = 16 // 128 bits
)

var tokenRE = regexp.MustCompile(`^([0-9a-f]{12})\.([0-9a-f]{32})$`)

// ParseToken splits a token into its ID and secret.
func ParseToken(tok string) (id, secret string, err error) {
	m := tokenRE.FindStringSubmatch(tok)
	if m == nil {
		return "", "", fmt.Errorf("%w: want <12 hex digits>.<32 hex digits>", ErrMalformedToken)
	}
	return m[1], m[2], nil
}

// HashSecret is what the store keeps of a token's secret. A plain SHA-256
// is enough: the secret is 128 random bits, not a password.
func HashSecret(secret string) string {
	h := sha256.Sum256([]byte("cubicle join token\x00" + secret))
	return hex.EncodeToString(h[:])
}

var (
	labelKeyRE = regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9._/-]{0,62}[A-Za-z0-9])?$`)
	labelValRE = regexp.MustCompile(`^([A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?)?$`)
)

// ValidateLabels applies Kubernetes' label shape (keys up to 64 characters
// with an optional prefix/, values up to 63), at most 64 labels: labels
// reach the scheduler's CEL policies, which budget for that size.
func ValidateLabels(l map[string]string) error {
	if len(l) > 64 {
		return fmt.Errorf("%w: at most 64 labels, got %d", ErrInvalidLabel, len(l))
	}
	for k, v := range l {
		if !labelKeyRE.MatchString(k) {
			return fmt.Errorf("%w: key %q must be 1-64 letters, digits, '.', '_', '-', '/', starting and ending with a letter or digit", ErrInvalidLabel, k)
		}
		if !labelValRE.MatchString(v) {
			return fmt.Errorf("%w: value %q of %s must be at most 63 letters, digits, '.', '_', '-', starting and ending with a letter or digit", ErrInvalidLabel, v, k)
		}
	}
	return nil
}

// Create makes a token valid for ttl that gives the joining node labels.
// The token is returned once; the store keeps only its secret's hash.
func Create(ctx context.Context, st store.ClusterStore, ttl time.Duration, labels map[string]string, now time.Time) (string, *store.JoinToken, error) {
	if ttl <= 0 || ttl > MaxTTL {
		return "", nil, fmt.Errorf("%w: %v must be positive and at most %v", ErrInvalidTTL, ttl, MaxTTL)
	}
	if err := ValidateLabels(labels); err != nil {
		return "", nil, err
	}
	b := make([]byte, idBytes+secretBytes)
	if _, err := rand.Read(b); err != nil {
		return "", nil, err
	}
	id, secret := hex.EncodeToString(b[:idBytes]), hex.EncodeToString(b[idBytes:])
	row := &store.JoinToken{ID: id, SecretHash: HashSecret(secret), Labels: labels, CreatedAt: now.UTC(), ExpiresAt: now.Add(ttl).UTC()}
	if err := st.CreateJoinToken(ctx, row); err != nil {
		return "", nil, err
	}
	return id + "." + secret, row, nil
}

// Redeem spends tok for nodeID: the store's typed errors
// (store.ErrTokenUnknown, ErrTokenUsed, ErrTokenExpired) or
// ErrMalformedToken when it fails.
func Redeem(ctx context.Context, st store.ClusterStore, tok, nodeID string, now time.Time) (*store.JoinToken, error) {
	id, secret, err := ParseToken(tok)
	if err != nil {
		return nil, err
	}
	return st.RedeemJoinToken(ctx, id, HashSecret(secret), nodeID, now)
}
