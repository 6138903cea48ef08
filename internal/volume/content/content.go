// Package content serves the e2b volume-content HTTP API
// (/volumecontent/{volumeID}/{path|dir|file}) over a host directory.
//
// Every file operation goes through an os.Root opened on the volume
// directory, so symlinks a sandbox plants in the volume (ln -s / escape,
// ln -s /etc/passwd x) can never make the host read, write, chown, chmod or
// delete anything outside it. Symlinks that stay inside the volume are
// followed as usual, except that listings never recurse through them.
//
// Status choices:
//   - a path that resolves outside the volume (through a symlink) -> 403
//   - a known resource with an unsupported method -> 405 (JSON error); any
//     other path under /volumecontent/ -> 404
//   - PUT file onto an existing directory, or mkdir through a non-directory
//     -> 409
//   - GET file of a non-regular file (FIFO, device, socket) -> 400
//   - PATCH mode on a symlink -> 400 (Linux cannot chmod a link itself)
//   - a write past the volume's size (ENOSPC, EDQUOT) -> 507, the partial
//     upload removed
package content

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"math"
	"net/http"
	"os"
	"path"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Resolver authenticates a request and gives the directory holding the
// volume's files.
type Resolver interface {
	// Open checks token (the Bearer token from the Authorization header, ""
	// if none) for volumeID and returns the host directory of the volume's
	// files and a release func that must be called when the request is done.
	// Errors: wrap ErrNotFound (-> 404), ErrUnauthorized (-> 401),
	// ErrConflict (-> 409), ErrNotImplemented (-> 501), ErrUnavailable
	// (-> 503), anything else -> 500.
	Open(ctx context.Context, volumeID, token string) (dir string, release func(), err error)
}

// Resolver errors, mapped to HTTP statuses by the handler.
var (
	ErrNotFound     = errors.New("volume not found")
	ErrUnauthorized = errors.New("invalid or missing volume token")
	ErrConflict     = errors.New("volume conflict")
	// ErrNotImplemented: this server cannot reach volume files at all (a
	// pure control plane has no node of its own to mount them on).
	ErrNotImplemented = errors.New("volume file access is not available on this server")
	// ErrUnavailable: the machine that must serve the volume cannot now
	// (its node is down) -> 503.
	ErrUnavailable = errors.New("volume file access is unavailable")
)

// Router is a Resolver whose volumes may be held by another machine.
// Route does Open's work (authentication, lease); when forward is non-nil
// the request, its path unparsed, is passed to it (a proxy to the node
// that holds the volume), otherwise it is served here from dir. The same
// errors as Open; release must be called when the request is done.
type Router interface {
	Resolver
	Route(ctx context.Context, volumeID, token string) (dir string, forward http.Handler, release func(), err error)
}

const (
	// MaxListDepth caps ?depth= of a directory listing; deeper requests are
	// served at this depth rather than refused.
	MaxListDepth = 32

	defaultFileMode = 0o644
	defaultDirMode  = 0o755

	maxPatchBody = 64 << 10
	tmpPrefix    = ".cubicle-upload-"
)

// Option configures the handler.
type Option func(*handler)

// WithMaxUploadSize caps PUT bodies at n bytes (413 above it); n <= 0 means
// no cap, the default.
func WithMaxUploadSize(n int64) Option {
	return func(h *handler) { h.maxUpload = n }
}

// EntryStat is the VolumeEntryStat wire type.
type EntryStat struct {
	Name   string `json:"name"`
	Type   string `json:"type"`
	Path   string `json:"path"`
	Size   int64  `json:"size"`
	Mode   uint32 `json:"mode"`
	UID    uint32 `json:"uid"`
	GID    uint32 `json:"gid"`
	Atime  string `json:"atime"`
	Mtime  string `json:"mtime"`
	Ctime  string `json:"ctime"`
	Target string `json:"target,omitempty"`
}

type apiError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// httpError carries a status to the response writer.
type httpError struct {
	status int
	msg    string
}

func (e *httpError) Error() string { return e.msg }

func errorf(status int, format string, args ...any) *httpError {
	return &httpError{status: status, msg: fmt.Sprintf(format, args...)}
}

type handler struct {
	resolver  Resolver
	logger    *slog.Logger
	maxUpload int64
	mux       *http.ServeMux

	// escapeErr is os.Root's unexported "path escapes from parent" sentinel,
	// captured from a probe so detection does not rely on the message text.
	escapeOnce sync.Once
	escapeErr  error
}

// NewHandler serves /volumecontent/{volumeID}/{path|dir|file}.
func NewHandler(r Resolver, logger *slog.Logger, opts ...Option) http.Handler {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	h := &handler{resolver: r, logger: logger, mux: http.NewServeMux()}
	for _, o := range opts {
		o(h)
	}
	h.route("GET /volumecontent/{volumeID}/path", h.getPath)
	h.route("PATCH /volumecontent/{volumeID}/path", h.patchPath)
	h.route("DELETE /volumecontent/{volumeID}/path", h.deletePath)
	h.route("GET /volumecontent/{volumeID}/dir", h.listDir)
	h.route("POST /volumecontent/{volumeID}/dir", h.makeDir)
	h.route("GET /volumecontent/{volumeID}/file", h.readFile)
	h.route("PUT /volumecontent/{volumeID}/file", h.writeFile)
	h.mux.HandleFunc("/", h.fallback)
	return h
}

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) { h.mux.ServeHTTP(w, r) }

var allowed = map[string]string{
	"path": "GET, HEAD, PATCH, DELETE",
	"dir":  "GET, HEAD, POST",
	"file": "GET, HEAD, PUT",
}

// fallback answers in the API's JSON error shape instead of ServeMux's
// plain-text 404/405.
func (h *handler) fallback(w http.ResponseWriter, r *http.Request) {
	parts := strings.Split(strings.TrimPrefix(r.URL.Path, "/"), "/")
	if len(parts) == 3 && parts[0] == "volumecontent" && parts[1] != "" {
		if allow, ok := allowed[parts[2]]; ok {
			w.Header().Set("Allow", allow)
			writeError(w, errorf(http.StatusMethodNotAllowed, "method %s not allowed on /volumecontent/{volumeID}/%s", r.Method, parts[2]))
			return
		}
	}
	writeError(w, errorf(http.StatusNotFound, "no such route %s %s", r.Method, r.URL.Path))
}

// request is the per-request state handed to route handlers.
type request struct {
	root    *os.Root
	apiPath string // cleaned absolute path inside the volume, "/data/f.txt"
	rel     string // the same relative to root, "data/f.txt" or "."
}

type routeFunc func(w http.ResponseWriter, r *http.Request, q *request) error

// route wraps fn with authentication, volume resolution, path parsing and
// error rendering.
func (h *handler) route(pattern string, fn routeFunc) {
	h.mux.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) {
		volumeID := r.PathValue("volumeID")
		err := h.serve(w, r, volumeID, fn)
		if err == nil {
			return
		}
		var he *httpError
		if !errors.As(err, &he) {
			h.logger.Error("volume content request failed", "method", r.Method, "path", r.URL.Path, "volume", volumeID, "err", err)
			he = errorf(http.StatusInternalServerError, "internal error")
		} else if he.status >= 500 {
			h.logger.Error("volume content request failed", "method", r.Method, "path", r.URL.Path, "volume", volumeID, "err", he.msg)
		}
		writeError(w, he)
	})
}

func (h *handler) serve(w http.ResponseWriter, r *http.Request, volumeID string, fn routeFunc) error {
	// Authenticate before validating anything so an unauthenticated caller
	// learns nothing about the volume.
	var (
		dir     string
		forward http.Handler
		release func()
		err     error
	)
	if rt, ok := h.resolver.(Router); ok {
		dir, forward, release, err = rt.Route(r.Context(), volumeID, bearerToken(r))
	} else {
		dir, release, err = h.resolver.Open(r.Context(), volumeID, bearerToken(r))
	}
	switch {
	case errors.Is(err, ErrUnauthorized):
		return errorf(http.StatusUnauthorized, "invalid or missing volume token")
	case errors.Is(err, ErrNotFound):
		return errorf(http.StatusNotFound, "volume %s not found", volumeID)
	case errors.Is(err, ErrConflict):
		return errorf(http.StatusConflict, "volume %s: %v", volumeID, err)
	case errors.Is(err, ErrNotImplemented):
		return errorf(http.StatusNotImplemented, "volume %s: %v", volumeID, err)
	case errors.Is(err, ErrUnavailable):
		return errorf(http.StatusServiceUnavailable, "volume %s: %v", volumeID, err)
	case err != nil:
		return fmt.Errorf("resolve volume %s: %w", volumeID, err)
	}
	if release != nil {
		defer release()
	}
	if forward != nil {
		forward.ServeHTTP(w, r)
		return nil
	}
	apiPath, rel, err := parsePath(r.URL.Query().Get("path"))
	if err != nil {
		return err
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return fmt.Errorf("open volume %s directory: %w", volumeID, err)
	}
	defer root.Close()
	h.escapeOnce.Do(func() {
		var pe *os.PathError
		if _, err := root.Lstat(".."); errors.As(err, &pe) {
			h.escapeErr = pe.Err
		}
	})
	return h.mapErr(fn(w, r, &request{root: root, apiPath: apiPath, rel: rel}), apiPath)
}

// bearerToken returns the token of "Authorization: Bearer <token>", "" if the
// header is absent or uses another scheme.
func bearerToken(r *http.Request) string {
	scheme, tok, ok := strings.Cut(strings.TrimSpace(r.Header.Get("Authorization")), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return ""
	}
	return strings.TrimSpace(tok)
}

// parsePath turns the ?path= value into the cleaned API path and the path
// relative to the volume root. Cleaning resolves ".." lexically, so it can
// never climb above "/".
func parsePath(p string) (apiPath, rel string, err error) {
	if strings.IndexByte(p, 0) >= 0 {
		return "", "", errorf(http.StatusBadRequest, "path must not contain NUL bytes")
	}
	if p == "" {
		p = "/"
	}
	if !strings.HasPrefix(p, "/") {
		return "", "", errorf(http.StatusBadRequest, "path %q must be absolute (start with /)", p)
	}
	apiPath = path.Clean(p)
	rel = strings.TrimPrefix(apiPath, "/")
	if rel == "" {
		rel = "."
	}
	return apiPath, rel, nil
}

// relPath converts an API path back to a root-relative one.
func relPath(apiPath string) string {
	if apiPath == "/" {
		return "."
	}
	return strings.TrimPrefix(apiPath, "/")
}

// mapErr turns filesystem errors into statuses; httpErrors pass through.
func (h *handler) mapErr(err error, apiPath string) error {
	if err == nil {
		return nil
	}
	var he *httpError
	if errors.As(err, &he) {
		return he
	}
	if h.isEscape(err) {
		return errorf(http.StatusForbidden, "path %s resolves outside the volume (symlink escape)", apiPath)
	}
	var mbe *http.MaxBytesError
	switch {
	case errors.As(err, &mbe):
		return errorf(http.StatusRequestEntityTooLarge, "upload to %s exceeds the %d byte limit", apiPath, mbe.Limit)
	case errors.Is(err, fs.ErrNotExist), errors.Is(err, syscall.ENOTDIR):
		return errorf(http.StatusNotFound, "path %s not found", apiPath)
	case errors.Is(err, fs.ErrExist), errors.Is(err, syscall.ENOTEMPTY):
		return errorf(http.StatusConflict, "path %s already exists", apiPath)
	case errors.Is(err, syscall.EISDIR):
		return errorf(http.StatusConflict, "path %s is a directory", apiPath)
	case errors.Is(err, syscall.ELOOP):
		return errorf(http.StatusBadRequest, "path %s: too many levels of symbolic links", apiPath)
	case errors.Is(err, syscall.ENAMETOOLONG):
		return errorf(http.StatusBadRequest, "path %s: name too long", apiPath)
	case errors.Is(err, syscall.EINVAL):
		return errorf(http.StatusBadRequest, "path %s: invalid argument", apiPath)
	case errors.Is(err, fs.ErrPermission), errors.Is(err, syscall.EROFS):
		return errorf(http.StatusForbidden, "path %s: permission denied", apiPath)
	case errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.EDQUOT):
		return errorf(http.StatusInsufficientStorage, "no space left on the volume")
	}
	return err
}

func (h *handler) isEscape(err error) bool {
	// Typed only: should the probe ever stop yielding the sentinel, escapes
	// still fail (as generic errors), they are just reported less precisely.
	return h.escapeErr != nil && errors.Is(err, h.escapeErr)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// WriteError answers with the API's error shape (for a server that passes
// requests on and must answer its own failures alike).
func WriteError(w http.ResponseWriter, status int, format string, args ...any) {
	writeError(w, errorf(status, format, args...))
}

func writeError(w http.ResponseWriter, he *httpError) {
	writeJSON(w, he.status, apiError{Code: strconv.Itoa(he.status), Message: he.msg})
}

// --- query parameters ---

type writeParams struct {
	uid, gid int // -1: leave as is
	mode     uint32
	force    bool
}

func parseWriteParams(r *http.Request, defMode uint32) (writeParams, error) {
	q := r.URL.Query()
	p := writeParams{uid: -1, gid: -1, mode: defMode}
	var err error
	if p.uid, err = parseID(q, "uid"); err != nil {
		return p, err
	}
	if p.gid, err = parseID(q, "gid"); err != nil {
		return p, err
	}
	if s := q.Get("mode"); s != "" {
		// Base 0: the SDK sends decimal (0o644 -> "420"); a human's "0644"
		// reads as octal.
		m, err := strconv.ParseUint(s, 0, 32)
		if err != nil || m > 0o7777 {
			return p, errorf(http.StatusBadRequest, "invalid mode %q: want a number from 0 to 4095 (0o7777)", s)
		}
		if err := checkNoSetID(uint32(m)); err != nil {
			return p, err
		}
		p.mode = uint32(m)
	}
	if s := q.Get("force"); s != "" {
		b, err := strconv.ParseBool(s)
		if err != nil {
			return p, errorf(http.StatusBadRequest, "invalid force %q: want true or false", s)
		}
		p.force = b
	}
	return p, nil
}

func parseID(q map[string][]string, name string) (int, error) {
	v := q[name]
	if len(v) == 0 || v[0] == "" {
		return -1, nil
	}
	n, err := strconv.ParseUint(v[0], 10, 32)
	if err != nil || n == math.MaxUint32 { // MaxUint32 is chown's "unchanged"
		return -1, errorf(http.StatusBadRequest, "invalid %s %q: want a number from 0 to %d", name, v[0], uint32(math.MaxUint32-1))
	}
	return int(n), nil
}

// checkNoSetID refuses setuid and setgid bits: volume data is reachable
// from other sandboxes and from the host, where a set-ID file is a
// privilege elevation waiting for someone to run it. (Sandboxes mount
// volumes nosuid, but the volume-content API must not mint such files
// either.)
func checkNoSetID(m uint32) error {
	if m&(syscall.S_ISUID|syscall.S_ISGID) != 0 {
		return errorf(http.StatusBadRequest, "mode %#o: setuid and setgid bits are not allowed in volumes", m)
	}
	return nil
}

// toFileMode converts raw st_mode permission bits to an os.FileMode, which
// encodes setuid/setgid/sticky as separate flags.
func toFileMode(m uint32) os.FileMode {
	fm := os.FileMode(m & 0o777)
	if m&syscall.S_ISUID != 0 {
		fm |= os.ModeSetuid
	}
	if m&syscall.S_ISGID != 0 {
		fm |= os.ModeSetgid
	}
	if m&syscall.S_ISVTX != 0 {
		fm |= os.ModeSticky
	}
	return fm
}

// fileModeBits is toFileMode's inverse.
func fileModeBits(fm os.FileMode) uint32 {
	m := uint32(fm.Perm())
	if fm&os.ModeSetuid != 0 {
		m |= syscall.S_ISUID
	}
	if fm&os.ModeSetgid != 0 {
		m |= syscall.S_ISGID
	}
	if fm&os.ModeSticky != 0 {
		m |= syscall.S_ISVTX
	}
	return m
}

// --- stat ---

func entryType(fm os.FileMode) string {
	switch {
	case fm.IsRegular():
		return "file"
	case fm.IsDir():
		return "directory"
	case fm&os.ModeSymlink != 0:
		return "symlink"
	}
	return "unknown"
}

func fmtTime(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }

func makeEntry(root *os.Root, apiPath string, fi fs.FileInfo) EntryStat {
	uid, gid, mode, atime, ctime := sysStat(fi)
	e := EntryStat{
		Name:  path.Base(apiPath),
		Type:  entryType(fi.Mode()),
		Path:  apiPath,
		Size:  fi.Size(),
		Mode:  mode,
		UID:   uid,
		GID:   gid,
		Atime: fmtTime(atime),
		Mtime: fmtTime(fi.ModTime()),
		Ctime: fmtTime(ctime),
	}
	if e.Type == "symlink" {
		// Readlink only reads the link itself; a target outside the volume
		// is reported, never followed.
		if t, err := root.Readlink(relPath(apiPath)); err == nil {
			e.Target = t
		}
	}
	return e
}

// lstatEntry describes apiPath itself (a symlink is reported as a symlink).
func lstatEntry(root *os.Root, apiPath string) (EntryStat, error) {
	fi, err := root.Lstat(relPath(apiPath))
	if err != nil {
		return EntryStat{}, err
	}
	return makeEntry(root, apiPath, fi), nil
}

// --- /path ---

func (h *handler) getPath(w http.ResponseWriter, r *http.Request, q *request) error {
	e, err := lstatEntry(q.root, q.apiPath)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, e)
	return nil
}

type patchBody struct {
	UID  *int64 `json:"uid"`
	GID  *int64 `json:"gid"`
	Mode *int64 `json:"mode"`
}

func (h *handler) patchPath(w http.ResponseWriter, r *http.Request, q *request) error {
	var body patchBody
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxPatchBody))
	if err := dec.Decode(&body); err != nil && !errors.Is(err, io.EOF) { // empty body: nothing to change
		return errorf(http.StatusBadRequest, "invalid JSON body: %v", err)
	}
	uid, gid := -1, -1
	for _, f := range []struct {
		name string
		v    *int64
		dst  *int
	}{{"uid", body.UID, &uid}, {"gid", body.GID, &gid}} {
		if f.v == nil {
			continue
		}
		if *f.v < 0 || *f.v >= math.MaxUint32 {
			return errorf(http.StatusBadRequest, "invalid %s %d: want a number from 0 to %d", f.name, *f.v, uint32(math.MaxUint32-1))
		}
		*f.dst = int(*f.v)
	}
	if body.Mode != nil && (*body.Mode < 0 || *body.Mode > 0o7777) {
		return errorf(http.StatusBadRequest, "invalid mode %d: want a number from 0 to 4095 (0o7777)", *body.Mode)
	}
	if body.Mode != nil {
		if err := checkNoSetID(uint32(*body.Mode)); err != nil {
			return err
		}
	}

	fi, err := q.root.Lstat(q.rel)
	if err != nil {
		return err
	}
	isLink := fi.Mode()&os.ModeSymlink != 0
	if isLink && body.Mode != nil {
		return errorf(http.StatusBadRequest, "cannot change the mode of symlink %s", q.apiPath)
	}
	// Lchown never follows the final component, so a symlink swapped in
	// meanwhile is changed itself; chown first as it clears setuid/setgid.
	if uid >= 0 || gid >= 0 {
		if err := q.root.Lchown(q.rel, uid, gid); err != nil {
			return err
		}
	}
	if body.Mode != nil {
		if err := q.root.Chmod(q.rel, toFileMode(uint32(*body.Mode))); err != nil {
			return err
		}
	}
	e, err := lstatEntry(q.root, q.apiPath)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, e)
	return nil
}

func (h *handler) deletePath(w http.ResponseWriter, r *http.Request, q *request) error {
	if q.rel == "." {
		return errorf(http.StatusBadRequest, "cannot delete the volume root")
	}
	// RemoveAll succeeds on a missing path; Lstat first for the 404.
	if _, err := q.root.Lstat(q.rel); err != nil {
		return err
	}
	// os.Root's RemoveAll unlinks a symlink rather than descending into it.
	if err := q.root.RemoveAll(q.rel); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// --- /dir ---

func (h *handler) listDir(w http.ResponseWriter, r *http.Request, q *request) error {
	depth := 1
	if s := r.URL.Query().Get("depth"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			return errorf(http.StatusBadRequest, "invalid depth %q: want an integer >= 1", s)
		}
		depth = min(n, MaxListDepth)
	}
	fi, err := q.root.Stat(q.rel)
	if err != nil {
		return err
	}
	if !fi.IsDir() {
		return errorf(http.StatusBadRequest, "path %s is not a directory", q.apiPath)
	}
	entries := []EntryStat{}
	if err := h.walk(q.root, q.apiPath, depth, &entries); err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, entries)
	return nil
}

// walk appends dir's entries (pre-order, sorted by name) down to depth
// levels. It recurses only into real directories, never symlinks, so links
// cannot cause loops or lead the listing elsewhere.
func (h *handler) walk(root *os.Root, dir string, depth int, out *[]EntryStat) error {
	f, err := root.OpenFile(relPath(dir), readDirFlags, 0)
	if err != nil {
		return err
	}
	names, err := f.Readdirnames(-1)
	f.Close()
	if err != nil {
		return err
	}
	slices.Sort(names)
	for _, name := range names {
		p := path.Join(dir, name)
		fi, err := root.Lstat(relPath(p))
		if errors.Is(err, fs.ErrNotExist) {
			continue // removed while listing
		}
		if err != nil {
			return err
		}
		*out = append(*out, makeEntry(root, p, fi))
		if depth > 1 && fi.IsDir() {
			if err := h.walk(root, p, depth-1, out); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return err
			}
		}
	}
	return nil
}

func (h *handler) makeDir(w http.ResponseWriter, r *http.Request, q *request) error {
	p, err := parseWriteParams(r, defaultDirMode)
	if err != nil {
		return err
	}
	if p.force {
		if err := mkdirAll(q.root, q.apiPath, p.uid, p.gid, p.mode); err != nil {
			return err
		}
	} else {
		if q.rel == "." {
			return errorf(http.StatusConflict, "path / already exists")
		}
		if err := q.root.Mkdir(q.rel, os.FileMode(p.mode&0o777)); err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return errorf(http.StatusNotFound, "parent directory %s of %s not found (use force to create it)", path.Dir(q.apiPath), q.apiPath)
			}
			return err
		}
		if err := applyOwnerMode(q.root, q.rel, p.uid, p.gid, p.mode); err != nil {
			return err
		}
	}
	e, err := lstatEntry(q.root, q.apiPath)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, e)
	return nil
}

// applyOwnerMode sets owner then exact mode (chown clears setuid/setgid, and
// mkdir/open modes are subject to umask).
func applyOwnerMode(root *os.Root, rel string, uid, gid int, mode uint32) error {
	if uid >= 0 || gid >= 0 {
		if err := root.Lchown(rel, uid, gid); err != nil {
			return err
		}
	}
	return root.Chmod(rel, toFileMode(mode))
}

// mkdirAll is mkdir -p for apiPath. Unlike os.Root.MkdirAll it gives the
// directories it creates uid/gid (so a sandbox user owns the whole new
// chain) and mode to the last one (parents get 0755); existing directories
// are left untouched.
func mkdirAll(root *os.Root, apiPath string, uid, gid int, mode uint32) error {
	if apiPath == "/" {
		return nil
	}
	comps := strings.Split(strings.TrimPrefix(apiPath, "/"), "/")
	for i := range comps {
		sub := "/" + strings.Join(comps[:i+1], "/")
		rel := relPath(sub)
		m := uint32(defaultDirMode)
		if i == len(comps)-1 {
			m = mode
		}
		err := root.Mkdir(rel, os.FileMode(m&0o777))
		if err == nil {
			if err := applyOwnerMode(root, rel, uid, gid, m); err != nil {
				return err
			}
			continue
		}
		if !errors.Is(err, fs.ErrExist) {
			return err
		}
		// Stat follows a symlinked component, which os.Root keeps inside
		// the volume.
		fi, err := root.Stat(rel)
		if err != nil {
			return err
		}
		if !fi.IsDir() {
			return errorf(http.StatusConflict, "path %s exists and is not a directory", sub)
		}
	}
	return nil
}

// --- /file ---

func (h *handler) readFile(w http.ResponseWriter, r *http.Request, q *request) error {
	// Stat before opening so a FIFO or device node is never opened at all.
	fi, err := q.root.Stat(q.rel)
	if err != nil {
		return err
	}
	if err := checkRegular(fi, q.apiPath); err != nil {
		return err
	}
	f, err := q.root.OpenFile(q.rel, readFileFlags, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	// Re-check on the descriptor: the path may have been swapped after Stat.
	if fi, err = f.Stat(); err != nil {
		return err
	}
	if err := checkRegular(fi, q.apiPath); err != nil {
		return err
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	http.ServeContent(w, r, "", fi.ModTime(), f)
	return nil
}

func checkRegular(fi fs.FileInfo, apiPath string) error {
	switch {
	case fi.IsDir():
		return errorf(http.StatusBadRequest, "path %s is a directory", apiPath)
	case !fi.Mode().IsRegular():
		return errorf(http.StatusBadRequest, "path %s is not a regular file", apiPath)
	}
	return nil
}

func (h *handler) writeFile(w http.ResponseWriter, r *http.Request, q *request) error {
	if q.rel == "." {
		return errorf(http.StatusBadRequest, "path / is the volume root, not a file")
	}
	p, err := parseWriteParams(r, defaultFileMode)
	if err != nil {
		return err
	}
	parent := path.Dir(q.apiPath)
	if p.force {
		if err := mkdirAll(q.root, parent, p.uid, p.gid, defaultDirMode); err != nil {
			return err
		}
	} else {
		fi, err := q.root.Stat(relPath(parent))
		if errors.Is(err, fs.ErrNotExist) {
			return errorf(http.StatusNotFound, "parent directory %s of %s not found (use force to create it)", parent, q.apiPath)
		}
		if err != nil {
			return h.mapErr(err, parent)
		}
		if !fi.IsDir() {
			return errorf(http.StatusConflict, "parent %s of %s is not a directory", parent, q.apiPath)
		}
	}
	if fi, err := q.root.Lstat(q.rel); err == nil && fi.IsDir() {
		return errorf(http.StatusConflict, "path %s is a directory", q.apiPath)
	}

	body := io.Reader(r.Body)
	if h.maxUpload > 0 {
		body = http.MaxBytesReader(w, r.Body, h.maxUpload)
	}
	tmp, err := writeTemp(q.root, relPath(parent), body, p)
	if err != nil {
		return err
	}
	// rename(2) replaces a symlink at the target rather than writing
	// through it, and readers see either the old or the new file.
	if err := q.root.Rename(tmp, q.rel); err != nil {
		_ = q.root.Remove(tmp)
		return err
	}
	e, err := lstatEntry(q.root, q.apiPath)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, e)
	return nil
}

// fileWriter remembers a write error, so writeTemp can tell a full volume
// from a broken upload.
type fileWriter struct {
	f   *os.File
	err error
}

func (w *fileWriter) Write(p []byte) (int, error) {
	n, err := w.f.Write(p)
	if err != nil {
		w.err = err
	}
	return n, err
}

// writeTemp streams body into a new temp file in dir and returns its
// root-relative name; on failure the temp file is removed, so an aborted
// upload never leaves a partial file behind.
func writeTemp(root *os.Root, dir string, body io.Reader, p writeParams) (_ string, err error) {
	var rnd [8]byte
	_, _ = rand.Read(rnd[:])
	name := path.Join(dir, tmpPrefix+hex.EncodeToString(rnd[:]))
	// O_EXCL: never follows or reuses whatever is at the name.
	f, err := root.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return "", err
	}
	defer func() {
		if err != nil {
			f.Close()
			_ = root.Remove(name)
		}
	}()
	fw := &fileWriter{f: f}
	if _, err = io.Copy(fw, body); err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return "", err
		}
		if fw.err != nil {
			// The volume's side (ENOSPC past its size: 507), not the client's.
			return "", fw.err
		}
		return "", errorf(http.StatusBadRequest, "reading upload body: %v", err)
	}
	// Descriptor-based chown/chmod cannot be redirected by path games.
	if p.uid >= 0 || p.gid >= 0 {
		if err = f.Chown(p.uid, p.gid); err != nil {
			return "", err
		}
	}
	if err = f.Chmod(toFileMode(p.mode)); err != nil {
		return "", err
	}
	// Sync before rename so a crash cannot leave an empty file in place of
	// the old one.
	if err = f.Sync(); err != nil {
		return "", err
	}
	if err = f.Close(); err != nil {
		return "", err
	}
	return name, nil
}
