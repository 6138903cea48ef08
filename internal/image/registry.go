package image

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// maxManifestSize bounds manifest bodies, which are read into memory.
const maxManifestSize = 4 << 20

// Registry serves the OCI distribution API (pull and push) over a Store. It is
// a compact handler rather than go-containerregistry's pkg/registry because
// that one keeps manifests (and by default blobs) in memory; here everything
// lands in the layout on disk, so pushed images survive restarts.
//
// Blobs are global to the store, not per repository: any repository name can
// read any blob. That is fine for a loopback-only registry owned by one
// node; do not expose it beyond that. Template builds' RUN steps share the
// host's network (and so its loopback), so serve sets a password
// (RequireBasicAuth) that only BuildKit's session holds: a build step can
// neither read other teams' images nor push over them.
type Registry struct {
	s        *Store
	mu       sync.Mutex
	uploads  map[string]*upload
	user     string
	password string
	// grants are extra credentials, each valid for one build (GrantBuild),
	// by user name; under mu.
	grants map[string]grant
}

type upload struct {
	mu   sync.Mutex
	path string
	size int64
}

// NewRegistry returns the registry view of s.
func NewRegistry(s *Store) *Registry {
	return &Registry{s: s, uploads: map[string]*upload{}}
}

// RequireBasicAuth makes every request, /v2/ included, present these
// credentials (HTTP Basic); call it before serving.
func (r *Registry) RequireBasicAuth(user, password string) {
	r.user, r.password = user, password
}

// GrantBuild makes a fresh pair of credentials valid, besides
// RequireBasicAuth's, until revoke is called: one build's, handed to a
// builder node's buildkitd through that build's session only, so a node
// that keeps them gains nothing once the build is over. They write only
// the build's own image (blob uploads to repo, and its manifest by digest
// or as tag), and resolve tags only in repo and in reads (the build's FROM
// repositories): a builder node is hostile too, another template's tag is
// what that template's sandboxes boot, and the tags of other teams'
// templates are theirs. Reads by digest stay open, as they are to every
// node. Call it only on a registry with RequireBasicAuth.
//
// With a shared remote (Store.SetRemote) the grant, with its scope, is
// also written there (the password's SHA-256 and an expiry), so that
// every replica accepts it: a builder node's push reaches whichever
// replica its control-plane URL lands on, not necessarily the one running
// the build.
func (r *Registry) GrantBuild(repo, tag string, reads ...string) (user, password string, revoke func(), err error) {
	user, password = "build-"+rand.Text()[:16], rand.Text()
	reads = slices.Clone(reads)
	if err := r.s.putGrant(user, password, repo, tag, reads); err != nil {
		return "", "", nil, err
	}
	r.mu.Lock()
	if r.grants == nil {
		r.grants = map[string]grant{}
	}
	r.grants[user] = grant{password: password, repo: repo, tag: tag, reads: reads}
	r.mu.Unlock()
	return user, password, func() {
		r.mu.Lock()
		delete(r.grants, user)
		r.mu.Unlock()
		r.s.dropGrant(user)
	}, nil
}

// grant is one build's credentials, the image they may write and the
// repositories whose tags they may resolve besides it.
type grant struct {
	password, repo, tag string
	reads               []string
}

// allows reports whether req, from a holder of g, stays within g's scope:
// reads by digest anywhere, tags and tag lists of g.repo and g.reads,
// uploads to g.repo, and g.repo's manifest by digest or g.tag. Deletes
// are never a build's.
func (g grant) allows(req *http.Request) bool {
	rest, ok := strings.CutPrefix(req.URL.Path, "/v2/")
	if req.Method == http.MethodGet || req.Method == http.MethodHead {
		if !ok {
			return true // the /v2/ ping
		}
		// As route judges the path, in its order.
		switch {
		case strings.HasSuffix(rest, "/tags/list"):
			return g.resolves(strings.TrimSuffix(rest, "/tags/list"))
		case strings.Contains(rest, "/blobs/uploads"):
			return rest[:strings.LastIndex(rest, "/blobs/uploads")] == g.repo
		case strings.Contains(rest, "/manifests/"):
			i := strings.LastIndex(rest, "/manifests/")
			return digestRE.MatchString(rest[i+len("/manifests/"):]) || g.resolves(rest[:i])
		case strings.Contains(rest, "/blobs/"):
			return true
		}
		return false
	}
	if !ok || req.Method == http.MethodDelete {
		return false
	}
	switch {
	case strings.HasSuffix(rest, "/tags/list"):
		return false
	case strings.Contains(rest, "/blobs/uploads"):
		return rest[:strings.LastIndex(rest, "/blobs/uploads")] == g.repo
	case strings.Contains(rest, "/manifests/"):
		i := strings.LastIndex(rest, "/manifests/")
		ref := rest[i+len("/manifests/"):]
		return rest[:i] == g.repo && (ref == g.tag || digestRE.MatchString(ref))
	}
	return false
}

// resolves reports whether g may read repo's tags.
func (g grant) resolves(repo string) bool {
	return repo == g.repo || slices.Contains(g.reads, repo)
}

// authorized checks req's credentials: ok, and the build grant they are
// (nil: the registry's own, or no authentication required).
func (r *Registry) authorized(req *http.Request) (ok bool, g *grant) {
	if r.user == "" {
		return true, nil
	}
	u, p, ok := req.BasicAuth()
	if !ok {
		return false, nil
	}
	uok := subtle.ConstantTimeCompare([]byte(u), []byte(r.user)) == 1
	pok := subtle.ConstantTimeCompare([]byte(p), []byte(r.password)) == 1
	if uok && pok {
		return true, nil
	}
	r.mu.Lock()
	want, granted := r.grants[u]
	r.mu.Unlock()
	if granted {
		if subtle.ConstantTimeCompare([]byte(p), []byte(want.password)) != 1 {
			return false, nil
		}
		return true, &want
	}
	// Granted by another replica, for a build it runs.
	if g, ok := r.s.checkGrant(u, p); ok {
		return true, &g
	}
	return false, nil
}

type regError struct {
	status int
	code   string
	msg    string
}

func writeErr(w http.ResponseWriter, e regError) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(e.status)
	json.NewEncoder(w).Encode(map[string]any{"errors": []map[string]string{{"code": e.code, "message": e.msg}}})
}

var digestRE = regexp.MustCompile(`^sha256:[a-f0-9]{64}$`)

func (r *Registry) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	w.Header().Set("Docker-Distribution-API-Version", "registry/2.0")
	ok, g := r.authorized(req)
	if !ok {
		w.Header().Set("WWW-Authenticate", `Basic realm="cubicle"`)
		writeErr(w, regError{http.StatusUnauthorized, "UNAUTHORIZED", "authentication required"})
		return
	}
	if g != nil && !g.allows(req) {
		writeErr(w, regError{http.StatusForbidden, "DENIED", "a build's credentials write only that build's image " + g.repo + ":" + g.tag + " and resolve tags only of it and its FROM images"})
		return
	}
	r.route(w, req)
}

// route serves an authorised request.
func (r *Registry) route(w http.ResponseWriter, req *http.Request) {
	p := req.URL.Path
	if p == "/v2" || p == "/v2/" {
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte("{}"))
		return
	}
	rest, ok := strings.CutPrefix(p, "/v2/")
	if !ok {
		writeErr(w, regError{http.StatusNotFound, "NOT_FOUND", "not found"})
		return
	}
	switch {
	case strings.HasSuffix(rest, "/tags/list"):
		r.tagsList(w, req, strings.TrimSuffix(rest, "/tags/list"))
	case strings.Contains(rest, "/blobs/uploads"):
		i := strings.LastIndex(rest, "/blobs/uploads")
		id := strings.Trim(rest[i+len("/blobs/uploads"):], "/")
		r.uploadsHandler(w, req, rest[:i], id)
	case strings.Contains(rest, "/manifests/"):
		i := strings.LastIndex(rest, "/manifests/")
		r.manifest(w, req, rest[:i], rest[i+len("/manifests/"):])
	case strings.Contains(rest, "/blobs/"):
		i := strings.LastIndex(rest, "/blobs/")
		r.blob(w, req, rest[:i], rest[i+len("/blobs/"):])
	default:
		writeErr(w, regError{http.StatusNotFound, "NOT_FOUND", "not found"})
	}
}

func validRepo(name string) bool { return repoRE.MatchString(name) }

func (r *Registry) blob(w http.ResponseWriter, req *http.Request, repo, dgst string) {
	if !validRepo(repo) {
		writeErr(w, regError{http.StatusBadRequest, "NAME_INVALID", "invalid repository name"})
		return
	}
	h, err := v1.NewHash(dgst)
	if err != nil || !digestRE.MatchString(dgst) {
		writeErr(w, regError{http.StatusBadRequest, "DIGEST_INVALID", "invalid digest"})
		return
	}
	switch req.Method {
	case http.MethodGet, http.MethodHead:
		f, err := r.s.openBlob(h)
		if err != nil {
			writeErr(w, regError{http.StatusNotFound, "BLOB_UNKNOWN", "blob unknown"})
			return
		}
		defer f.Close()
		fi, err := f.Stat()
		if err != nil {
			writeErr(w, regError{http.StatusInternalServerError, "UNKNOWN", err.Error()})
			return
		}
		w.Header().Set("Docker-Content-Digest", dgst)
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Header().Set("Etag", `"`+dgst+`"`)
		// ServeContent streams from the file and handles Range and HEAD.
		http.ServeContent(w, req, "", fi.ModTime(), f)
	case http.MethodDelete:
		// Blobs are shared; they go away through Store.Delete's GC.
		writeErr(w, regError{http.StatusMethodNotAllowed, "UNSUPPORTED", "blob delete not supported"})
	default:
		writeErr(w, regError{http.StatusMethodNotAllowed, "UNSUPPORTED", "method not allowed"})
	}
}

func newID() string {
	b := make([]byte, 16)
	rand.Read(b)
	return hex.EncodeToString(b)
}

func (r *Registry) uploadsHandler(w http.ResponseWriter, req *http.Request, repo, id string) {
	if !validRepo(repo) {
		writeErr(w, regError{http.StatusBadRequest, "NAME_INVALID", "invalid repository name"})
		return
	}
	if id == "" {
		if req.Method != http.MethodPost {
			writeErr(w, regError{http.StatusMethodNotAllowed, "UNSUPPORTED", "method not allowed"})
			return
		}
		r.startUpload(w, req, repo)
		return
	}
	r.mu.Lock()
	u := r.uploads[id]
	r.mu.Unlock()
	if u == nil && r.s.remote != nil && req.Method == http.MethodPut && uploadIDRE.MatchString(id) && req.URL.Query().Get("digest") != "" {
		// Begun (POST) on another replica sharing the image store: behind a
		// balancer a push's POST and its PUT may reach different replicas.
		// A PUT that carries the whole blob stands alone, since the digest
		// decides what the bytes are: the body is taken as the blob and
		// refused unless it hashes to it (so one whose earlier chunks went
		// to the other replica fails, it is never stored wrong).
		r.putUnknownUpload(w, req, repo, id)
		return
	}
	if u == nil {
		writeErr(w, regError{http.StatusNotFound, "BLOB_UPLOAD_UNKNOWN", "upload unknown"})
		return
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	loc := fmt.Sprintf("/v2/%s/blobs/uploads/%s", repo, id)
	switch req.Method {
	case http.MethodGet:
		w.Header().Set("Location", loc)
		w.Header().Set("Range", rangeHeader(u.size))
		w.Header().Set("Docker-Upload-UUID", id)
		w.WriteHeader(http.StatusNoContent)
	case http.MethodPatch:
		if cr := req.Header.Get("Content-Range"); cr != "" {
			if start, ok := parseContentRangeStart(cr); ok && start != u.size {
				writeErr(w, regError{http.StatusRequestedRangeNotSatisfiable, "BLOB_UPLOAD_INVALID", "out of order chunk"})
				return
			}
		}
		if err := r.appendUpload(u, req.Body); err != nil {
			writeErr(w, regError{http.StatusInternalServerError, "BLOB_UPLOAD_INVALID", err.Error()})
			return
		}
		w.Header().Set("Location", loc)
		w.Header().Set("Range", rangeHeader(u.size))
		w.Header().Set("Docker-Upload-UUID", id)
		w.WriteHeader(http.StatusAccepted)
	case http.MethodPut:
		if err := r.appendUpload(u, req.Body); err != nil {
			writeErr(w, regError{http.StatusInternalServerError, "BLOB_UPLOAD_INVALID", err.Error()})
			return
		}
		dgst := req.URL.Query().Get("digest")
		r.finishUpload(w, repo, id, u, dgst)
	case http.MethodDelete:
		r.dropUpload(id, u)
		w.WriteHeader(http.StatusNoContent)
	default:
		writeErr(w, regError{http.StatusMethodNotAllowed, "UNSUPPORTED", "method not allowed"})
	}
}

func (r *Registry) startUpload(w http.ResponseWriter, req *http.Request, repo string) {
	q := req.URL.Query()
	// Cross-repository mount: blobs are global, so it succeeds whenever the
	// blob exists.
	if m := q.Get("mount"); m != "" && digestRE.MatchString(m) {
		if h, _ := v1.NewHash(m); r.s.hasBlob(h) {
			w.Header().Set("Location", fmt.Sprintf("/v2/%s/blobs/%s", repo, m))
			w.Header().Set("Docker-Content-Digest", m)
			w.WriteHeader(http.StatusCreated)
			return
		}
	}
	f, err := os.CreateTemp(filepath.Join(r.s.dir, "uploads"), "blob-")
	if err != nil {
		writeErr(w, regError{http.StatusInternalServerError, "UNKNOWN", err.Error()})
		return
	}
	f.Close()
	id := newID()
	u := &upload{path: f.Name()}
	r.mu.Lock()
	r.uploads[id] = u
	r.mu.Unlock()
	if dgst := q.Get("digest"); dgst != "" {
		// Monolithic upload in the POST itself.
		u.mu.Lock()
		defer u.mu.Unlock()
		if err := r.appendUpload(u, req.Body); err != nil {
			r.dropUpload(id, u)
			writeErr(w, regError{http.StatusInternalServerError, "BLOB_UPLOAD_INVALID", err.Error()})
			return
		}
		r.finishUpload(w, repo, id, u, dgst)
		return
	}
	w.Header().Set("Location", fmt.Sprintf("/v2/%s/blobs/uploads/%s", repo, id))
	w.Header().Set("Range", "0-0")
	w.Header().Set("Docker-Upload-UUID", id)
	w.WriteHeader(http.StatusAccepted)
}

// uploadIDRE is newID's shape.
var uploadIDRE = regexp.MustCompile(`^[0-9a-f]{32}$`)

// putUnknownUpload finishes, from the PUT's body alone, an upload this
// replica did not begin.
func (r *Registry) putUnknownUpload(w http.ResponseWriter, req *http.Request, repo, id string) {
	f, err := os.CreateTemp(filepath.Join(r.s.dir, "uploads"), "blob-")
	if err != nil {
		writeErr(w, regError{http.StatusInternalServerError, "UNKNOWN", err.Error()})
		return
	}
	f.Close()
	u := &upload{path: f.Name()}
	r.mu.Lock()
	r.uploads[id] = u
	r.mu.Unlock()
	u.mu.Lock()
	defer u.mu.Unlock()
	if err := r.appendUpload(u, req.Body); err != nil {
		r.dropUpload(id, u)
		writeErr(w, regError{http.StatusInternalServerError, "BLOB_UPLOAD_INVALID", err.Error()})
		return
	}
	r.finishUpload(w, repo, id, u, req.URL.Query().Get("digest"))
}

func (r *Registry) appendUpload(u *upload, body io.Reader) error {
	f, err := os.OpenFile(u.path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return err
	}
	n, err := io.Copy(f, body)
	u.size += n
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// finishUpload verifies the upload's digest and moves it into the blob store.
// Called with u.mu held.
func (r *Registry) finishUpload(w http.ResponseWriter, repo, id string, u *upload, dgst string) {
	defer r.dropUpload(id, u)
	want, err := v1.NewHash(dgst)
	if err != nil || !digestRE.MatchString(dgst) {
		writeErr(w, regError{http.StatusBadRequest, "DIGEST_INVALID", "invalid digest"})
		return
	}
	f, err := os.Open(u.path)
	if err != nil {
		writeErr(w, regError{http.StatusInternalServerError, "UNKNOWN", err.Error()})
		return
	}
	hh := sha256.New()
	_, err = io.Copy(hh, f)
	f.Close()
	if err != nil {
		writeErr(w, regError{http.StatusInternalServerError, "UNKNOWN", err.Error()})
		return
	}
	if got := "sha256:" + hex.EncodeToString(hh.Sum(nil)); got != dgst {
		writeErr(w, regError{http.StatusBadRequest, "DIGEST_INVALID", "digest mismatch: got " + got})
		return
	}
	if err := r.s.commitBlob(u.path, want); err != nil {
		writeErr(w, regError{http.StatusInternalServerError, "UNKNOWN", err.Error()})
		return
	}
	w.Header().Set("Location", fmt.Sprintf("/v2/%s/blobs/%s", repo, dgst))
	w.Header().Set("Docker-Content-Digest", dgst)
	w.WriteHeader(http.StatusCreated)
}

func (r *Registry) dropUpload(id string, u *upload) {
	r.mu.Lock()
	delete(r.uploads, id)
	r.mu.Unlock()
	os.Remove(u.path) // already gone once committed
}

func rangeHeader(size int64) string {
	if size == 0 {
		return "0-0"
	}
	return fmt.Sprintf("0-%d", size-1)
}

func parseContentRangeStart(v string) (int64, bool) {
	v = strings.TrimPrefix(v, "bytes ")
	if i := strings.IndexByte(v, '-'); i > 0 {
		n, err := strconv.ParseInt(v[:i], 10, 64)
		return n, err == nil
	}
	return 0, false
}

func (r *Registry) manifest(w http.ResponseWriter, req *http.Request, repo, ref string) {
	if !validRepo(repo) {
		writeErr(w, regError{http.StatusBadRequest, "NAME_INVALID", "invalid repository name"})
		return
	}
	byDigest := digestRE.MatchString(ref)
	if !byDigest && !tagRE.MatchString(ref) {
		writeErr(w, regError{http.StatusBadRequest, "MANIFEST_INVALID", "invalid reference"})
		return
	}
	name := repo + ":" + ref
	switch req.Method {
	case http.MethodGet, http.MethodHead:
		var d v1.Descriptor
		if byDigest {
			h, _ := v1.NewHash(ref)
			if !r.s.hasBlob(h) {
				writeErr(w, regError{http.StatusNotFound, "MANIFEST_UNKNOWN", "manifest unknown"})
				return
			}
			d.Digest = h
		} else {
			var err error
			if d, err = r.s.Resolve(name); err != nil {
				writeErr(w, regError{http.StatusNotFound, "MANIFEST_UNKNOWN", "manifest unknown"})
				return
			}
		}
		if size, err := r.s.blobSize(d.Digest); err != nil || size > maxManifestSize {
			writeErr(w, regError{http.StatusNotFound, "MANIFEST_UNKNOWN", "manifest unknown"})
			return
		}
		raw, err := r.s.readBlob(d.Digest)
		if err != nil {
			writeErr(w, regError{http.StatusNotFound, "MANIFEST_UNKNOWN", "manifest unknown"})
			return
		}
		mt := sniffMediaType(raw)
		if mt == "" || !(mt.IsImage() || mt.IsIndex()) {
			writeErr(w, regError{http.StatusNotFound, "MANIFEST_UNKNOWN", "not a manifest"})
			return
		}
		w.Header().Set("Content-Type", string(mt))
		w.Header().Set("Docker-Content-Digest", d.Digest.String())
		w.Header().Set("Etag", `"`+d.Digest.String()+`"`)
		w.Header().Set("Content-Length", strconv.Itoa(len(raw)))
		w.WriteHeader(http.StatusOK)
		if req.Method == http.MethodGet {
			w.Write(raw)
		}
	case http.MethodPut:
		raw, err := io.ReadAll(io.LimitReader(req.Body, maxManifestSize+1))
		if err != nil {
			writeErr(w, regError{http.StatusBadRequest, "MANIFEST_INVALID", err.Error()})
			return
		}
		if len(raw) > maxManifestSize {
			writeErr(w, regError{http.StatusRequestEntityTooLarge, "SIZE_INVALID", "manifest too large"})
			return
		}
		mt := types.MediaType(req.Header.Get("Content-Type"))
		if !(mt.IsImage() || mt.IsIndex()) {
			mt = sniffMediaType(raw)
		}
		if err := r.checkReferences(raw, mt); err != nil {
			writeErr(w, regError{http.StatusBadRequest, "MANIFEST_BLOB_UNKNOWN", err.Error()})
			return
		}
		sum := sha256.Sum256(raw)
		dgst := "sha256:" + hex.EncodeToString(sum[:])
		if byDigest && dgst != ref {
			writeErr(w, regError{http.StatusBadRequest, "DIGEST_INVALID", "manifest digest mismatch"})
			return
		}
		h, err := r.s.writeBlob(bytes.NewReader(raw), v1.Hash{})
		if err != nil {
			writeErr(w, regError{http.StatusInternalServerError, "UNKNOWN", err.Error()})
			return
		}
		if !byDigest {
			if err := r.s.tag(name, v1.Descriptor{MediaType: mt, Size: int64(len(raw)), Digest: h}); err != nil {
				writeErr(w, regError{http.StatusInternalServerError, "UNKNOWN", err.Error()})
				return
			}
		}
		w.Header().Set("Location", fmt.Sprintf("/v2/%s/manifests/%s", repo, dgst))
		w.Header().Set("Docker-Content-Digest", dgst)
		w.WriteHeader(http.StatusCreated)
	case http.MethodDelete:
		if byDigest {
			writeErr(w, regError{http.StatusMethodNotAllowed, "UNSUPPORTED", "delete by tag"})
			return
		}
		if err := r.s.Delete(name); err != nil {
			if errors.Is(err, ErrNotFound) {
				writeErr(w, regError{http.StatusNotFound, "MANIFEST_UNKNOWN", "manifest unknown"})
				return
			}
			writeErr(w, regError{http.StatusInternalServerError, "UNKNOWN", err.Error()})
			return
		}
		w.WriteHeader(http.StatusAccepted)
	default:
		writeErr(w, regError{http.StatusMethodNotAllowed, "UNSUPPORTED", "method not allowed"})
	}
}

// checkReferences refuses a manifest whose blobs (or child manifests) are not
// in the store, so a tag never points at an image that cannot be pulled.
func (r *Registry) checkReferences(raw []byte, mt types.MediaType) error {
	var refs []v1.Descriptor
	switch {
	case mt.IsImage():
		var m v1.Manifest
		if err := json.Unmarshal(raw, &m); err != nil {
			return err
		}
		refs = append([]v1.Descriptor{m.Config}, m.Layers...)
	case mt.IsIndex():
		var ix v1.IndexManifest
		if err := json.Unmarshal(raw, &ix); err != nil {
			return err
		}
		refs = ix.Manifests
	default:
		return fmt.Errorf("%w: manifest media type %q", ErrUnsupported, mt)
	}
	for _, d := range refs {
		if !r.s.hasBlob(d.Digest) {
			return fmt.Errorf("%w: blob %s", ErrNotFound, d.Digest)
		}
	}
	return nil
}

func (r *Registry) tagsList(w http.ResponseWriter, req *http.Request, repo string) {
	if !validRepo(repo) {
		writeErr(w, regError{http.StatusBadRequest, "NAME_INVALID", "invalid repository name"})
		return
	}
	ents, err := r.s.List()
	if err != nil {
		writeErr(w, regError{http.StatusInternalServerError, "UNKNOWN", err.Error()})
		return
	}
	tags := []string{}
	for _, e := range ents {
		if t, ok := strings.CutPrefix(e.Ref, repo+":"); ok {
			tags = append(tags, t)
		}
	}
	if len(tags) == 0 {
		writeErr(w, regError{http.StatusNotFound, "NAME_UNKNOWN", "repository unknown"})
		return
	}
	sort.Strings(tags)
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(map[string]any{"name": repo, "tags": tags})
}
