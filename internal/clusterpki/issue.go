package clusterpki

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"net"
	"net/url"
	"regexp"
	"strings"
	"time"
)

// ControlPlaneURI is the control plane's identity (every replica has it).
const ControlPlaneURI = "cubicle://control-plane"

// JoinServerName is the TLS server name a joining node asks for: the
// control plane answers it with its cluster certificate (not the API's
// public one), so the node can check it against the pinned CA.
const JoinServerName = "control-plane.cubicle.invalid"

// NodeURI is node nodeID's identity.
func NodeURI(nodeID string) string { return "cubicle://node/" + nodeID }

var nodeIDRE = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)

// ValidateNodeID: a node ID is a DNS label (lower case), so it fits in
// URIs, host names and Kubernetes object names unchanged.
func ValidateNodeID(id string) error {
	if !nodeIDRE.MatchString(id) {
		return fmt.Errorf("%w: %q must be 1-63 lower-case letters, digits and '-', not starting or ending with '-'", ErrInvalidNodeID, id)
	}
	return nil
}

// ParseCSR checks a node's certificate request: PEM, signed by its own
// key, ECDSA P-256, and naming nothing itself (the names a certificate
// carries are decided here, from the node ID and addresses).
func ParseCSR(csrPEM []byte) (*x509.CertificateRequest, error) {
	b, _ := pem.Decode(csrPEM)
	if b == nil || b.Type != "CERTIFICATE REQUEST" {
		return nil, fmt.Errorf("%w: not a PEM CERTIFICATE REQUEST", ErrInvalidCSR)
	}
	csr, err := x509.ParseCertificateRequest(b.Bytes)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalidCSR, err)
	}
	if err := csr.CheckSignature(); err != nil {
		return nil, fmt.Errorf("%w: signature: %v", ErrInvalidCSR, err)
	}
	if k, ok := csr.PublicKey.(*ecdsa.PublicKey); !ok || k.Curve != elliptic.P256() {
		return nil, fmt.Errorf("%w: key must be ECDSA P-256", ErrInvalidCSR)
	}
	if len(csr.DNSNames)+len(csr.IPAddresses)+len(csr.URIs)+len(csr.EmailAddresses) > 0 {
		return nil, fmt.Errorf("%w: it must not carry subject alternative names (send addresses beside it)", ErrInvalidCSR)
	}
	return csr, nil
}

// ParseAddresses splits a node's addresses into IPs and DNS names.
func ParseAddresses(addrs []string) ([]net.IP, []string, error) {
	if len(addrs) > 16 {
		return nil, nil, fmt.Errorf("%w: at most 16 addresses, got %d", ErrInvalidAddress, len(addrs))
	}
	var ips []net.IP
	var dns []string
	for _, a := range addrs {
		if ip := net.ParseIP(a); ip != nil {
			ips = append(ips, ip)
			continue
		}
		if !validDNSName(a) {
			return nil, nil, fmt.Errorf("%w: %q is neither an IP address nor a DNS name", ErrInvalidAddress, a)
		}
		dns = append(dns, strings.ToLower(a))
	}
	return ips, dns, nil
}

var dnsLabelRE = regexp.MustCompile(`^[a-zA-Z0-9]([a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?$`)

func validDNSName(s string) bool {
	if len(s) > 253 {
		return false
	}
	for l := range strings.SplitSeq(s, ".") {
		if !dnsLabelRE.MatchString(l) {
			return false
		}
	}
	return true
}

// SignNode issues node nodeID's certificate for the key in csrPEM (the
// key never leaves the node). It is both for client and server auth: the
// node serves the control plane and calls it back. A node renews by
// sending a new request before NotAfter.
func (ca *CA) SignNode(csrPEM []byte, nodeID string, addresses []string, now time.Time) ([]byte, error) {
	return ca.signNode(csrPEM, nodeID, addresses, now, time.Time{})
}

// SignNodeAfter is SignNode for a node ID forgotten at revokedAt (zero:
// never; see Revocations): the certificate starts no earlier than
// revokedAt, where the minute of backdating would put it before, so a
// join right after a forget gets a certificate that is valid at once and
// not revoked.
func (ca *CA) SignNodeAfter(csrPEM []byte, nodeID string, addresses []string, now, revokedAt time.Time) ([]byte, error) {
	return ca.signNode(csrPEM, nodeID, addresses, now, revokedAt)
}

// signNode signs with NotBefore no earlier than notBefore.
func (ca *CA) signNode(csrPEM []byte, nodeID string, addresses []string, now, notBefore time.Time) ([]byte, error) {
	if err := ValidateNodeID(nodeID); err != nil {
		return nil, err
	}
	csr, err := ParseCSR(csrPEM)
	if err != nil {
		return nil, err
	}
	ips, dns, err := ParseAddresses(addresses)
	if err != nil {
		return nil, err
	}
	u, _ := url.Parse(NodeURI(nodeID))
	return ca.sign(csr.PublicKey, pkix.Name{CommonName: "node " + nodeID}, dns, ips, u, now, notBefore)
}

// IssueControlPlane makes a control-plane key and certificate. Each
// replica makes its own (the key stays in its memory); the chain includes
// the CA so a joining node can check it against its pin.
func (ca *CA) IssueControlPlane(now time.Time) (*tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	u, _ := url.Parse(ControlPlaneURI)
	certPEM, err := ca.sign(&key.PublicKey, pkix.Name{CommonName: "cubicle control plane"}, []string{JoinServerName}, nil, u, now, time.Time{})
	if err != nil {
		return nil, err
	}
	b, _ := pem.Decode(certPEM)
	leaf, err := x509.ParseCertificate(b.Bytes)
	if err != nil {
		return nil, err
	}
	return &tls.Certificate{Certificate: [][]byte{b.Bytes, ca.Cert.Raw}, PrivateKey: key, Leaf: leaf}, nil
}

// sign backdates NotBefore a minute for clock skew between machines, but
// never before notBefore.
func (ca *CA) sign(pub any, subj pkix.Name, dns []string, ips []net.IP, uri *url.URL, now, notBefore time.Time) ([]byte, error) {
	start := now.Add(-time.Minute)
	if start.Before(notBefore) {
		start = notBefore
	}
	notAfter := now.Add(LeafValidity)
	if notAfter.After(ca.Cert.NotAfter) {
		notAfter = ca.Cert.NotAfter
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      subj,
		NotBefore:    start,
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		DNSNames:     dns,
		IPAddresses:  ips,
		URIs:         []*url.URL{uri},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, pub, ca.key)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), nil
}

// NodeID is the node a certificate from ca names, after checking that it
// chains to ca, is valid at now, and carries exactly one node identity.
func (ca *CA) NodeID(cert *x509.Certificate, now time.Time) (string, error) {
	if _, err := cert.Verify(x509.VerifyOptions{Roots: pool(ca.Cert), CurrentTime: now, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		return "", fmt.Errorf("%w: %v", ErrIdentity, err)
	}
	if len(cert.URIs) != 1 {
		return "", fmt.Errorf("%w: want one URI SAN, got %d", ErrIdentity, len(cert.URIs))
	}
	id, ok := strings.CutPrefix(cert.URIs[0].String(), NodeURI(""))
	if !ok || ValidateNodeID(id) != nil {
		return "", fmt.Errorf("%w: %s is not a node", ErrIdentity, cert.URIs[0])
	}
	return id, nil
}
