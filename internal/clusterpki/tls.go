package clusterpki

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"slices"
)

// NodeServerConfig is the node's listener: it presents the node's
// certificate and accepts only a client certificate from the cluster CA
// that carries the control plane's identity. Another node's certificate,
// although from the same CA, is refused: a compromised node cannot call
// its peers.
func NodeServerConfig(cert tls.Certificate, ca *x509.Certificate) *tls.Config {
	roots := pool(ca)
	return &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{cert},
		ClientAuth:   tls.RequireAndVerifyClientCert,
		ClientCAs:    roots,
		VerifyConnection: func(cs tls.ConnectionState) error {
			return verifyPeer(cs.PeerCertificates, roots, x509.ExtKeyUsageClientAuth, ControlPlaneURI)
		},
	}
}

// ControlPlaneClientConfig is the control plane dialling node nodeID: it
// presents its own certificate and accepts only a server certificate from
// the cluster CA naming that very node, whatever address answered (so a
// node that took over another's address cannot pose as it).
func ControlPlaneClientConfig(cert tls.Certificate, ca *x509.Certificate, nodeID string) *tls.Config {
	roots := pool(ca)
	want := NodeURI(nodeID)
	return &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{cert},
		// Host names are not identities here: VerifyConnection checks the
		// chain and the URI SAN in place of Go's host-name check.
		InsecureSkipVerify: true,
		VerifyConnection: func(cs tls.ConnectionState) error {
			return verifyPeer(cs.PeerCertificates, roots, x509.ExtKeyUsageServerAuth, want)
		},
	}
}

// JoinClientConfig is a joining node's view of the control plane: the
// server must present, in its chain, a CA whose key matches pin and a
// control-plane certificate that CA signed. Only then does the node send
// its token, so an impostor never receives one.
func JoinClientConfig(pin string) (*tls.Config, error) {
	pin, err := ParsePin(pin)
	if err != nil {
		return nil, err
	}
	return &tls.Config{
		MinVersion:         tls.VersionTLS13,
		ServerName:         JoinServerName,
		InsecureSkipVerify: true, // replaced by the pin check below
		VerifyConnection: func(cs tls.ConnectionState) error {
			var ca *x509.Certificate
			for _, c := range cs.PeerCertificates {
				if c.IsCA && Pin(c) == pin {
					ca = c
					break
				}
			}
			if ca == nil {
				return fmt.Errorf("%w: no certificate in the server's chain has the key %s", ErrPinMismatch, pin)
			}
			return verifyPeer(cs.PeerCertificates, pool(ca), x509.ExtKeyUsageServerAuth, ControlPlaneURI)
		},
	}, nil
}

func pool(ca *x509.Certificate) *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca)
	return p
}

// verifyPeer checks that the peer's leaf chains to roots for usage and
// carries exactly the identity want.
func verifyPeer(certs []*x509.Certificate, roots *x509.CertPool, usage x509.ExtKeyUsage, want string) error {
	if len(certs) == 0 {
		return fmt.Errorf("%w: no certificate presented", ErrIdentity)
	}
	leaf := certs[0]
	inter := x509.NewCertPool()
	for _, c := range certs[1:] {
		inter.AddCert(c)
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{usage}}); err != nil {
		return fmt.Errorf("%w: %v", ErrIdentity, err)
	}
	var got []string
	for _, u := range leaf.URIs {
		got = append(got, u.String())
	}
	if !slices.Equal(got, []string{want}) {
		return fmt.Errorf("%w: peer is %v, want %s", ErrIdentity, got, want)
	}
	return nil
}

// VerifyControlPlane checks that certs (a TLS peer chain) is a control-plane
// certificate from ca: what a node calling the control plane accepts.
func VerifyControlPlane(certs []*x509.Certificate, ca *x509.Certificate) error {
	return verifyPeer(certs, pool(ca), x509.ExtKeyUsageServerAuth, ControlPlaneURI)
}
