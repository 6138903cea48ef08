package agent

import (
	"bufio"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"mime"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cubicle-dev/cubicle/internal/agentapi"
)

const (
	maxMetadataKey   = 246  // VFS xattr name limit minus "user.e2b."
	maxMetadataTotal = 4096 // per-inode xattr budget
)

// The /files auth errors carry envd's texts (packages/envd/internal/api/
// auth.go, validateSigning) because SDK users read them; all answer 401.
var (
	errTokenMismatch = errors.New("access token present in header but does not match")

	errBadMetadata = errors.New("agent: invalid metadata")
)

// checkFileAuth implements envd's /files auth: an X-Access-Token header must
// match, or else a valid, unexpired signature. An agent without a token
// refuses every request.
func (a *Agent) checkFileAuth(r *http.Request, op string) error {
	token := a.currentToken()
	if token == "" {
		// Fails closed: no signature can be checked without a token.
		return ErrUnauthorized
	}
	if h := r.Header.Get("X-Access-Token"); h != "" {
		if tokenEqual(h, token) {
			return nil
		}
		return errTokenMismatch
	}
	q := r.URL.Query()
	if !q.Has("signature") {
		return agentapi.ErrMissingSignature
	}
	sig := q.Get("signature")
	var exp int64
	if s := q.Get("signature_expiration"); s != "" {
		v, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return agentapi.ErrInvalidSignature
		}
		exp = v
	}
	if !tokenEqual(sig, agentapi.Signature(q.Get("path"), op, q.Get("username"), token, exp)) {
		return agentapi.ErrInvalidSignature
	}
	// Checked after the signature, as envd does, so an unsigned expiration
	// reveals nothing.
	if exp != 0 && exp < time.Now().Unix() {
		return agentapi.ErrExpiredSignature
	}
	return nil
}

// fileUser picks the username query parameter, else the Basic-auth or default user.
func (a *Agent) fileUser(r *http.Request) (*sysUser, error) {
	if name := r.URL.Query().Get("username"); name != "" {
		return a.lookupUser(name)
	}
	return a.requestUser(r.Context())
}

// fileErrStatus maps a file-operation error to an HTTP status.
func fileErrStatus(err error) int {
	switch {
	case errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.EDQUOT):
		return http.StatusInsufficientStorage
	case errors.Is(err, fs.ErrNotExist):
		return http.StatusNotFound
	case errors.Is(err, fs.ErrPermission):
		return http.StatusForbidden
	case errors.Is(err, ErrInvalidPath), errors.Is(err, ErrIsDir), errors.Is(err, ErrNotDir),
		errors.Is(err, syscall.EISDIR), errors.Is(err, syscall.ENOTDIR), errors.Is(err, syscall.ENAMETOOLONG),
		errors.Is(err, errBadMetadata):
		return http.StatusBadRequest
	}
	return http.StatusInternalServerError
}

func (a *Agent) handleDownload(w http.ResponseWriter, r *http.Request) {
	if err := a.checkFileAuth(r, "read"); err != nil {
		writeJSONError(w, http.StatusUnauthorized, err.Error())
		return
	}
	u, err := a.fileUser(r)
	if err != nil {
		writeJSONError(w, http.StatusUnauthorized, err.Error())
		return
	}
	path, err := resolvePath(r.URL.Query().Get("path"), u)
	if err != nil {
		writeJSONError(w, http.StatusBadRequest, err.Error())
		return
	}
	var f *os.File
	err = asUser(u, func() (err error) { f, err = os.Open(path); return })
	if err != nil {
		status := fileErrStatus(err)
		if status == http.StatusNotFound {
			writeJSONError(w, status, "file not found: "+path)
			return
		}
		writeJSONError(w, status, err.Error())
		return
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		writeJSONError(w, http.StatusInternalServerError, err.Error())
		return
	}
	if fi.IsDir() {
		writeJSONError(w, http.StatusBadRequest, "path is a directory: "+path)
		return
	}
	h := w.Header()
	h.Set("Content-Disposition", mime.FormatMediaType("inline", map[string]string{"filename": filepath.Base(path)}))
	h.Add("Vary", "Accept-Encoding")
	if fi.Size() == 0 {
		// The SDK relies on an explicit Content-Length: 0 for empty files.
		h.Set("Content-Type", "application/octet-stream")
		h.Set("Content-Length", "0")
		h.Set("Last-Modified", fi.ModTime().UTC().Format(http.TimeFormat))
		w.WriteHeader(http.StatusOK)
		return
	}
	enc, ok := chooseEncoding(r.Header.Values("Accept-Encoding"))
	if r.Header.Get("Range") != "" && ok {
		// Ranges refer to the identity encoding; serve them uncompressed.
		enc = "identity"
	}
	if !ok {
		writeJSONError(w, http.StatusNotAcceptable, "no acceptable content encoding (supported: gzip, identity)")
		return
	}
	if enc == "gzip" {
		ct := mime.TypeByExtension(filepath.Ext(path))
		if ct == "" {
			ct = "application/octet-stream"
		}
		h.Set("Content-Type", ct)
		h.Set("Content-Encoding", "gzip")
		h.Set("Last-Modified", fi.ModTime().UTC().Format(http.TimeFormat))
		w.WriteHeader(http.StatusOK)
		if r.Method == http.MethodHead {
			return
		}
		// BestSpeed and 64 KiB writes: Node clients always send
		// Accept-Encoding: gzip, so this path carries every SDK download, and
		// the proxy flushes each write of a length-less body at once.
		bw := bufio.NewWriterSize(w, 64<<10)
		gz, _ := gzip.NewWriterLevel(bw, gzip.BestSpeed)
		if _, err := io.Copy(gz, slotFile{f}); err != nil {
			return // headers are out; the client sees a truncated stream
		}
		if gz.Close() == nil {
			_ = bw.Flush()
		}
		return
	}
	http.ServeContent(w, r, filepath.Base(path), fi.ModTime(), slotFile{f})
}

// chooseEncoding picks gzip when accepted with q>0, else identity unless it is
// explicitly refused (then ok is false → 406).
func chooseEncoding(values []string) (enc string, ok bool) {
	identityOK := true
	gzipOK := false
	for _, v := range values {
		for _, part := range strings.Split(v, ",") {
			name, params, _ := strings.Cut(strings.TrimSpace(part), ";")
			name = strings.ToLower(strings.TrimSpace(name))
			q := 1.0
			if k, val, found := strings.Cut(strings.TrimSpace(params), "="); found && strings.TrimSpace(k) == "q" {
				if f, err := strconv.ParseFloat(strings.TrimSpace(val), 64); err == nil {
					q = f
				}
			}
			switch name {
			case "gzip", "x-gzip":
				gzipOK = q > 0
			case "identity":
				identityOK = q > 0
			case "*":
				if q > 0 {
					gzipOK = true
				} else {
					identityOK = false
				}
			}
		}
	}
	if gzipOK {
		return "gzip", true
	}
	return "identity", identityOK
}

// uploadedEntry is one element of POST /files' response.
type uploadedEntry struct {
	Path     string            `json:"path"`
	Name     string            `json:"name"`
	Type     string            `json:"type"`
	Metadata map[string]string `json:"metadata,omitempty"`
}

// parseMetadata collects X-Metadata-* headers (first value wins).
func parseMetadata(h http.Header) (map[string]string, error) {
	md := map[string]string{}
	total := 0
	for k, vs := range h {
		lk := strings.ToLower(k)
		if !strings.HasPrefix(lk, "x-metadata-") || len(vs) == 0 {
			continue
		}
		key := strings.TrimPrefix(lk, "x-metadata-")
		val := vs[0]
		if key == "" || len(key) > maxMetadataKey || !printableASCII(key) || !printableASCII(val) {
			return nil, fmt.Errorf("%w: %q", errBadMetadata, key)
		}
		total += len(xattrPrefix) + len(key) + len(val)
		md[key] = val
	}
	if total > maxMetadataTotal {
		return nil, fmt.Errorf("%w: %d bytes exceeds %d", errBadMetadata, total, maxMetadataTotal)
	}
	return md, nil
}

func printableASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] > 0x7e {
			return false
		}
	}
	return true
}

// setMetadata replaces the file's user.e2b.* xattrs with md.
func setMetadata(f *os.File, md map[string]string) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var opErr error
	err = rc.Control(func(fd uintptr) {
		buf := make([]byte, 64*1024)
		n, err := unix.Flistxattr(int(fd), buf)
		if err == nil {
			for _, name := range strings.Split(string(buf[:n]), "\x00") {
				if strings.HasPrefix(name, xattrPrefix) {
					_ = unix.Fremovexattr(int(fd), name)
				}
			}
		}
		for k, v := range md {
			if err := unix.Fsetxattr(int(fd), xattrPrefix+k, []byte(v), 0); err != nil {
				opErr = fmt.Errorf("set metadata %s: %w", k, err)
				return
			}
		}
	})
	if err != nil {
		return err
	}
	return opErr
}

// writeFile streams src into path as user u, creating parent directories
// (see ensureDirs). The file is opened with the user's identity (so
// permissions are enforced and a new file is owned by the user) and then
// written by this goroutine; only a fixed-size copy buffer is held in memory.
func writeFile(u *sysUser, path string, src io.Reader, md map[string]string) error {
	if err := ensureDirs(u, filepath.Dir(path)); err != nil {
		return err
	}
	var f *os.File
	dirFD, denied := -1, error(nil)
	// Asked here: inside asUser the thread may carry u's effective IDs
	// (where setfsuid is missing, as under gVisor).
	rootPath := u.UID != 0 && os.Geteuid() == 0
	err := asUser(u, func() error {
		if fi, err := os.Stat(path); err == nil && fi.IsDir() {
			return fmt.Errorf("%w: %s", ErrIsDir, path)
		}
		var err error
		if f, err = os.OpenFile(path, os.O_WRONLY|os.O_CREATE, 0o644); err != nil {
			if !errors.Is(err, fs.ErrPermission) || !rootPath {
				return err
			}
			// As envd, which writes as root: a new file in a directory u may
			// search but not write (one root made, say) is made by root
			// (createAsRoot, below) and handed to u. The directory is opened
			// here, as u, through no symlink: another user's link on the way
			// must not steer root's file into a directory of its choosing.
			fd, derr := openDirNoSymlinks(filepath.Dir(path))
			if derr != nil {
				return err
			}
			dirFD, denied = fd, err
			return nil
		}
		// envd (root) chowns the file it opened to the user before writing,
		// and watchers see that as a chmod event: the SDKs' watch tests count
		// create, chmod, write. A chown to the file's own owner changes
		// nothing and is seen the same (it fails, harmlessly, on a file the
		// user may write but does not own). Truncating after it keeps envd's
		// order for a file that existed: chmod, then the truncation's write.
		var st unix.Stat_t
		if err := unix.Fstat(int(f.Fd()), &st); err != nil {
			f.Close()
			return err
		}
		_ = unix.Fchown(int(f.Fd()), int(st.Uid), -1)
		if st.Size > 0 {
			if err := f.Truncate(0); err != nil {
				f.Close()
				return err
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	if f == nil {
		f, err = createAsRoot(u, dirFD, path, denied)
		unix.Close(dirFD)
		if err != nil {
			return err
		}
	}
	buf := make([]byte, 256*1024)
	if _, err := io.CopyBuffer(slotFile{f}, src, buf); err != nil {
		f.Close()
		return err
	}
	if err := setMetadata(f, md); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// openDirNoSymlinks opens the absolute, clean directory dir (O_PATH) one
// component at a time with O_NOFOLLOW, so that no component may be a
// symlink, and checks that the caller may search dir itself. It is
// RESOLVE_NO_SYMLINKS by hand: gVisor has no openat2.
func openDirNoSymlinks(dir string) (int, error) {
	fd, err := unix.Open("/", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	for _, name := range strings.Split(strings.TrimPrefix(dir, "/"), "/") {
		if name == "" {
			continue
		}
		next, err := unix.Openat(fd, name, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		unix.Close(fd)
		if err != nil {
			return -1, &fs.PathError{Op: "open", Path: dir, Err: err}
		}
		fd = next
	}
	// "." makes the kernel check that the caller may search dir itself.
	self, err := unix.Openat(fd, ".", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	unix.Close(fd)
	if err != nil {
		return -1, &fs.PathError{Op: "open", Path: dir, Err: err}
	}
	return self, nil
}

// createAsRoot is writeFile's root path for a new file: dirFD is the file's
// directory opened as u, denied the error u got itself. As in mkdirsAsRoot,
// root never resolves the path: u opened the directory (so u may search it,
// and no symlink was on the way: openDirNoSymlinks), and root only
// adds a new entry to it (O_EXCL, O_NOFOLLOW), never in a directory u could
// modify (u could swap the entry before it is handed over, and could create
// it itself). A file that exists is never taken over: u gets denied. The
// file is u's (chown, which watchers see as envd's chmod) before a byte is
// written.
func createAsRoot(u *sysUser, dirFD int, path string, denied error) (*os.File, error) {
	var st unix.Stat_t
	if err := unix.Fstat(dirFD, &st); err != nil {
		return nil, &fs.PathError{Op: "stat", Path: filepath.Dir(path), Err: err}
	}
	if mayModify(u, &st) {
		return nil, denied
	}
	name := filepath.Base(path)
	fd, err := unix.Openat(dirFD, name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o644)
	if err == unix.EEXIST {
		return nil, denied
	}
	if err != nil {
		return nil, &fs.PathError{Op: "create", Path: path, Err: err}
	}
	if err := unix.Fchown(fd, int(u.UID), int(u.GID)); err != nil {
		_ = unix.Unlinkat(dirFD, name, 0)
		unix.Close(fd)
		return nil, &fs.PathError{Op: "chown", Path: path, Err: err}
	}
	return os.NewFile(uintptr(fd), path), nil
}

// rootMkdirMu serialises the directories the agent makes as root: parallel
// uploads into one new tree (the SDKs write files concurrently) must not find
// each other's directories before they have been handed to the user.
var rootMkdirMu sync.Mutex

// ensureDirs makes dir and its missing parents for u, as envd does for
// uploads, MakeDir and Move. envd runs as root, so a user may write /0/a.txt
// though it may not create /0. Directories u may create are made as u; where
// u may not, the agent makes the missing ones as root and hands each to u.
// Directories that already exist are never changed.
func ensureDirs(u *sysUser, dir string) error {
	mkdirAll := func() error { return os.MkdirAll(dir, 0o755) }
	err := asUser(u, mkdirAll)
	if err == nil || u.UID == 0 || os.Geteuid() != 0 || !errors.Is(err, fs.ErrPermission) {
		return err
	}
	rootMkdirMu.Lock()
	defer rootMkdirMu.Unlock()
	// An upload that held the lock may have made dir meanwhile.
	if err = asUser(u, mkdirAll); !errors.Is(err, fs.ErrPermission) {
		return err
	}
	return mkdirsAsRoot(u, dir, err)
}

// mkdirsAsRoot is ensureDirs' root path; denied is the error u got itself.
//
// Root never resolves a path on its own authority here: the deepest existing
// ancestor is opened as u, so a symlink in the path is followed only as far
// as u may follow it, and u must be able to search that ancestor (otherwise
// it could not use what is made below it). The new directories are made
// relative to that descriptor, and refused when u could modify the ancestor:
// u could then swap what root makes before it is handed over.
func mkdirsAsRoot(u *sysUser, dir string, denied error) error {
	anc, ancPath := -1, dir
	var missing []string // deepest first
	err := asUser(u, func() error {
		for {
			// "p/." makes the kernel check that u may search p itself.
			fd, err := unix.Open(ancPath+"/.", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
			if err == nil {
				anc = fd
				return nil
			}
			if err != unix.ENOENT || ancPath == "/" {
				return &fs.PathError{Op: "open", Path: ancPath, Err: err}
			}
			missing = append(missing, filepath.Base(ancPath))
			ancPath = filepath.Dir(ancPath)
		}
	})
	if err != nil {
		return err
	}
	defer unix.Close(anc)
	var st unix.Stat_t
	if err := unix.Fstat(anc, &st); err != nil {
		return &fs.PathError{Op: "stat", Path: ancPath, Err: err}
	}
	if mayModify(u, &st) {
		return denied
	}
	var made []int // descriptors of the new directories, shallowest first
	parent, path := anc, ancPath
	defer func() {
		for _, fd := range made {
			unix.Close(fd)
		}
	}()
	undo := func() {
		for i := len(made) - 1; i >= 0; i-- {
			p := anc
			if i > 0 {
				p = made[i-1]
			}
			_ = unix.Unlinkat(p, missing[len(missing)-1-i], unix.AT_REMOVEDIR)
		}
	}
	for i := len(missing) - 1; i >= 0; i-- {
		name := missing[i]
		path = filepath.Join(path, name)
		if err := unix.Mkdirat(parent, name, 0o755); err != nil {
			undo()
			return &fs.PathError{Op: "mkdir", Path: path, Err: err}
		}
		// O_NOFOLLOW, though parent is not u's to change (the ancestor by
		// mayModify, the others still root's): it is the directory just made
		// unless another process that may write there swapped it.
		fd, err := unix.Openat(parent, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			_ = unix.Unlinkat(parent, name, unix.AT_REMOVEDIR)
			undo()
			return &fs.PathError{Op: "open", Path: path, Err: err}
		}
		made = append(made, fd)
		parent = fd
	}
	// Every descriptor is open before any directory becomes u's (after which
	// u could rename entries in it), so each chown reaches the one made here.
	for i := len(made) - 1; i >= 0; i-- {
		if err := unix.Fchown(made[i], int(u.UID), int(u.GID)); err != nil {
			undo()
			return fmt.Errorf("chown new directory for %s: %w", u.Name, err)
		}
	}
	return nil
}

// mayModify reports whether u could add, rename or remove entries in the
// directory st describes, directly or after chmod-ing it.
func mayModify(u *sysUser, st *unix.Stat_t) bool {
	switch {
	case st.Uid == u.UID, st.Mode&0o002 != 0:
		return true
	case st.Mode&0o020 != 0:
		return slices.Contains(u.Groups, st.Gid)
	}
	return false
}

func (a *Agent) handleUpload(w http.ResponseWriter, r *http.Request) {
	if err := a.checkFileAuth(r, "write"); err != nil {
		writeJSONError(w, http.StatusUnauthorized, err.Error())
		return
	}
	u, err := a.fileUser(r)
	if err != nil {
		writeJSONError(w, http.StatusUnauthorized, err.Error())
		return
	}
	md, err := parseMetadata(r.Header)
	if err != nil {
		writeJSONError(w, http.StatusBadRequest, err.Error())
		return
	}
	queryPath := r.URL.Query().Get("path")
	ct, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	var written []uploadedEntry
	entry := func(p string) uploadedEntry {
		e := uploadedEntry{Path: p, Name: filepath.Base(p), Type: "file"}
		if len(md) > 0 {
			e.Metadata = md
		}
		return e
	}
	fail := func(err error) {
		writeJSONError(w, fileErrStatus(err), err.Error())
	}
	switch ct {
	case "multipart/form-data":
		mr, err := r.MultipartReader()
		if err != nil {
			writeJSONError(w, http.StatusBadRequest, err.Error())
			return
		}
		seen := map[string]bool{}
		// Bounded by the request body: each iteration consumes one part.
		for {
			part, err := mr.NextPart()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				writeJSONError(w, http.StatusBadRequest, "multipart: "+err.Error())
				return
			}
			if part.FormName() != "file" {
				part.Close()
				continue
			}
			target := queryPath
			if target == "" {
				// Not part.FileName(): it strips directories, and here the
				// filename is the full target path.
				_, params, _ := mime.ParseMediaType(part.Header.Get("Content-Disposition"))
				target = params["filename"]
			}
			path, err := resolvePath(target, u)
			if err != nil {
				part.Close()
				fail(err)
				return
			}
			if seen[path] {
				part.Close()
				writeJSONError(w, http.StatusBadRequest, "multiple parts write to "+path)
				return
			}
			seen[path] = true
			err = writeFile(u, path, part, md)
			part.Close()
			if err != nil {
				fail(err)
				return
			}
			written = append(written, entry(path))
		}
	case "application/octet-stream":
		path, err := resolvePath(queryPath, u)
		if err != nil {
			fail(err)
			return
		}
		var body io.Reader = r.Body
		switch strings.ToLower(r.Header.Get("Content-Encoding")) {
		case "", "identity":
		case "gzip", "x-gzip":
			gz, err := gzip.NewReader(r.Body)
			if err != nil {
				writeJSONError(w, http.StatusBadRequest, "gzip: "+err.Error())
				return
			}
			defer gz.Close()
			body = gz
		default:
			writeJSONError(w, http.StatusBadRequest, "unsupported Content-Encoding")
			return
		}
		if err := writeFile(u, path, body, md); err != nil {
			if errors.Is(err, gzip.ErrChecksum) || errors.Is(err, gzip.ErrHeader) {
				writeJSONError(w, http.StatusBadRequest, err.Error())
				return
			}
			fail(err)
			return
		}
		written = append(written, entry(path))
	default:
		writeJSONError(w, http.StatusBadRequest, "unsupported Content-Type "+ct)
		return
	}
	if len(written) == 0 {
		writeJSONError(w, http.StatusBadRequest, "no file in request")
		return
	}
	writeJSON(w, http.StatusOK, written)
}
