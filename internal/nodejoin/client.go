package nodejoin

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"

	"github.com/cubicle-dev/cubicle/internal/clusterpki"
)

// Files a joined node keeps in its data dir.
const (
	KeyFile  = "node.key" // 0600, made here, never sent
	CertFile = "node.crt"
	CAFile   = "ca.crt"
	InfoFile = "node.json" // the node ID, control plane and labels
)

var (
	// ErrInsecureURL: the control plane URL is not https (the token would
	// travel in clear, to whoever answers).
	ErrInsecureURL = errors.New("nodejoin: control plane URL must be https")
	// ErrAlreadyJoined: the data dir holds a node certificate already.
	ErrAlreadyJoined = errors.New("nodejoin: data dir already holds a node certificate")
	// ErrBadResponse: the control plane answered with something that is
	// not a certificate for this node's key from the pinned CA.
	ErrBadResponse = errors.New("nodejoin: control plane's answer refused")
)

// ServerError is the control plane's e2b-shaped error answer.
type ServerError struct {
	Status  int
	Message string
}

func (e *ServerError) Error() string {
	return fmt.Sprintf("control plane answered %d: %s", e.Status, e.Message)
}

// Options are a node's join parameters.
type Options struct {
	ControlPlane string // https URL of the control plane's API
	Token        string
	Pin          string // sha256:<hex> of the cluster CA's public key
	NodeID       string
	Addresses    []string
	DataDir      string
}

// Info is InfoFile's content.
type Info struct {
	NodeID       string            `json:"nodeID"`
	ControlPlane string            `json:"controlPlane"` // its URL
	Identity     string            `json:"identity"`     // its URI SAN
	Labels       map[string]string `json:"labels"`
}

// Join makes the node's key in opts.DataDir, sends a CSR with the token
// over TLS that must verify against the pinned CA (the token is never
// written to a connection that failed that check), checks the answer and
// writes the certificate and CA beside the key.
func Join(ctx context.Context, opts Options) (*Info, error) {
	u, err := url.Parse(opts.ControlPlane)
	if err != nil || u.Scheme != "https" || u.Host == "" {
		return nil, fmt.Errorf("%w: %q", ErrInsecureURL, opts.ControlPlane)
	}
	tlsConf, err := clusterpki.JoinClientConfig(opts.Pin)
	if err != nil {
		return nil, err
	}
	pin, _ := clusterpki.ParsePin(opts.Pin)
	if _, _, err := ParseToken(opts.Token); err != nil {
		return nil, err
	}
	if err := clusterpki.ValidateNodeID(opts.NodeID); err != nil {
		return nil, err
	}
	if _, _, err := clusterpki.ParseAddresses(opts.Addresses); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(opts.DataDir, 0o700); err != nil {
		return nil, err
	}
	if _, err := os.Stat(filepath.Join(opts.DataDir, CertFile)); !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%w: %s (remove the node's files to join again)", ErrAlreadyJoined, filepath.Join(opts.DataDir, CertFile))
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, err
	}
	if err := WriteFile(filepath.Join(opts.DataDir, KeyFile), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})); err != nil {
		return nil, err
	}
	csr, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{CommonName: "node " + opts.NodeID}}, key)
	if err != nil {
		return nil, err
	}
	body, _ := json.Marshal(Request{
		Token: opts.Token, NodeID: opts.NodeID, Addresses: opts.Addresses,
		CSR: string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: csr})),
	})
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: tlsConf, Proxy: http.ProxyFromEnvironment, ForceAttemptHTTP2: true},
		// A redirect could lead the token to another server.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	defer client.CloseIdleConnections()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimSuffix(u.String(), "/")+Path, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		var e struct {
			Message string `json:"message"`
		}
		if json.Unmarshal(raw, &e) != nil || e.Message == "" {
			e.Message = strings.TrimSpace(string(raw))
		}
		return nil, &ServerError{Status: resp.StatusCode, Message: e.Message}
	}
	var out Response
	if err := json.Unmarshal(raw, &out); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrBadResponse, err)
	}
	if err := checkResponse(&out, key, opts.NodeID, pin); err != nil {
		return nil, err
	}
	info := &Info{NodeID: opts.NodeID, ControlPlane: u.String(), Identity: out.ControlPlane, Labels: out.Labels}
	infoJSON, _ := json.MarshalIndent(info, "", "  ")
	for _, f := range []struct {
		name string
		data []byte
	}{{CAFile, []byte(out.CA)}, {InfoFile, append(infoJSON, '\n')}, {CertFile, []byte(out.Certificate)}} {
		if err := WriteFile(filepath.Join(opts.DataDir, f.name), f.data); err != nil {
			return nil, err
		}
	}
	return info, nil
}

// checkResponse: the CA is the pinned one, and the certificate is for our
// key and our node ID, and chains to that CA.
func checkResponse(r *Response, key *ecdsa.PrivateKey, nodeID, pin string) error {
	ca, err := clusterpki.ParseCertPEM([]byte(r.CA))
	if err != nil {
		return fmt.Errorf("%w: CA: %v", ErrBadResponse, err)
	}
	if clusterpki.Pin(ca) != pin {
		return fmt.Errorf("%w: CA %s is not the pinned %s", ErrBadResponse, clusterpki.Pin(ca), pin)
	}
	cert, err := clusterpki.ParseCertPEM([]byte(r.Certificate))
	if err != nil {
		return fmt.Errorf("%w: certificate: %v", ErrBadResponse, err)
	}
	if !key.PublicKey.Equal(cert.PublicKey) {
		return fmt.Errorf("%w: certificate is not for this node's key", ErrBadResponse)
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca)
	if _, err := cert.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}}); err != nil {
		return fmt.Errorf("%w: %v", ErrBadResponse, err)
	}
	if len(cert.URIs) != 1 || cert.URIs[0].String() != clusterpki.NodeURI(nodeID) {
		return fmt.Errorf("%w: certificate names %v, not %s", ErrBadResponse, cert.URIs, clusterpki.NodeURI(nodeID))
	}
	if r.ControlPlane != clusterpki.ControlPlaneURI {
		return fmt.Errorf("%w: control plane identity %q", ErrBadResponse, r.ControlPlane)
	}
	return nil
}

// WriteFile replaces path atomically, 0600 from the start (node run's
// certificate renewal uses it too).
func WriteFile(path string, data []byte) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	_, werr := f.Write(data)
	if cerr := f.Close(); werr == nil {
		werr = cerr
	}
	if werr == nil {
		werr = os.Rename(f.Name(), path)
	}
	if werr != nil {
		os.Remove(f.Name())
	}
	return werr
}
