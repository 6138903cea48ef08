package nodejoin

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/cubicle-dev/cubicle/internal/clusterpki"
	"github.com/cubicle-dev/cubicle/internal/store"
)

// Path is where the control plane's API serves joins.
const Path = "/nodes/join"

// Request is POST /nodes/join's body. The token is the only credential.
type Request struct {
	Token     string   `json:"token"`
	NodeID    string   `json:"nodeID"`
	CSR       string   `json:"csr"`       // PEM; the key stays on the node
	Addresses []string `json:"addresses"` // IPs and DNS names the node is reached at
}

// Response is what a node gets for its token.
type Response struct {
	NodeID       string            `json:"nodeID"`
	Certificate  string            `json:"certificate"`  // PEM, signed by CA
	CA           string            `json:"ca"`           // PEM, the cluster CA
	ControlPlane string            `json:"controlPlane"` // the identity the node accepts
	Labels       map[string]string `json:"labels"`       // the token's, given to the node
}

// ErrTokenRefused: the token is unknown, used, expired or malformed.
// Which one is logged but not told: a guesser learns nothing.
var ErrTokenRefused = errors.New("join token refused")

// TokenError is ErrTokenRefused with the reason, for the log.
type TokenError struct{ Reason error }

func (e *TokenError) Error() string   { return ErrTokenRefused.Error() + ": " + e.Reason.Error() }
func (e *TokenError) Unwrap() []error { return []error{ErrTokenRefused, e.Reason} }

// Service is the control plane's side of a join.
type Service struct {
	Store store.ClusterStore
	CA    *clusterpki.CA
	Now   func() time.Time // time.Now when nil
}

// Join checks the request, spends the token, and signs the node's CSR.
// Everything that can be judged without the token is checked first, so
// a request with a bad CSR does not burn the token.
func (s *Service) Join(ctx context.Context, req Request) (*Response, error) {
	now := time.Now
	if s.Now != nil {
		now = s.Now
	}
	if err := clusterpki.ValidateNodeID(req.NodeID); err != nil {
		return nil, err
	}
	if _, err := clusterpki.ParseCSR([]byte(req.CSR)); err != nil {
		return nil, err
	}
	if _, _, err := clusterpki.ParseAddresses(req.Addresses); err != nil {
		return nil, err
	}
	tok, err := Redeem(ctx, s.Store, req.Token, req.NodeID, now())
	if err != nil {
		if errors.Is(err, ErrMalformedToken) || errors.Is(err, store.ErrTokenUnknown) ||
			errors.Is(err, store.ErrTokenUsed) || errors.Is(err, store.ErrTokenExpired) {
			return nil, &TokenError{Reason: err}
		}
		return nil, err
	}
	// A node ID forgotten before gets a certificate that starts after the
	// forget, so the revocation refuses the old certificates and not this one.
	cert, err := s.CA.SignNodeAfter([]byte(req.CSR), req.NodeID, req.Addresses, now(), tok.NodeRevokedAt)
	if err != nil {
		return nil, fmt.Errorf("sign node %s: %w", req.NodeID, err)
	}
	return &Response{
		NodeID:       req.NodeID,
		Certificate:  string(cert),
		CA:           string(s.CA.CertPEM),
		ControlPlane: clusterpki.ControlPlaneURI,
		Labels:       tok.Labels,
	}, nil
}
