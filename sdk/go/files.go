package cubicle

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"connectrpc.com/connect"

	"github.com/cubicle-dev/cubicle/sdk/go/envd/filesystem"
)

// Files reads and writes a sandbox's filesystem.
type Files struct{ sb *Sandbox }

// Files returns the sandbox's filesystem API.
func (s *Sandbox) Files() *Files { return &Files{sb: s} }

// Entry types.
const (
	TypeFile    = "file"
	TypeDir     = "dir"
	TypeSymlink = "symlink"
)

// EntryInfo describes a file, directory or symlink.
type EntryInfo struct {
	Name          string
	Type          string // TypeFile, TypeDir, TypeSymlink
	Path          string
	Size          int64
	Mode          os.FileMode
	Permissions   string // like -rw-r--r--
	Owner, Group  string
	ModifiedTime  time.Time
	SymlinkTarget string
	Metadata      map[string]string
}

func entryFrom(e *filesystem.EntryInfo) EntryInfo {
	out := EntryInfo{Name: e.GetName(), Path: e.GetPath(), Size: e.GetSize(), Mode: os.FileMode(e.GetMode()), Permissions: e.GetPermissions(),
		Owner: e.GetOwner(), Group: e.GetGroup(), SymlinkTarget: e.GetSymlinkTarget(), Metadata: e.GetMetadata()}
	switch e.GetType() {
	case filesystem.FileType_FILE_TYPE_FILE:
		out.Type = TypeFile
	case filesystem.FileType_FILE_TYPE_DIRECTORY:
		out.Type = TypeDir
	case filesystem.FileType_FILE_TYPE_SYMLINK:
		out.Type = TypeSymlink
	}
	if e.GetIsSymlink() { // type then names the target's type
		out.Type = TypeSymlink
	}
	if t := e.GetModifiedTime(); t != nil {
		out.ModifiedTime = t.AsTime()
	}
	return out
}

// FileOptions picks the Linux user a file call acts as ("" = default).
type FileOptions struct {
	User string
}

func user(o *FileOptions) string {
	if o == nil {
		return ""
	}
	return o.User
}

func (f *Files) filesURL(path, user string) string {
	q := url.Values{"path": {path}}
	if user != "" {
		q.Set("username", user)
	}
	return f.sb.envd.base + "/files?" + q.Encode()
}

// Read streams a file's content; close the reader when done. A missing
// file is ErrFileNotFound.
func (f *Files) Read(ctx context.Context, path string, o *FileOptions) (io.ReadCloser, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, f.filesURL(path, user(o)), nil)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalidArgument, err)
	}
	resp, err := f.sb.envd.http.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		defer resp.Body.Close()
		return nil, apiErrorFrom(resp, http.MethodGet, "/files?path="+path, resFile)
	}
	return resp.Body, nil
}

// ReadFile reads a whole (small) file.
func (f *Files) ReadFile(ctx context.Context, path string, o *FileOptions) ([]byte, error) {
	r, err := f.Read(ctx, path, o)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	return io.ReadAll(r)
}

// Write streams r into path (parents are created), without buffering the
// content. The body is sent chunked as application/octet-stream.
func (f *Files) Write(ctx context.Context, path string, r io.Reader, o *FileOptions) (*EntryInfo, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, f.filesURL(path, user(o)), r)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalidArgument, err)
	}
	req.Header.Set("Content-Type", "application/octet-stream")
	ents, err := f.upload(ctx, req, "/files?path="+path)
	if err != nil {
		return nil, err
	}
	return &ents[0], nil
}

// WriteEntry is one file of WriteFiles.
type WriteEntry struct {
	Path string
	Data io.Reader
}

// WriteFiles writes several files in one multipart request, streamed.
func (f *Files) WriteFiles(ctx context.Context, files []WriteEntry, o *FileOptions) ([]EntryInfo, error) {
	if len(files) == 0 {
		return nil, fmt.Errorf("%w: no files", ErrInvalidArgument)
	}
	pr, pw := io.Pipe()
	mw := multipart.NewWriter(pw)
	go func() {
		for _, e := range files {
			part, err := mw.CreateFormFile("file", e.Path)
			if err == nil {
				_, err = io.Copy(part, e.Data)
			}
			if err != nil {
				pw.CloseWithError(err)
				return
			}
		}
		pw.CloseWithError(mw.Close())
	}()
	q := url.Values{}
	if u := user(o); u != "" {
		q.Set("username", u)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, f.sb.envd.base+"/files?"+q.Encode(), pr)
	if err != nil {
		pr.Close()
		return nil, err
	}
	req.Header.Set("Content-Type", mw.FormDataContentType())
	return f.upload(ctx, req, "/files")
}

func (f *Files) upload(ctx context.Context, req *http.Request, what string) ([]EntryInfo, error) {
	resp, err := f.sb.envd.http.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return nil, apiErrorFrom(resp, http.MethodPost, what, resFile)
	}
	var raw []struct {
		Path     string            `json:"path"`
		Name     string            `json:"name"`
		Type     string            `json:"type"`
		Metadata map[string]string `json:"metadata"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&raw); err != nil {
		return nil, fmt.Errorf("POST %s: decode response: %w", what, err)
	}
	if len(raw) == 0 {
		return nil, fmt.Errorf("POST %s: the sandbox reported no written file", what)
	}
	out := make([]EntryInfo, len(raw))
	for i, e := range raw {
		t := e.Type
		if t == "directory" {
			t = TypeDir
		}
		out[i] = EntryInfo{Path: e.Path, Name: e.Name, Type: t, Metadata: e.Metadata}
	}
	return out, nil
}

func (f *Files) rpcCtx(ctx context.Context, o *FileOptions) (context.Context, context.CancelFunc, http.Header) {
	c, cancel := f.sb.envd.unaryCtx(ctx)
	h := http.Header{}
	userHeader(h, user(o))
	return c, cancel, h
}

func withHeader[T any](m *T, h http.Header) *connect.Request[T] {
	r := connect.NewRequest(m)
	for k, v := range h {
		r.Header()[k] = v
	}
	return r
}

// List lists a directory, depth levels deep (≤0 means 1).
func (f *Files) List(ctx context.Context, path string, depth int, o *FileOptions) ([]EntryInfo, error) {
	if depth <= 0 {
		depth = 1
	}
	c, cancel, h := f.rpcCtx(ctx, o)
	defer cancel()
	resp, err := f.sb.envd.fs.ListDir(c, withHeader(&filesystem.ListDirRequest{Path: path, Depth: uint32(depth)}, h))
	if err != nil {
		return nil, rpcErr(ctx, "filesystem.ListDir", err, resFile)
	}
	var out []EntryInfo
	for _, e := range resp.Msg.GetEntries() {
		if ent := entryFrom(e); ent.Type != "" {
			out = append(out, ent)
		}
	}
	return out, nil
}

// Stat describes path (ErrFileNotFound when missing).
func (f *Files) Stat(ctx context.Context, path string, o *FileOptions) (*EntryInfo, error) {
	c, cancel, h := f.rpcCtx(ctx, o)
	defer cancel()
	resp, err := f.sb.envd.fs.Stat(c, withHeader(&filesystem.StatRequest{Path: path}, h))
	if err != nil {
		return nil, rpcErr(ctx, "filesystem.Stat", err, resFile)
	}
	e := entryFrom(resp.Msg.GetEntry())
	return &e, nil
}

// Exists reports whether path exists.
func (f *Files) Exists(ctx context.Context, path string, o *FileOptions) (bool, error) {
	_, err := f.Stat(ctx, path, o)
	if errors.Is(err, ErrFileNotFound) {
		return false, nil
	}
	return err == nil, err
}

// MakeDir creates path and its parents; false (no error) when it already
// was a directory.
func (f *Files) MakeDir(ctx context.Context, path string, o *FileOptions) (bool, error) {
	c, cancel, h := f.rpcCtx(ctx, o)
	defer cancel()
	_, err := f.sb.envd.fs.MakeDir(c, withHeader(&filesystem.MakeDirRequest{Path: path}, h))
	if err != nil {
		if connect.CodeOf(err) == connect.CodeAlreadyExists {
			return false, nil
		}
		return false, rpcErr(ctx, "filesystem.MakeDir", err, resFile)
	}
	return true, nil
}

// Rename moves oldPath to newPath.
func (f *Files) Rename(ctx context.Context, oldPath, newPath string, o *FileOptions) (*EntryInfo, error) {
	c, cancel, h := f.rpcCtx(ctx, o)
	defer cancel()
	resp, err := f.sb.envd.fs.Move(c, withHeader(&filesystem.MoveRequest{Source: oldPath, Destination: newPath}, h))
	if err != nil {
		return nil, rpcErr(ctx, "filesystem.Move", err, resFile)
	}
	e := entryFrom(resp.Msg.GetEntry())
	return &e, nil
}

// Remove deletes a file or a directory tree.
func (f *Files) Remove(ctx context.Context, path string, o *FileOptions) error {
	c, cancel, h := f.rpcCtx(ctx, o)
	defer cancel()
	_, err := f.sb.envd.fs.Remove(c, withHeader(&filesystem.RemoveRequest{Path: path}, h))
	return rpcErr(ctx, "filesystem.Remove", err, resFile)
}

// Event types of a FilesystemEvent.
const (
	EventCreate = "create"
	EventWrite  = "write"
	EventRemove = "remove"
	EventRename = "rename"
	EventChmod  = "chmod"
)

// FilesystemEvent is one change WatchDir saw.
type FilesystemEvent struct {
	Name  string // relative to the watched directory
	Type  string // EventCreate, ...
	Entry *EntryInfo
}

// WatchOptions configures WatchDir.
type WatchOptions struct {
	Recursive    bool
	IncludeEntry bool
	User         string
	// Timeout bounds the watch (0: until ctx ends or Stop).
	Timeout time.Duration
}

// Watcher follows a directory; read Events until it is closed, then Err.
type Watcher struct {
	events chan FilesystemEvent
	cancel context.CancelFunc
	err    error
	done   chan struct{}
}

// Events delivers changes; it is closed when the watch ends.
func (w *Watcher) Events() <-chan FilesystemEvent { return w.events }

// Stop ends the watch.
func (w *Watcher) Stop() { w.cancel(); <-w.done }

// Err is why the watch ended (nil after Stop or a clean end).
func (w *Watcher) Err() error { <-w.done; return w.err }

// WatchDir watches path; it returns once the sandbox confirms the watch,
// so changes made after it returns are seen.
func (f *Files) WatchDir(ctx context.Context, path string, o *WatchOptions) (*Watcher, error) {
	if o == nil {
		o = &WatchOptions{}
	}
	sctx, cancel := streamCtx(ctx, o.Timeout)
	h := http.Header{"Keepalive-Ping-Interval": {keepaliveSeconds}}
	userHeader(h, o.User)
	stream, err := f.sb.envd.fs.WatchDir(sctx, withHeader(&filesystem.WatchDirRequest{Path: path, Recursive: o.Recursive, IncludeEntry: o.IncludeEntry}, h))
	if err != nil {
		cancel()
		return nil, rpcErr(ctx, "filesystem.WatchDir", err, resFile)
	}
	if !stream.Receive() || stream.Msg().GetStart() == nil {
		err := rpcErr(ctx, "filesystem.WatchDir", stream.Err(), resFile)
		stream.Close()
		cancel()
		if err == nil {
			err = errors.New("cubicle: watch stream did not start")
		}
		return nil, err
	}
	w := &Watcher{events: make(chan FilesystemEvent, 64), cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(w.done)
		defer close(w.events)
		defer stream.Close()
		for stream.Receive() {
			fe := stream.Msg().GetFilesystem()
			if fe == nil {
				continue
			}
			ev := FilesystemEvent{Name: fe.GetName(), Type: strings.ToLower(strings.TrimPrefix(fe.GetType().String(), "EVENT_TYPE_"))}
			if fe.Entry != nil {
				e := entryFrom(fe.Entry)
				ev.Entry = &e
			}
			select {
			case w.events <- ev:
			case <-sctx.Done():
				return
			}
		}
		switch {
		case ctx.Err() != nil:
			w.err = ctx.Err()
		case sctx.Err() == nil:
			// The stream ended on its own (sandbox gone, directory removed).
			w.err = rpcErr(ctx, "filesystem.WatchDir", stream.Err(), resFile)
		}
		// Stop or the watch Timeout: a clean end.
	}()
	return w, nil
}
