// Package cacerts holds the extra CA certificates an operator trusts
// (`serve --ca-certificates FILE`): a TLS-intercepting corporate proxy's CA,
// say. They are added to the trust store of every sandbox and every template
// build, so pip, npm, curl, apt and git over HTTPS work behind such a proxy.
package cacerts

import (
	"bytes"
	"crypto/rand"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// ErrInvalid is a certificates file that is not PEM certificates.
var ErrInvalid = errors.New("cacerts: invalid certificates file")

const (
	// BundlePath is Debian's (and Ubuntu's, Alpine's) system bundle: what
	// OpenSSL, GnuTLS, Debian's pip and requests read by default.
	BundlePath = "/etc/ssl/certs/ca-certificates.crt"
	// LocalPath is where update-ca-certificates looks for local CAs, so a
	// later `update-ca-certificates` in the sandbox keeps them.
	LocalPath = "/usr/local/share/ca-certificates/cubicle-extra.crt"
	// maxBundle bounds what is read from an image's bundle (Debian's is
	// about 220 KiB).
	maxBundle = 16 << 20
)

// Set is a validated list of CA certificates, as PEM.
type Set struct {
	pem   []byte
	count int
}

// Load reads PEM certificates from path. Anything but CERTIFICATE blocks
// (keys included) is refused, as is a file with no certificate.
func Load(path string) (*Set, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return Parse(b)
}

// Parse validates PEM certificates; see Load.
func Parse(b []byte) (*Set, error) {
	var out bytes.Buffer
	n := 0
	rest := b
	for {
		var blk *pem.Block
		blk, rest = pem.Decode(rest)
		if blk == nil {
			break
		}
		if blk.Type != "CERTIFICATE" {
			return nil, fmt.Errorf("%w: PEM block %d is %q, not CERTIFICATE", ErrInvalid, n+1, blk.Type)
		}
		if _, err := x509.ParseCertificate(blk.Bytes); err != nil {
			return nil, fmt.Errorf("%w: certificate %d: %v", ErrInvalid, n+1, err)
		}
		if err := pem.Encode(&out, &pem.Block{Type: "CERTIFICATE", Bytes: blk.Bytes}); err != nil {
			return nil, err
		}
		n++
	}
	if n == 0 {
		return nil, fmt.Errorf("%w: no PEM certificate found", ErrInvalid)
	}
	if len(bytes.TrimSpace(rest)) != 0 {
		return nil, fmt.Errorf("%w: trailing data after certificate %d", ErrInvalid, n)
	}
	return &Set{pem: out.Bytes(), count: n}, nil
}

// PEM is the certificates, re-encoded.
func (s *Set) PEM() []byte { return bytes.Clone(s.pem) }

// Len is the number of certificates.
func (s *Set) Len() int { return s.count }

// Env is what a sandbox's processes get beside the system bundle, for the
// clients that do not read it: Node.js has its own CA list
// (NODE_EXTRA_CA_CERTS adds to it), and requests/httpx in a venv use certifi
// unless told otherwise. All point at the system bundle, which holds the
// extra certificates.
func Env() map[string]string {
	return map[string]string{
		"NODE_EXTRA_CA_CERTS": BundlePath,
		"REQUESTS_CA_BUNDLE":  BundlePath,
		"SSL_CERT_FILE":       BundlePath,
	}
}

// SandboxFiles are the files a sandbox's writable layer starts with: the
// image's bundle (read from layers, top-most first) with the certificates
// appended, and the certificates alone where update-ca-certificates finds
// them.
func (s *Set) SandboxFiles(layers []string) (map[string][]byte, error) {
	base, err := ReadLayered(layers, BundlePath)
	if err != nil {
		return nil, err
	}
	return map[string][]byte{
		BundlePath: s.appendTo(base),
		LocalPath:  s.PEM(),
	}, nil
}

// BuildBundle is the bundle a template build's RUN steps trust: the host's
// system bundle (the build's base image is not on disk yet) with the
// certificates appended.
func (s *Set) BuildBundle() []byte {
	host, _ := readCapped(BundlePath)
	return s.appendTo(host)
}

func (s *Set) appendTo(base []byte) []byte {
	out := bytes.Clone(base)
	if len(out) > 0 && out[len(out)-1] != '\n' {
		out = append(out, '\n')
	}
	return append(out, s.pem...)
}

// ReadLayered reads path from the top-most layer that has it. Each layer is
// an image directory that may come from a user's build, so the path is
// resolved inside the layer (RESOLVE_IN_ROOT: a symlink cannot lead out to
// the host). A layer without it, or without a regular file there, is
// skipped; no layer having it is not an error (nil, nil).
func ReadLayered(layers []string, path string) ([]byte, error) {
	for _, root := range layers {
		b, err := readInRoot(root, path)
		if err == nil {
			return b, nil
		}
		if !errors.Is(err, unix.ENOENT) && !errors.Is(err, unix.ENOTDIR) && !errors.Is(err, errNotRegular) {
			return nil, fmt.Errorf("cacerts: read %s in %s: %w", path, root, err)
		}
	}
	return nil, nil
}

var errNotRegular = errors.New("not a regular file")

func readInRoot(root, path string) ([]byte, error) {
	dfd, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer unix.Close(dfd)
	fd, err := unix.Openat2(dfd, filepath.Clean("/"+path), &unix.OpenHow{
		Flags:   unix.O_RDONLY | unix.O_CLOEXEC | unix.O_NONBLOCK,
		Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV,
	})
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(fd), path)
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, errNotRegular
	}
	return readAllCapped(f)
}

func readCapped(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return readAllCapped(f)
}

func readAllCapped(r io.Reader) ([]byte, error) {
	b, err := io.ReadAll(io.LimitReader(r, maxBundle+1))
	if err != nil {
		return nil, err
	}
	if len(b) > maxBundle {
		return nil, fmt.Errorf("bundle larger than %d bytes", maxBundle)
	}
	return b, nil
}

// EgressPath is where a sandbox keeps the node's interception CA
// (internal/egress), apart from the operator's, so update-ca-certificates
// keeps it and it is easy to find.
const EgressPath = "/usr/local/share/ca-certificates/cubicle-egress.crt"

// Install adds s to the trust store of the tree at dir (a sandbox's "/",
// as its agent sees it): appended to the system bundle unless every
// certificate is already in it, and written alone at local. It is
// idempotent. Both files are replaced by rename, so a client reading the
// bundle meanwhile gets the old one or the new one, whole. Every path stays
// inside dir (RESOLVE_IN_ROOT to read, os.Root to write), so a symlink in
// the tree cannot lead a write elsewhere.
func (s *Set) Install(dir, local string) error {
	cur, err := readInRoot(dir, BundlePath)
	if errors.Is(err, unix.ENOENT) {
		cur, err = nil, nil
	}
	if err != nil {
		return fmt.Errorf("cacerts: read %s: %w", BundlePath, err)
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return err
	}
	defer root.Close()
	if !s.containedIn(cur) {
		if err := replace(root, relative(BundlePath), s.appendTo(cur)); err != nil {
			return fmt.Errorf("cacerts: write %s: %w", BundlePath, err)
		}
	}
	if err := replace(root, relative(local), s.PEM()); err != nil {
		return fmt.Errorf("cacerts: write %s: %w", local, err)
	}
	return nil
}

// containedIn: every certificate of s is in bundle, as Install writes it.
func (s *Set) containedIn(bundle []byte) bool {
	rest := s.pem
	for {
		var blk *pem.Block
		start := rest
		blk, rest = pem.Decode(rest)
		if blk == nil {
			return true
		}
		if !bytes.Contains(bundle, start[:len(start)-len(rest)]) {
			return false
		}
	}
}

func relative(p string) string { return strings.TrimPrefix(filepath.Clean("/"+p), "/") }

// replace writes data to name under root through a temporary file in the
// same directory and a rename.
func replace(root *os.Root, name string, data []byte) error {
	dir := filepath.Dir(name)
	if err := root.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	var suffix [8]byte
	if _, err := rand.Read(suffix[:]); err != nil {
		return err
	}
	tmp := filepath.Join(dir, ".cubicle-ca-"+hex.EncodeToString(suffix[:]))
	f, err := root.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return err
	}
	_, werr := f.Write(data)
	if err := errors.Join(werr, f.Chmod(0o644), f.Close()); err != nil {
		_ = root.Remove(tmp)
		return err
	}
	if err := root.Rename(tmp, name); err != nil {
		_ = root.Remove(tmp)
		return err
	}
	return nil
}
