// Package clusterpki is the cluster's certificate authority: one CA shared
// by every control-plane replica (kept in the store, its key sealed with
// the secrets key), the certificates it issues to nodes and to the control
// plane, and the mutual-TLS configurations that make a node accept only the
// control plane and the control plane accept only the node it meant to dial.
//
// Identities are URI SANs, as in SPIFFE: cubicle://control-plane for the
// control plane, cubicle://node/<nodeID> for a node. Host names are not
// identities here: a node's address may change, its ID does not.
package clusterpki

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"strings"
	"time"

	"github.com/cubicle-dev/cubicle/internal/store"
)

var (
	// ErrInvalidCSR: the certificate request does not parse, is not signed
	// by its key, uses another key type, or asks for names itself.
	ErrInvalidCSR = errors.New("clusterpki: invalid certificate request")
	// ErrInvalidNodeID: the node ID is not a DNS label.
	ErrInvalidNodeID = errors.New("clusterpki: invalid node ID")
	// ErrInvalidAddress: an address is neither an IP nor a DNS name.
	ErrInvalidAddress = errors.New("clusterpki: invalid node address")
	// ErrCorruptCA: the stored CA does not parse or its key does not match.
	ErrCorruptCA = errors.New("clusterpki: stored cluster CA is unusable")
	// ErrIdentity: a peer's certificate is not the identity expected.
	ErrIdentity = errors.New("clusterpki: peer identity refused")
	// ErrPinMismatch: the server's CA is not the pinned one.
	ErrPinMismatch = errors.New("clusterpki: server CA does not match the pin")
)

const (
	caValidity = 10 * 365 * 24 * time.Hour
	// LeafValidity is how long node and control-plane certificates last;
	// a node renews before it ends (and a short life bounds a stolen key).
	LeafValidity = 30 * 24 * time.Hour
	// sealScope binds the sealed CA key to its purpose (internal/secret's
	// field AAD), so no other sealed value can be swapped in.
	sealScope = "cluster-ca-key"
)

// Sealer is what the CA key is sealed with: *secret.Secrets.
type Sealer interface {
	SealField(teamID, scope, value string) (string, error)
	OpenField(teamID, scope, sealed string) (string, error)
}

// CAStore is the part of the store the CA lives in.
type CAStore interface {
	InitClusterCA(ctx context.Context, ca *store.ClusterCA) (*store.ClusterCA, error)
	ClusterCA(ctx context.Context) (*store.ClusterCA, error)
}

// CA signs the cluster's certificates.
type CA struct {
	Cert    *x509.Certificate
	CertPEM []byte
	key     *ecdsa.PrivateKey
}

// LoadOrCreateCA returns the cluster CA, making it on first use. Replicas
// racing here each make a candidate, but the store keeps only the first
// and every one of them signs with that one.
func LoadOrCreateCA(ctx context.Context, st CAStore, sealer Sealer) (*CA, error) {
	row, err := st.ClusterCA(ctx)
	if errors.Is(err, store.ErrNotFound) {
		var cand *store.ClusterCA
		if cand, err = newCA(sealer, time.Now()); err != nil {
			return nil, err
		}
		row, err = st.InitClusterCA(ctx, cand)
	}
	if err != nil {
		return nil, err
	}
	return openCA(row, sealer)
}

// CACert reads the CA's certificate alone (what a pin is made from),
// without its key: store.ErrNotFound before the CA is made.
func CACert(ctx context.Context, st CAStore) (*x509.Certificate, error) {
	row, err := st.ClusterCA(ctx)
	if err != nil {
		return nil, err
	}
	cert, err := ParseCertPEM(row.CertPEM)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrCorruptCA, err)
	}
	return cert, nil
}

func newCA(sealer Sealer, now time.Time) (*store.ClusterCA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "cubicle cluster CA"},
		NotBefore:             now.Add(-time.Minute),
		NotAfter:              now.Add(caValidity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, err
	}
	sealed, err := sealer.SealField(store.SystemTeamID, sealScope, string(pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})))
	if err != nil {
		return nil, err
	}
	return &store.ClusterCA{
		CertPEM:   pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		KeySealed: []byte(sealed),
		CreatedAt: now.UTC(),
	}, nil
}

func openCA(row *store.ClusterCA, sealer Sealer) (*CA, error) {
	cert, err := ParseCertPEM(row.CertPEM)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrCorruptCA, err)
	}
	// Opening fails with internal/secret's typed errors (wrong key,
	// tampered) when the secrets key is not the one it was sealed with.
	keyPEM, err := sealer.OpenField(store.SystemTeamID, sealScope, string(row.KeySealed))
	if err != nil {
		return nil, fmt.Errorf("cluster CA key: %w", err)
	}
	b, _ := pem.Decode([]byte(keyPEM))
	if b == nil {
		return nil, fmt.Errorf("%w: key is not PEM", ErrCorruptCA)
	}
	key, err := x509.ParseECPrivateKey(b.Bytes)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrCorruptCA, err)
	}
	if !key.PublicKey.Equal(cert.PublicKey) {
		return nil, fmt.Errorf("%w: key does not match the certificate", ErrCorruptCA)
	}
	return &CA{Cert: cert, CertPEM: row.CertPEM, key: key}, nil
}

// Pin is the CA's discovery hash, as kubeadm prints it: sha256:<hex> of
// the certificate's SubjectPublicKeyInfo.
func Pin(cert *x509.Certificate) string {
	h := sha256.Sum256(cert.RawSubjectPublicKeyInfo)
	return "sha256:" + hex.EncodeToString(h[:])
}

// ParsePin checks a pin's form and returns it in canonical (lower) case.
func ParsePin(pin string) (string, error) {
	p := strings.ToLower(strings.TrimSpace(pin))
	h, ok := strings.CutPrefix(p, "sha256:")
	if b, err := hex.DecodeString(h); !ok || err != nil || len(b) != sha256.Size {
		return "", fmt.Errorf("clusterpki: CA pin %q must be sha256:<64 hex digits>", pin)
	}
	return p, nil
}

// ParseCertPEM parses the first certificate in b.
func ParseCertPEM(b []byte) (*x509.Certificate, error) {
	blk, _ := pem.Decode(b)
	if blk == nil || blk.Type != "CERTIFICATE" {
		return nil, errors.New("not a PEM certificate")
	}
	return x509.ParseCertificate(blk.Bytes)
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		panic(err) // crypto/rand does not fail on Linux
	}
	return n
}
