package agent

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"time"

	"connectrpc.com/connect"
	"github.com/fsnotify/fsnotify"
	"golang.org/x/sys/unix"

	fspb "github.com/cubicle-dev/cubicle/sdk/go/envd/filesystem"
)

// maxBufferedEvents bounds a polling watcher's queue; older events are dropped.
const maxBufferedEvents = 10000

var errWatcherNotFound = errors.New("agent: watcher not found")

// Network filesystems where inotify is unreliable (statfs f_type).
var networkFSTypes = map[int64]string{
	0x6969:     "nfs",
	0xFF534D42: "cifs",
	0xFE534D42: "smb2",
	0x517B:     "smb",
	0x65735546: "fuse",
}

type dirWatcher struct {
	root         string
	recursive    bool
	includeEntry bool
	names        *idNames
	w            *fsnotify.Watcher
	events       chan *fspb.FilesystemEvent
	done         chan struct{}
	closeOnce    sync.Once
}

func (a *Agent) newDirWatcher(u *sysUser, path string, recursive, includeEntry, allowNetwork bool) (*dirWatcher, error) {
	err := asUser(u, func() error {
		fi, err := os.Stat(path)
		if err != nil {
			return err
		}
		if !fi.IsDir() {
			return fmt.Errorf("%w: %s", ErrNotDir, path)
		}
		// inotify_add_watch needs read permission; opening the directory checks
		// it with this thread's fsuid (access(2) would use the real uid).
		f, err := os.Open(path)
		if err != nil {
			return err
		}
		return f.Close()
	})
	if err != nil {
		return nil, fsError(err, "watch "+path)
	}
	if !allowNetwork {
		var st unix.Statfs_t
		if err := unix.Statfs(path, &st); err == nil {
			if name, ok := networkFSTypes[int64(st.Type)]; ok {
				return nil, connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("%s is on a network mount (%s); set allow_network_mounts to watch it", path, name))
			}
		}
	}
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return nil, connect.NewError(connect.CodeInternal, err)
	}
	dw := &dirWatcher{
		root: path, recursive: recursive, includeEntry: includeEntry,
		names: a.loadIDNames(), w: w,
		events: make(chan *fspb.FilesystemEvent, 256), done: make(chan struct{}),
	}
	if err := dw.add(path); err != nil {
		w.Close()
		return nil, fsError(err, "watch "+path)
	}
	go dw.run()
	return dw, nil
}

// add watches dir and, when recursive, every directory below it.
func (d *dirWatcher) add(dir string) error {
	if !d.recursive {
		return d.w.Add(dir)
	}
	return filepath.WalkDir(dir, func(p string, de fs.DirEntry, err error) error {
		if err != nil {
			if p == dir {
				return err
			}
			return nil // unreadable subtree: skip it
		}
		if de.IsDir() {
			if err := d.w.Add(p); err != nil && p == dir {
				return err
			}
		}
		return nil
	})
}

func mapOp(op fsnotify.Op) []fspb.EventType {
	var out []fspb.EventType
	if op.Has(fsnotify.Create) {
		out = append(out, fspb.EventType_EVENT_TYPE_CREATE)
	}
	if op.Has(fsnotify.Write) {
		out = append(out, fspb.EventType_EVENT_TYPE_WRITE)
	}
	if op.Has(fsnotify.Remove) {
		out = append(out, fspb.EventType_EVENT_TYPE_REMOVE)
	}
	if op.Has(fsnotify.Rename) {
		out = append(out, fspb.EventType_EVENT_TYPE_RENAME)
	}
	if op.Has(fsnotify.Chmod) {
		out = append(out, fspb.EventType_EVENT_TYPE_CHMOD)
	}
	return out
}

func (d *dirWatcher) run() {
	defer close(d.events)
	for {
		select {
		case <-d.done:
			return
		case ev, ok := <-d.w.Events:
			if !ok {
				return
			}
			if d.recursive && ev.Has(fsnotify.Create) {
				if fi, err := os.Lstat(ev.Name); err == nil && fi.IsDir() {
					_ = d.add(ev.Name)
				}
			}
			rel, err := filepath.Rel(d.root, ev.Name)
			if err != nil {
				rel = ev.Name
			}
			for _, t := range mapOp(ev.Op) {
				fe := &fspb.FilesystemEvent{Name: rel, Type: t}
				if d.includeEntry && t != fspb.EventType_EVENT_TYPE_REMOVE && t != fspb.EventType_EVENT_TYPE_RENAME {
					if e, err := entryInfo(ev.Name, d.names); err == nil {
						fe.Entry = e
					}
				}
				select {
				case d.events <- fe:
				case <-d.done:
					return
				}
			}
		case _, ok := <-d.w.Errors:
			if !ok {
				return
			}
		}
	}
}

func (d *dirWatcher) close() {
	d.closeOnce.Do(func() {
		close(d.done)
		d.w.Close()
	})
}

func (s *filesystemService) WatchDir(ctx context.Context, req *connect.Request[fspb.WatchDirRequest], stream *connect.ServerStream[fspb.WatchDirResponse]) error {
	u, path, err := s.userPath(ctx, req.Msg.GetPath())
	if err != nil {
		return err
	}
	dw, err := s.a.newDirWatcher(u, path, req.Msg.GetRecursive(), req.Msg.GetIncludeEntry(), req.Msg.GetAllowNetworkMounts())
	if err != nil {
		return err
	}
	defer dw.close()
	if err := stream.Send(&fspb.WatchDirResponse{Event: &fspb.WatchDirResponse_Start{Start: &fspb.WatchDirResponse_StartEvent{}}}); err != nil {
		return err
	}
	keepalive := keepaliveInterval(req.Header())
	t := time.NewTicker(keepalive)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctxErr(ctx)
		case <-t.C:
			if err := stream.Send(&fspb.WatchDirResponse{Event: &fspb.WatchDirResponse_Keepalive{Keepalive: &fspb.WatchDirResponse_KeepAlive{}}}); err != nil {
				return err
			}
		case ev, ok := <-dw.events:
			if !ok {
				return connect.NewError(connect.CodeInternal, errors.New("watcher closed"))
			}
			if err := stream.Send(&fspb.WatchDirResponse{Event: &fspb.WatchDirResponse_Filesystem{Filesystem: ev}}); err != nil {
				return err
			}
			t.Reset(keepalive)
		}
	}
}

// polledWatcher buffers events for GetWatcherEvents.
type polledWatcher struct {
	dw     *dirWatcher
	mu     sync.Mutex
	events []*fspb.FilesystemEvent
}

type watcherTable struct {
	mu sync.Mutex
	m  map[string]*polledWatcher
}

func newWatcherTable() *watcherTable { return &watcherTable{m: map[string]*polledWatcher{}} }

func (t *watcherTable) closeAll() {
	t.mu.Lock()
	defer t.mu.Unlock()
	for id, w := range t.m {
		w.dw.close()
		delete(t.m, id)
	}
}

func (s *filesystemService) CreateWatcher(ctx context.Context, req *connect.Request[fspb.CreateWatcherRequest]) (*connect.Response[fspb.CreateWatcherResponse], error) {
	u, path, err := s.userPath(ctx, req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	dw, err := s.a.newDirWatcher(u, path, req.Msg.GetRecursive(), req.Msg.GetIncludeEntry(), req.Msg.GetAllowNetworkMounts())
	if err != nil {
		return nil, err
	}
	var b [16]byte
	_, _ = rand.Read(b[:])
	id := hex.EncodeToString(b[:])
	pw := &polledWatcher{dw: dw}
	go func() {
		for ev := range dw.events {
			pw.mu.Lock()
			if len(pw.events) >= maxBufferedEvents {
				pw.events = pw.events[1:]
			}
			pw.events = append(pw.events, ev)
			pw.mu.Unlock()
		}
	}()
	s.a.watchers.mu.Lock()
	s.a.watchers.m[id] = pw
	s.a.watchers.mu.Unlock()
	return connect.NewResponse(&fspb.CreateWatcherResponse{WatcherId: id}), nil
}

func (s *filesystemService) GetWatcherEvents(ctx context.Context, req *connect.Request[fspb.GetWatcherEventsRequest]) (*connect.Response[fspb.GetWatcherEventsResponse], error) {
	s.a.watchers.mu.Lock()
	pw, ok := s.a.watchers.m[req.Msg.GetWatcherId()]
	s.a.watchers.mu.Unlock()
	if !ok {
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("watcher %s not found: %w", req.Msg.GetWatcherId(), errWatcherNotFound))
	}
	pw.mu.Lock()
	events := pw.events
	pw.events = nil
	pw.mu.Unlock()
	return connect.NewResponse(&fspb.GetWatcherEventsResponse{Events: events}), nil
}

func (s *filesystemService) RemoveWatcher(ctx context.Context, req *connect.Request[fspb.RemoveWatcherRequest]) (*connect.Response[fspb.RemoveWatcherResponse], error) {
	s.a.watchers.mu.Lock()
	pw, ok := s.a.watchers.m[req.Msg.GetWatcherId()]
	delete(s.a.watchers.m, req.Msg.GetWatcherId())
	s.a.watchers.mu.Unlock()
	if !ok {
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("watcher %s not found: %w", req.Msg.GetWatcherId(), errWatcherNotFound))
	}
	pw.dw.close()
	return connect.NewResponse(&fspb.RemoveWatcherResponse{}), nil
}
