// Package image is Cubicle's local image store: an OCI image layout directory
// on disk, a registry (OCI distribution API) view of it for BuildKit to pull
// from and push to, and helpers to import root filesystems and to unpack an
// image into a directory a sandbox can boot from.
//
// Layout on disk (dir passed to Open):
//
//	oci-layout            {"imageLayoutVersion":"1.0.0"}
//	index.json            one descriptor per tag, annotated with
//	                      org.opencontainers.image.ref.name = "repo:tag"
//	blobs/sha256/<hex>    content-addressed blobs, written tmp+rename
//	uploads/<id>          in-flight registry uploads (wiped on Open)
//
// Blobs are never held in memory: reads stream from files, and uploads stream
// into files. Only index.json is read and rewritten (atomically) under the
// store lock.
package image

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"sort"
	"strings"
	"sync"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/partial"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// AnnotationRefName is the OCI annotation that carries an index entry's name.
const AnnotationRefName = "org.opencontainers.image.ref.name"

var (
	// ErrNotFound: no image (or blob) by that name or digest.
	ErrNotFound = errors.New("image: not found")
	// ErrInvalidRef: the reference cannot be normalised to repo:tag.
	ErrInvalidRef = errors.New("image: invalid reference")
	// ErrUnsafePath: an archive entry would land outside the destination.
	ErrUnsafePath = errors.New("image: path escapes destination")
	// ErrDigestMismatch: uploaded content does not hash to the claimed digest.
	ErrDigestMismatch = errors.New("image: digest mismatch")
	// ErrUnsupported: a manifest or archive kind the store does not handle.
	ErrUnsupported = errors.New("image: unsupported format")
)

// gcGrace protects blobs written recently from garbage collection: a push
// uploads blobs before the manifest that references them, so a Delete racing a
// push must not collect them.
const gcGrace = time.Hour

// Entry is one tagged image in the store.
type Entry struct {
	Ref       string // normalised "repo:tag"
	Digest    v1.Hash
	MediaType types.MediaType
	Size      int64
}

// Store is a persistent OCI image layout. Safe for concurrent use within one
// process; two processes must not open the same directory.
type Store struct {
	dir string
	mu  sync.Mutex // guards index.json
	// remote is the copy shared by every replica (SetRemote); nil: none.
	remote Remote
	// pushed holds the hex digests known to be in remote, so a blob is
	// checked there once per process.
	pushed sync.Map
}

type ociIndex struct {
	SchemaVersion int               `json:"schemaVersion"`
	MediaType     types.MediaType   `json:"mediaType,omitempty"`
	Manifests     []v1.Descriptor   `json:"manifests"`
	Annotations   map[string]string `json:"annotations,omitempty"`
}

// Open creates or opens the store at dir.
func Open(dir string) (*Store, error) {
	for _, d := range []string{filepath.Join(dir, "blobs", "sha256"), filepath.Join(dir, "uploads")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, err
		}
	}
	s := &Store{dir: dir}
	// A crashed process may leave partial uploads; nothing can resume them.
	if ents, err := os.ReadDir(filepath.Join(dir, "uploads")); err == nil {
		for _, e := range ents {
			os.RemoveAll(filepath.Join(dir, "uploads", e.Name()))
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "oci-layout")); errors.Is(err, os.ErrNotExist) {
		if err := writeFileAtomic(filepath.Join(dir, "oci-layout"), []byte(`{"imageLayoutVersion":"1.0.0"}`)); err != nil {
			return nil, err
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "index.json")); errors.Is(err, os.ErrNotExist) {
		if err := s.writeIndex(&ociIndex{SchemaVersion: 2, MediaType: types.OCIImageIndex}); err != nil {
			return nil, err
		}
	}
	if _, err := s.readIndex(); err != nil {
		return nil, err
	}
	return s, nil
}

// Dir is the layout directory.
func (s *Store) Dir() string { return s.dir }

var (
	repoRE = regexp.MustCompile(`^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*$`)
	tagRE  = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$`)
)

// NormalizeRef turns "host:port/repo:tag", "repo:tag" or "repo" into
// "repo:tag". The registry host is dropped because the store is the registry:
// an image pushed as 127.0.0.1:PORT/cubicle/x:y is the same image as
// cubicle/x:y. A digest suffix (@sha256:...) is not accepted here.
func NormalizeRef(ref string) (string, error) {
	repo, tag, err := splitRef(ref)
	if err != nil {
		return "", err
	}
	return repo + ":" + tag, nil
}

func splitRef(ref string) (repo, tag string, err error) {
	r := ref
	if strings.Contains(r, "@") {
		return "", "", fmt.Errorf("%w: %q: digest references are not names", ErrInvalidRef, ref)
	}
	if i := strings.IndexByte(r, '/'); i > 0 {
		first := r[:i]
		if strings.ContainsAny(first, ".:") || first == "localhost" {
			r = r[i+1:]
		}
	}
	repo, tag = r, "latest"
	if i := strings.LastIndexByte(r, ':'); i >= 0 && !strings.Contains(r[i:], "/") {
		repo, tag = r[:i], r[i+1:]
	}
	if !repoRE.MatchString(repo) || !tagRE.MatchString(tag) {
		return "", "", fmt.Errorf("%w: %q", ErrInvalidRef, ref)
	}
	return repo, tag, nil
}

// Put stores img under ref, replacing any image of that name.
func (s *Store) Put(ref string, img v1.Image) error {
	name, err := NormalizeRef(ref)
	if err != nil {
		return err
	}
	layers, err := img.Layers()
	if err != nil {
		return err
	}
	for _, l := range layers {
		h, err := l.Digest()
		if err != nil {
			return err
		}
		if s.hasBlob(h) {
			continue
		}
		rc, err := l.Compressed()
		if err != nil {
			return err
		}
		_, err = s.writeBlob(rc, h)
		rc.Close()
		if err != nil {
			return err
		}
	}
	cfg, err := img.RawConfigFile()
	if err != nil {
		return err
	}
	cfgName, err := img.ConfigName()
	if err != nil {
		return err
	}
	if _, err := s.writeBlob(bytes.NewReader(cfg), cfgName); err != nil {
		return err
	}
	raw, err := img.RawManifest()
	if err != nil {
		return err
	}
	mt, err := img.MediaType()
	if err != nil {
		return err
	}
	h, err := s.writeBlob(bytes.NewReader(raw), v1.Hash{})
	if err != nil {
		return err
	}
	return s.tag(name, v1.Descriptor{MediaType: mt, Size: int64(len(raw)), Digest: h})
}

// tag points name at desc in index.json, and in the remote first when
// there is one.
func (s *Store) tag(name string, desc v1.Descriptor) error {
	if err := s.pushTag(name, desc); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.tagLocked(name, desc)
}

func (s *Store) tagLocked(name string, desc v1.Descriptor) error {
	idx, err := s.readIndex()
	if err != nil {
		return err
	}
	out := idx.Manifests[:0]
	for _, d := range idx.Manifests {
		if d.Annotations[AnnotationRefName] != name {
			out = append(out, d)
		}
	}
	desc.Annotations = map[string]string{AnnotationRefName: name}
	idx.Manifests = append(out, desc)
	return s.writeIndex(idx)
}

// Resolve returns the descriptor tagged ref.
func (s *Store) Resolve(ref string) (v1.Descriptor, error) {
	name, err := NormalizeRef(ref)
	if err != nil {
		return v1.Descriptor{}, err
	}
	s.mu.Lock()
	idx, err := s.readIndex()
	s.mu.Unlock()
	if err != nil {
		return v1.Descriptor{}, err
	}
	for _, d := range idx.Manifests {
		if d.Annotations[AnnotationRefName] == name {
			return d, nil
		}
	}
	// Tagged through another replica: the shared store has it.
	d, err := s.fetchTag(name)
	if err != nil {
		return v1.Descriptor{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.tagLocked(name, d); err != nil {
		return v1.Descriptor{}, err
	}
	d.Annotations = map[string]string{AnnotationRefName: name}
	return d, nil
}

// Get returns the image tagged ref. For an image index it picks the
// linux/GOARCH manifest, since that is what a sandbox here can run.
func (s *Store) Get(ref string) (v1.Image, error) {
	d, err := s.Resolve(ref)
	if err != nil {
		return nil, err
	}
	return s.imageByDescriptor(d)
}

func (s *Store) imageByDescriptor(d v1.Descriptor) (v1.Image, error) {
	raw, err := s.readBlob(d.Digest)
	if err != nil {
		return nil, err
	}
	mt := d.MediaType
	if mt == "" {
		mt = sniffMediaType(raw)
	}
	switch {
	case mt.IsImage():
		return partial.CompressedToImage(&storeImage{s: s, manifest: raw, mediaType: mt})
	case mt.IsIndex():
		var ix v1.IndexManifest
		if err := json.Unmarshal(raw, &ix); err != nil {
			return nil, err
		}
		for _, c := range ix.Manifests {
			if c.Platform != nil && c.Platform.OS == "linux" && c.Platform.Architecture == runtime.GOARCH && c.MediaType.IsImage() {
				return s.imageByDescriptor(c)
			}
		}
		return nil, fmt.Errorf("%w: no linux/%s image in index %s", ErrNotFound, runtime.GOARCH, d.Digest)
	}
	return nil, fmt.Errorf("%w: media type %q", ErrUnsupported, mt)
}

// List returns every tagged image, sorted by name.
func (s *Store) List() ([]Entry, error) {
	s.mu.Lock()
	idx, err := s.readIndex()
	s.mu.Unlock()
	if err != nil {
		return nil, err
	}
	var out []Entry
	for _, d := range idx.Manifests {
		if n := d.Annotations[AnnotationRefName]; n != "" {
			out = append(out, Entry{Ref: n, Digest: d.Digest, MediaType: d.MediaType, Size: d.Size})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Ref < out[j].Ref })
	return out, nil
}

// Delete untags ref and collects blobs no remaining image references.
func (s *Store) Delete(ref string) error {
	name, err := NormalizeRef(ref)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	idx, err := s.readIndex()
	if err != nil {
		return err
	}
	out := idx.Manifests[:0]
	found := false
	for _, d := range idx.Manifests {
		if d.Annotations[AnnotationRefName] == name {
			found = true
			continue
		}
		out = append(out, d)
	}
	if s.remote != nil {
		// Gone for every replica, not only from this index.
		if _, err := s.fetchTag(name); err == nil {
			found = true
		} else if !errors.Is(err, ErrNotFound) {
			return err
		}
		if err := s.dropTag(name); err != nil {
			return err
		}
	}
	if !found {
		return fmt.Errorf("%w: %s", ErrNotFound, name)
	}
	idx.Manifests = out
	if err := s.writeIndex(idx); err != nil {
		return err
	}
	return s.gcLocked(idx)
}

// gcLocked removes blobs unreachable from idx that are older than gcGrace.
func (s *Store) gcLocked(idx *ociIndex) error {
	keep := map[string]bool{}
	var walk func(d v1.Descriptor)
	walk = func(d v1.Descriptor) {
		if keep[d.Digest.Hex] {
			return
		}
		keep[d.Digest.Hex] = true
		raw, err := s.readBlob(d.Digest)
		if err != nil {
			return
		}
		mt := d.MediaType
		if mt == "" {
			mt = sniffMediaType(raw)
		}
		switch {
		case mt.IsImage():
			var m v1.Manifest
			if json.Unmarshal(raw, &m) == nil {
				keep[m.Config.Digest.Hex] = true
				for _, l := range m.Layers {
					keep[l.Digest.Hex] = true
				}
			}
		case mt.IsIndex():
			var ix v1.IndexManifest
			if json.Unmarshal(raw, &ix) == nil {
				for _, c := range ix.Manifests {
					walk(c)
				}
			}
		}
	}
	for _, d := range idx.Manifests {
		walk(d)
	}
	dir := filepath.Join(s.dir, "blobs", "sha256")
	ents, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	cutoff := time.Now().Add(-gcGrace)
	for _, e := range ents {
		if keep[e.Name()] {
			continue
		}
		if info, err := e.Info(); err == nil && info.ModTime().Before(cutoff) {
			os.Remove(filepath.Join(dir, e.Name()))
		}
	}
	return nil
}

func (s *Store) readIndex() (*ociIndex, error) {
	b, err := os.ReadFile(filepath.Join(s.dir, "index.json"))
	if err != nil {
		return nil, err
	}
	var idx ociIndex
	if err := json.Unmarshal(b, &idx); err != nil {
		return nil, fmt.Errorf("image: %s/index.json: %w", s.dir, err)
	}
	return &idx, nil
}

func (s *Store) writeIndex(idx *ociIndex) error {
	if idx.Manifests == nil {
		idx.Manifests = []v1.Descriptor{}
	}
	b, err := json.MarshalIndent(idx, "", "  ")
	if err != nil {
		return err
	}
	return writeFileAtomic(filepath.Join(s.dir, "index.json"), b)
}

func (s *Store) blobPath(h v1.Hash) string {
	return filepath.Join(s.dir, "blobs", h.Algorithm, h.Hex)
}

func (s *Store) hasBlob(h v1.Hash) bool {
	if h.Algorithm != "sha256" || len(h.Hex) != 64 {
		return false
	}
	if _, err := os.Stat(s.blobPath(h)); err == nil {
		return true
	}
	return s.remoteHas(h)
}

// openBlob opens a blob for streaming.
func (s *Store) openBlob(h v1.Hash) (*os.File, error) {
	if h.Algorithm != "sha256" || len(h.Hex) != 64 {
		return nil, fmt.Errorf("%w: blob %s", ErrNotFound, h)
	}
	f, err := os.Open(s.blobPath(h))
	if errors.Is(err, os.ErrNotExist) {
		// Written through another replica (or before this data dir was
		// wiped): read it through, verified, into the local store.
		if err := s.fetchBlob(h); err != nil {
			return nil, err
		}
		f, err = os.Open(s.blobPath(h))
	}
	return f, err
}

// readBlob reads a small blob (manifest, config) whole.
func (s *Store) readBlob(h v1.Hash) ([]byte, error) {
	f, err := s.openBlob(h)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(f)
}

// writeBlob streams r into the blob store. If want is set the content must
// hash to it. Returns the content's digest.
func (s *Store) writeBlob(r io.Reader, want v1.Hash) (v1.Hash, error) {
	dir := filepath.Join(s.dir, "blobs", "sha256")
	f, err := os.CreateTemp(dir, ".tmp-")
	if err != nil {
		return v1.Hash{}, err
	}
	defer os.Remove(f.Name())
	hh := sha256.New()
	if _, err := io.Copy(io.MultiWriter(f, hh), r); err != nil {
		f.Close()
		return v1.Hash{}, err
	}
	if err := f.Close(); err != nil {
		return v1.Hash{}, err
	}
	got := v1.Hash{Algorithm: "sha256", Hex: hex.EncodeToString(hh.Sum(nil))}
	if want.Hex != "" && want != got {
		return v1.Hash{}, fmt.Errorf("%w: want %s, got %s", ErrDigestMismatch, want, got)
	}
	return got, s.commitBlob(f.Name(), got)
}

// commitBlob moves a fully written, verified file into place, after
// writing it to the remote when there is one.
func (s *Store) commitBlob(tmp string, h v1.Hash) error {
	if err := s.pushBlob(tmp, h); err != nil {
		return err
	}
	return s.placeBlob(tmp, h)
}

// placeBlob moves a verified file into the local store.
func (s *Store) placeBlob(tmp string, h v1.Hash) error {
	if err := os.Chmod(tmp, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, s.blobPath(h))
}

func sniffMediaType(raw []byte) types.MediaType {
	var m struct {
		MediaType types.MediaType `json:"mediaType"`
		Manifests json.RawMessage `json:"manifests"`
	}
	if json.Unmarshal(raw, &m) != nil {
		return ""
	}
	if m.MediaType != "" {
		return m.MediaType
	}
	if m.Manifests != nil {
		return types.OCIImageIndex
	}
	return types.OCIManifestSchema1
}

func writeFileAtomic(path string, b []byte) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Chmod(f.Name(), 0o644); err != nil {
		return err
	}
	return os.Rename(f.Name(), path)
}

// storeImage is a v1.Image whose blobs stream from the store.
type storeImage struct {
	s         *Store
	manifest  []byte
	mediaType types.MediaType
	parsed    *v1.Manifest
}

func (i *storeImage) RawManifest() ([]byte, error)        { return i.manifest, nil }
func (i *storeImage) MediaType() (types.MediaType, error) { return i.mediaType, nil }
func (i *storeImage) RawConfigFile() ([]byte, error) {
	m, err := i.m()
	if err != nil {
		return nil, err
	}
	return i.s.readBlob(m.Config.Digest)
}

func (i *storeImage) LayerByDigest(h v1.Hash) (partial.CompressedLayer, error) {
	m, err := i.m()
	if err != nil {
		return nil, err
	}
	if h == m.Config.Digest {
		return &storeLayer{s: i.s, desc: m.Config}, nil
	}
	for _, l := range m.Layers {
		if l.Digest == h {
			return &storeLayer{s: i.s, desc: l}, nil
		}
	}
	return nil, fmt.Errorf("%w: layer %s", ErrNotFound, h)
}

func (i *storeImage) m() (*v1.Manifest, error) {
	if i.parsed == nil {
		m, err := v1.ParseManifest(bytes.NewReader(i.manifest))
		if err != nil {
			return nil, err
		}
		i.parsed = m
	}
	return i.parsed, nil
}

type storeLayer struct {
	s    *Store
	desc v1.Descriptor
}

func (l *storeLayer) Digest() (v1.Hash, error)            { return l.desc.Digest, nil }
func (l *storeLayer) Size() (int64, error)                { return l.desc.Size, nil }
func (l *storeLayer) MediaType() (types.MediaType, error) { return l.desc.MediaType, nil }
func (l *storeLayer) Compressed() (io.ReadCloser, error)  { return l.s.openBlob(l.desc.Digest) }

// blobSize is a blob's size, read through from the remote when missing.
func (s *Store) blobSize(h v1.Hash) (int64, error) {
	f, err := s.openBlob(h)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return 0, err
	}
	return fi.Size(), nil
}
