package image

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/cubicle-dev/cubicle/internal/errdefs"
)

// Remote is a durable object store shared by every control-plane replica
// (serve --image-store: S3 through snapstore.Store). With one set, the
// local layout is a cache of it:
//
//   - every blob (layer, config, manifest) is written to the remote under
//     "blobs/sha256/<hex>" before the local write returns, and every tag
//     under "tags/<repo>:<tag>" (its descriptor as JSON);
//   - a blob missing locally is read through from the remote, written to
//     a file while hashed, and kept only when it hashes to its digest
//     (ErrDigestMismatch otherwise: a replaced object is refused);
//   - a tag missing locally is looked up in the remote and cached in the
//     local index.
//
// Blobs are never removed from the remote: another replica, or a build
// row, may still name them (Store.Delete removes the tag and this
// replica's local copies only).
type Remote interface {
	PutObject(ctx context.Context, key string, r io.Reader, size int64) error
	// GetObject fails with an error of class errdefs.ErrNotFound when
	// there is no object under key.
	GetObject(ctx context.Context, key string) (io.ReadCloser, error)
	HasObject(ctx context.Context, key string) (bool, error)
	RemoveObject(ctx context.Context, key string) error
}

// ErrRemote: the shared image store refused or could not be reached.
var ErrRemote = errdefs.NewReason(errdefs.ErrUnavailable, "image_store_unavailable", "image: shared image store")

// remoteTimeout bounds one remote call: a layer of a few GiB over a slow
// link, not a hung connection forever.
const remoteTimeout = 30 * time.Minute

// maxTagSize bounds a tag object (a descriptor): a replaced tag object
// cannot make the store read an unbounded body.
const maxTagSize = 64 << 10

// SetRemote makes r the shared copy of this store (nil: local only).
// Call it once, before the store is used.
func (s *Store) SetRemote(r Remote) { s.remote = r }

func blobKey(h v1.Hash) string  { return "blobs/" + h.Algorithm + "/" + h.Hex }
func tagKey(name string) string { return "tags/" + name }

func remoteCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), remoteTimeout)
}

// pushBlob writes the verified file path (blob h) to the remote unless it
// is known to be there already.
func (s *Store) pushBlob(path string, h v1.Hash) error {
	if s.remote == nil {
		return nil
	}
	if _, ok := s.pushed.Load(h.Hex); ok {
		return nil
	}
	ctx, cancel := remoteCtx()
	defer cancel()
	if ok, err := s.remote.HasObject(ctx, blobKey(h)); err != nil {
		return fmt.Errorf("%w: %v", ErrRemote, err)
	} else if !ok {
		f, err := os.Open(path)
		if err != nil {
			return err
		}
		defer f.Close()
		fi, err := f.Stat()
		if err != nil {
			return err
		}
		if err := s.remote.PutObject(ctx, blobKey(h), f, fi.Size()); err != nil {
			return fmt.Errorf("%w: %v", ErrRemote, err)
		}
	}
	s.pushed.Store(h.Hex, struct{}{})
	return nil
}

// remoteHas reports whether the remote holds blob h.
func (s *Store) remoteHas(h v1.Hash) bool {
	if s.remote == nil {
		return false
	}
	if _, ok := s.pushed.Load(h.Hex); ok {
		return true
	}
	ctx, cancel := remoteCtx()
	defer cancel()
	ok, err := s.remote.HasObject(ctx, blobKey(h))
	return err == nil && ok
}

// fetchBlob reads blob h through from the remote into the local store,
// keeping it only when it hashes to h. ErrNotFound when the remote does
// not have it either.
func (s *Store) fetchBlob(h v1.Hash) error {
	if s.remote == nil {
		return fmt.Errorf("%w: blob %s", ErrNotFound, h)
	}
	ctx, cancel := remoteCtx()
	defer cancel()
	rc, err := s.remote.GetObject(ctx, blobKey(h))
	if errors.Is(err, errdefs.ErrNotFound) {
		return fmt.Errorf("%w: blob %s", ErrNotFound, h)
	}
	if err != nil {
		return fmt.Errorf("%w: %v", ErrRemote, err)
	}
	defer rc.Close()
	f, err := os.CreateTemp(filepath.Join(s.dir, "blobs", "sha256"), ".fetch-")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	hh := sha256.New()
	if _, err := io.Copy(io.MultiWriter(f, hh), rc); err != nil {
		f.Close()
		return fmt.Errorf("%w: read blob %s: %v", ErrRemote, h, err)
	}
	if err := f.Close(); err != nil {
		return err
	}
	if got := hex.EncodeToString(hh.Sum(nil)); got != h.Hex {
		return fmt.Errorf("%w: shared store object for %s hashes to sha256:%s", ErrDigestMismatch, h, got)
	}
	s.pushed.Store(h.Hex, struct{}{})
	return s.placeBlob(f.Name(), h)
}

// pushTag writes name's descriptor to the remote, after making sure every
// blob it reaches is there (blobs this store held before it had a remote
// are pushed now): a tag in the remote always resolves in full.
func (s *Store) pushTag(name string, desc v1.Descriptor) error {
	if s.remote == nil {
		return nil
	}
	if err := s.pushTree(desc, 0); err != nil {
		return err
	}
	b, err := json.Marshal(desc)
	if err != nil {
		return err
	}
	ctx, cancel := remoteCtx()
	defer cancel()
	if err := s.remote.PutObject(ctx, tagKey(name), bytes.NewReader(b), int64(len(b))); err != nil {
		return fmt.Errorf("%w: %v", ErrRemote, err)
	}
	return nil
}

// fetchTag looks name up in the remote. ErrNotFound when it has none.
func (s *Store) fetchTag(name string) (v1.Descriptor, error) {
	if s.remote == nil {
		return v1.Descriptor{}, fmt.Errorf("%w: %s", ErrNotFound, name)
	}
	ctx, cancel := remoteCtx()
	defer cancel()
	rc, err := s.remote.GetObject(ctx, tagKey(name))
	if errors.Is(err, errdefs.ErrNotFound) {
		return v1.Descriptor{}, fmt.Errorf("%w: %s", ErrNotFound, name)
	}
	if err != nil {
		return v1.Descriptor{}, fmt.Errorf("%w: %v", ErrRemote, err)
	}
	defer rc.Close()
	b, err := io.ReadAll(io.LimitReader(rc, maxTagSize+1))
	if err != nil {
		return v1.Descriptor{}, fmt.Errorf("%w: read tag %s: %v", ErrRemote, name, err)
	}
	var d v1.Descriptor
	if len(b) > maxTagSize || json.Unmarshal(b, &d) != nil || d.Digest.Algorithm != "sha256" || !digestRE.MatchString(d.Digest.String()) {
		return v1.Descriptor{}, fmt.Errorf("%w: shared store tag %s is not a descriptor", ErrUnsupported, name)
	}
	d.Annotations = nil
	return d, nil
}

// dropTag removes name from the remote, so that no replica resolves it
// again.
func (s *Store) dropTag(name string) error {
	if s.remote == nil {
		return nil
	}
	ctx, cancel := remoteCtx()
	defer cancel()
	if err := s.remote.RemoveObject(ctx, tagKey(name)); err != nil {
		return fmt.Errorf("%w: %v", ErrRemote, err)
	}
	return nil
}

// pushTree pushes d's blob and every blob its manifest names.
func (s *Store) pushTree(d v1.Descriptor, depth int) error {
	if depth > 2 { // an index of manifests is as deep as images go
		return fmt.Errorf("%w: manifests nested too deep", ErrUnsupported)
	}
	if err := s.pushLocal(d.Digest); err != nil {
		return err
	}
	raw, err := s.readBlob(d.Digest)
	if err != nil {
		return err
	}
	mt := d.MediaType
	if mt == "" {
		mt = sniffMediaType(raw)
	}
	switch {
	case mt.IsImage():
		var m v1.Manifest
		if err := json.Unmarshal(raw, &m); err != nil {
			return fmt.Errorf("%w: manifest %s: %v", ErrUnsupported, d.Digest, err)
		}
		for _, l := range append([]v1.Descriptor{m.Config}, m.Layers...) {
			if err := s.pushLocal(l.Digest); err != nil {
				return err
			}
		}
	case mt.IsIndex():
		var ix v1.IndexManifest
		if err := json.Unmarshal(raw, &ix); err != nil {
			return fmt.Errorf("%w: index %s: %v", ErrUnsupported, d.Digest, err)
		}
		for _, c := range ix.Manifests {
			if err := s.pushTree(c, depth+1); err != nil {
				return err
			}
		}
	}
	return nil
}

// pushLocal makes sure blob h is in the remote: pushed from the local
// file when there is one, else it must be there already.
func (s *Store) pushLocal(h v1.Hash) error {
	if h.Algorithm != "sha256" || len(h.Hex) != 64 {
		return fmt.Errorf("%w: blob %s", ErrNotFound, h)
	}
	if _, err := os.Stat(s.blobPath(h)); err == nil {
		return s.pushBlob(s.blobPath(h), h)
	}
	if !s.remoteHas(h) {
		return fmt.Errorf("%w: blob %s is in neither the local nor the shared store", ErrNotFound, h)
	}
	return nil
}

// buildUserRE is GrantBuild's user names: only these are looked up in the
// remote, so a request cannot make the store read an arbitrary key.
var buildUserRE = regexp.MustCompile(`^build-[A-Z2-7]{16}$`)

// grantTTL bounds a shared grant whose revoke could not reach the remote:
// longer than any build.
const grantTTL = 24 * time.Hour

// remoteGrant is a build's credentials as the remote keeps them: the
// password's SHA-256, never the password.
type remoteGrant struct {
	PasswordSHA256 string    `json:"passwordSHA256"`
	NotAfter       time.Time `json:"notAfter"`
	// Repo and Tag are the one image the grant may write, Reads the
	// repositories whose tags it may resolve besides Repo (grant.allows).
	Repo  string   `json:"repo"`
	Tag   string   `json:"tag"`
	Reads []string `json:"reads,omitempty"`
}

func grantKey(user string) string { return "grants/" + user }

func (s *Store) putGrant(user, password, repo, tag string, reads []string) error {
	if s.remote == nil {
		return nil
	}
	sum := sha256.Sum256([]byte(password))
	b, err := json.Marshal(remoteGrant{PasswordSHA256: hex.EncodeToString(sum[:]), NotAfter: time.Now().Add(grantTTL).UTC(), Repo: repo, Tag: tag, Reads: reads})
	if err != nil {
		return err
	}
	ctx, cancel := remoteCtx()
	defer cancel()
	if err := s.remote.PutObject(ctx, grantKey(user), bytes.NewReader(b), int64(len(b))); err != nil {
		return fmt.Errorf("%w: build credentials: %v", ErrRemote, err)
	}
	return nil
}

// dropGrant revokes a shared grant; if the remote cannot be reached the
// grant still expires at its NotAfter.
func (s *Store) dropGrant(user string) {
	if s.remote == nil {
		return
	}
	ctx, cancel := remoteCtx()
	defer cancel()
	_ = s.remote.RemoveObject(ctx, grantKey(user))
}

// checkGrant returns user/password's grant if it is a live one in the
// remote.
func (s *Store) checkGrant(user, password string) (grant, bool) {
	if s.remote == nil || !buildUserRE.MatchString(user) {
		return grant{}, false
	}
	ctx, cancel := remoteCtx()
	defer cancel()
	rc, err := s.remote.GetObject(ctx, grantKey(user))
	if err != nil {
		return grant{}, false
	}
	defer rc.Close()
	b, err := io.ReadAll(io.LimitReader(rc, maxTagSize))
	if err != nil {
		return grant{}, false
	}
	var g remoteGrant
	if json.Unmarshal(b, &g) != nil || time.Now().After(g.NotAfter) || g.Repo == "" {
		return grant{}, false
	}
	sum := sha256.Sum256([]byte(password))
	if subtle.ConstantTimeCompare([]byte(hex.EncodeToString(sum[:])), []byte(g.PasswordSHA256)) != 1 {
		return grant{}, false
	}
	return grant{repo: g.Repo, tag: g.Tag, reads: g.Reads}, true
}
