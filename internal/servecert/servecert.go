// Package servecert holds the certificate `cubicle serve` presents when it
// serves TLS for its domain: an operator's wildcard certificate for *.D, or
// one issued by a local CA that serve creates once and keeps in the data dir.
// API (api.D) and sandbox hosts (<port>-<id>.D) share it.
package servecert

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

var (
	// ErrInvalid: the files do not parse or do not match.
	ErrInvalid = errors.New("servecert: invalid certificate")
	// ErrNotCovered: the certificate does not name the hosts the SDKs use.
	ErrNotCovered = errors.New("servecert: certificate does not cover the domain")
)

const (
	caValidity   = 10 * 365 * 24 * time.Hour
	leafValidity = 397 * 24 * time.Hour // the longest browsers accept
	renewBefore  = 30 * 24 * time.Hour
	// caRenewBefore: a local CA is replaced this long before it expires.
	// The one it replaces stays in PEM (what sandboxes created from then on
	// trust) and keeps signing while it can, so whoever trusts only it (a
	// sandbox created before, running or paused) keeps verifying until it
	// expires.
	caRenewBefore = 365 * 24 * time.Hour
)

// Hosts are the names a certificate for domain must cover: the API host
// and a sandbox host (a wildcard covers every one).
func Hosts(domain string) []string {
	return []string{"api." + domain, "49983-abcdefghij0123456789." + domain}
}

// Load reads an operator's certificate and key and checks that the
// certificate covers Hosts(domain) and is valid now.
func Load(certFile, keyFile, domain string) (*tls.Certificate, error) {
	c, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	if err := covers(&c, domain, time.Now()); err != nil {
		return nil, err
	}
	return &c, nil
}

func covers(c *tls.Certificate, domain string, now time.Time) error {
	leaf := c.Leaf
	if leaf == nil {
		var err error
		if leaf, err = x509.ParseCertificate(c.Certificate[0]); err != nil {
			return fmt.Errorf("%w: %v", ErrInvalid, err)
		}
	}
	if now.Before(leaf.NotBefore) || now.After(leaf.NotAfter) {
		return fmt.Errorf("%w: valid %s to %s only", ErrInvalid, leaf.NotBefore.Format(time.RFC3339), leaf.NotAfter.Format(time.RFC3339))
	}
	for _, h := range Hosts(domain) {
		if err := leaf.VerifyHostname(h); err != nil {
			return fmt.Errorf("%w: %s is not covered (want a certificate for *.%s): %v", ErrNotCovered, h, domain, err)
		}
	}
	return nil
}

// SelfSigned returns a certificate for *.domain and domain issued by a local
// CA kept in dir (created 0700 on first use, key files 0600), and the path
// of that CA's certificate, which clients must trust. The CA is made once
// and reused; the leaf is re-issued when it nears expiry or no longer
// covers the domain.
func SelfSigned(dir, domain string) (*tls.Certificate, string, error) {
	host, _ := os.Hostname()
	ca, err := LoadOrCreateCA(dir, "Cubicle local CA "+host)
	if err != nil {
		return nil, "", err
	}
	caCertPath, caCert, caKey := ca.CertPath, ca.Cert, ca.key
	leafCert, leafKey := filepath.Join(dir, "server.pem"), filepath.Join(dir, "server-key.pem")
	if c, err := tls.LoadX509KeyPair(leafCert, leafKey); err == nil {
		if covers(&c, domain, time.Now().Add(renewBefore)) == nil && issuedBy(&c, caCert) {
			return &c, caCertPath, nil
		}
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, "", err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: "*." + domain},
		DNSNames:     []string{"*." + domain, domain},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(leafValidity),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
	if err != nil {
		return nil, "", err
	}
	if err := writePair(leafCert, leafKey, der, key); err != nil {
		return nil, "", err
	}
	c, err := tls.LoadX509KeyPair(leafCert, leafKey)
	if err != nil {
		return nil, "", err
	}
	return &c, caCertPath, nil
}

func issuedBy(c *tls.Certificate, ca *x509.Certificate) bool {
	leaf, err := x509.ParseCertificate(c.Certificate[0])
	return err == nil && leaf.CheckSignatureFrom(ca) == nil
}

// CA is a local certificate authority whose certificate and key live in a
// directory (the key 0600).
type CA struct {
	Cert     *x509.Certificate
	CertPath string
	key      *ecdsa.PrivateKey
	// prev is the CA this one renewed, kept (ca-prev.pem) until it expires.
	prev    *x509.Certificate
	prevKey *ecdsa.PrivateKey
}

// LoadOrCreateCA loads the CA in dir (ca.pem, ca-key.pem), making the
// directory (0700) and a new CA named commonName on first use or when the
// old one nears expiry.
func LoadOrCreateCA(dir, commonName string) (*CA, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return nil, err
	}
	certPath, keyPath := filepath.Join(dir, "ca.pem"), filepath.Join(dir, "ca-key.pem")
	prevPath, prevKeyPath := filepath.Join(dir, "ca-prev.pem"), filepath.Join(dir, "ca-prev-key.pem")
	now := time.Now()
	if c, k := loadCAPair(certPath, keyPath); c != nil && now.Before(c.NotAfter) && !now.Before(c.NotAfter.Add(-caRenewBefore)) {
		// About to be renewed below: kept as the previous CA.
		if err := writePair(prevPath, prevKeyPath, c.Raw, k); err != nil {
			return nil, err
		}
	}
	cert, key, err := loadOrCreateCA(certPath, keyPath, commonName)
	if err != nil {
		return nil, err
	}
	ca := &CA{Cert: cert, CertPath: certPath, key: key}
	if c, k := loadCAPair(prevPath, prevKeyPath); c != nil && now.Before(c.NotAfter) && !c.Equal(cert) {
		ca.prev, ca.prevKey = c, k
	}
	return ca, nil
}

// loadCAPair reads a CA's certificate and key; nil when they are missing or
// are not an ECDSA CA.
func loadCAPair(certPath, keyPath string) (*x509.Certificate, *ecdsa.PrivateKey) {
	c, err := tls.LoadX509KeyPair(certPath, keyPath)
	if err != nil {
		return nil, nil
	}
	cert, err := x509.ParseCertificate(c.Certificate[0])
	key, ok := c.PrivateKey.(*ecdsa.PrivateKey)
	if err != nil || !ok || !cert.IsCA {
		return nil, nil
	}
	return cert, key
}

// PEM is the CA certificate, for trust stores, and the one it renewed
// while that one is valid.
func (ca *CA) PEM() []byte {
	b := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.Cert.Raw})
	if ca.prev != nil && time.Now().Before(ca.prev.NotAfter) {
		b = append(b, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.prev.Raw})...)
	}
	return b
}

// Issue makes a server certificate for names (DNS names or IP literals),
// valid for validity (backdated an hour for clock skew), kept in memory.
func (ca *CA) Issue(names []string, validity time.Duration) (*tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(validity),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	if len(names) > 0 {
		tmpl.Subject = pkix.Name{CommonName: names[0]}
	}
	for _, n := range names {
		if ip := net.ParseIP(n); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, n)
		}
	}
	// The previous CA signs while it outlives the leaf: everyone who
	// trusts either CA trusts it (PEM holds both since the renewal).
	issuer, issuerKey := ca.Cert, ca.key
	if ca.prev != nil && tmpl.NotAfter.Before(ca.prev.NotAfter) {
		issuer, issuerKey = ca.prev, ca.prevKey
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, issuer, &key.PublicKey, issuerKey)
	if err != nil {
		return nil, err
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &tls.Certificate{Certificate: [][]byte{der, issuer.Raw}, PrivateKey: key, Leaf: leaf}, nil
}

func loadOrCreateCA(certPath, keyPath, commonName string) (*x509.Certificate, *ecdsa.PrivateKey, error) {
	if c, err := tls.LoadX509KeyPair(certPath, keyPath); err == nil {
		cert, err := x509.ParseCertificate(c.Certificate[0])
		key, ok := c.PrivateKey.(*ecdsa.PrivateKey)
		if err == nil && ok && cert.IsCA && time.Now().Before(cert.NotAfter.Add(-caRenewBefore)) {
			return cert, key, nil
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, nil, fmt.Errorf("%w: local CA in %s: %v (remove it to make a new one)", ErrInvalid, filepath.Dir(certPath), err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: commonName, Organization: []string{"Cubicle"}},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(caValidity),
		IsCA:                  true,
		BasicConstraintsValid: true,
		MaxPathLenZero:        true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, err
	}
	if err := writePair(certPath, keyPath, der, key); err != nil {
		return nil, nil, err
	}
	cert, err := x509.ParseCertificate(der)
	return cert, key, err
}

func writePair(certPath, keyPath string, der []byte, key *ecdsa.PrivateKey) error {
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return err
	}
	if err := writeFile(keyPath, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}), 0o600); err != nil {
		return err
	}
	return writeFile(certPath, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644)
}

// writeFile replaces path atomically, so a crash never leaves half a key.
func writeFile(path string, b []byte, mode os.FileMode) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, mode); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	return n
}

// TrustHint tells an operator how to make clients trust caPath.
func TrustHint(caPath string) string {
	return strings.Join([]string{
		"clients must trust the local CA " + caPath + ":",
		"  Node (e2b JS SDK):  export NODE_EXTRA_CA_CERTS=" + caPath,
		"  Python (e2b SDK):   export SSL_CERT_FILE=" + caPath + "   (requests: REQUESTS_CA_BUNDLE)",
		"  system-wide (Debian): cp " + caPath + " /usr/local/share/ca-certificates/cubicle.crt && update-ca-certificates",
	}, "\n")
}

// Config is the TLS config serve uses: HTTP/2 and HTTP/1.1 (WebSockets
// upgrade over HTTP/1.1).
func Config(c *tls.Certificate) *tls.Config {
	return &tls.Config{
		Certificates: []tls.Certificate{*c},
		MinVersion:   tls.VersionTLS12,
		NextProtos:   slices.Clone([]string{"h2", "http/1.1"}),
	}
}
