// Package cacerts holds the extra CA certificates an operator trusts
// (`serve --ca-certificates FILE`): a TLS-intercepting corporate proxy's CA,
// say. They are added to the trust store of every sandbox and every template
// build, so pip, npm, curl, apt and git over HTTPS work behind such a proxy.
package cacerts

import (
	"bytes"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

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
