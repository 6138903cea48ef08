package agent

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/sys/unix"

	fspb "github.com/cubicle-dev/cubicle/sdk/go/envd/filesystem"
)

func TestFilesystemRPCs(t *testing.T) {
	e := newTestEnv(t, testToken)
	ctx := context.Background()

	// MakeDir creates parents, owned by the (default) user; relative paths
	// resolve against the user's home.
	mk, err := e.fs.MakeDir(ctx, connect.NewRequest(&fspb.MakeDirRequest{Path: "a/b/c"}))
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(e.userHome, "a/b/c")
	ent := mk.Msg.GetEntry()
	if ent.GetPath() != dir || ent.GetType() != fspb.FileType_FILE_TYPE_DIRECTORY || ent.GetOwner() != "user" || ent.GetGroup() != "user" || ent.GetPermissions() != "drwxr-xr-x" {
		t.Fatalf("makedir entry %+v", ent)
	}
	if _, err := e.fs.MakeDir(ctx, connect.NewRequest(&fspb.MakeDirRequest{Path: dir})); codeOf(err) != connect.CodeAlreadyExists {
		t.Fatalf("second makedir: %v", err)
	}
	file := filepath.Join(dir, "f.txt")
	writeFileT(t, file, "hello")
	if err := os.Chown(file, 1000, 1000); err != nil {
		t.Fatal(err)
	}
	if err := unix.Setxattr(file, "user.e2b.color", []byte("blue"), 0); err != nil {
		t.Fatal(err)
	}
	if _, err := e.fs.MakeDir(ctx, connect.NewRequest(&fspb.MakeDirRequest{Path: file})); codeOf(err) != connect.CodeInvalidArgument {
		t.Fatalf("makedir on file: %v", err)
	}

	st, err := e.fs.Stat(ctx, connect.NewRequest(&fspb.StatRequest{Path: file}))
	if err != nil {
		t.Fatal(err)
	}
	fe := st.Msg.GetEntry()
	if fe.GetName() != "f.txt" || fe.GetSize() != 5 || fe.GetMode() != 0o644 || fe.GetPermissions() != "-rw-r--r--" ||
		fe.GetType() != fspb.FileType_FILE_TYPE_FILE || fe.GetMetadata()["color"] != "blue" || fe.GetModifiedTime().AsTime().IsZero() {
		t.Fatalf("stat %+v", fe)
	}
	if _, err := e.fs.Stat(ctx, connect.NewRequest(&fspb.StatRequest{Path: "/nope/nothing"})); codeOf(err) != connect.CodeNotFound {
		t.Fatalf("stat missing: %v", err)
	}
	if _, err := e.fs.Stat(ctx, connect.NewRequest(&fspb.StatRequest{Path: "bad\x00path"})); codeOf(err) != connect.CodeInvalidArgument {
		t.Fatalf("stat NUL: %v", err)
	}

	// Symlink.
	link := filepath.Join(e.userHome, "link")
	if err := os.Symlink(file, link); err != nil {
		t.Fatal(err)
	}
	// As current envd: flagged as a link, typed (and moded) as its target.
	st, err = e.fs.Stat(ctx, connect.NewRequest(&fspb.StatRequest{Path: link}))
	if en := statEntry(st); err != nil || !en.GetIsSymlink() || en.GetType() != fspb.FileType_FILE_TYPE_FILE || en.GetSymlinkTarget() != file || en.GetName() != "link" {
		t.Fatalf("symlink stat %+v %v", st, err)
	}
	dirLink := filepath.Join(e.userHome, "dirlink")
	if err := os.Symlink(e.userHome, dirLink); err != nil {
		t.Fatal(err)
	}
	st, err = e.fs.Stat(ctx, connect.NewRequest(&fspb.StatRequest{Path: dirLink}))
	if en := statEntry(st); err != nil || !en.GetIsSymlink() || en.GetType() != fspb.FileType_FILE_TYPE_DIRECTORY || en.GetSymlinkTarget() != e.userHome {
		t.Fatalf("symlink to a directory: %+v %v", st, err)
	}
	dangling := filepath.Join(e.userHome, "dangling")
	if err := os.Symlink("missing-target", dangling); err != nil {
		t.Fatal(err)
	}
	st, err = e.fs.Stat(ctx, connect.NewRequest(&fspb.StatRequest{Path: dangling}))
	if en := statEntry(st); err != nil || !en.GetIsSymlink() || en.GetType() != fspb.FileType_FILE_TYPE_UNSPECIFIED || en.GetSymlinkTarget() != filepath.Join(e.userHome, "missing-target") {
		t.Fatalf("dangling symlink: %+v %v", st, err)
	}
	if st, err := e.fs.Stat(ctx, connect.NewRequest(&fspb.StatRequest{Path: file})); err != nil || st.Msg.GetEntry().GetIsSymlink() {
		t.Fatalf("a plain file is not a link: %+v %v", st, err)
	}
	os.Remove(dirLink)
	os.Remove(dangling)

	// ListDir depth.
	names := func(depth uint32) []string {
		ld, err := e.fs.ListDir(ctx, connect.NewRequest(&fspb.ListDirRequest{Path: e.userHome, Depth: depth}))
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, en := range ld.Msg.GetEntries() {
			rel, _ := filepath.Rel(e.userHome, en.GetPath())
			out = append(out, rel)
		}
		slices.Sort(out)
		return out
	}
	if got := names(1); !slices.Equal(got, []string{"a", "link"}) {
		t.Fatalf("depth 1: %v", got)
	}
	if got := names(4); !slices.Equal(got, []string{"a", "a/b", "a/b/c", "a/b/c/f.txt", "link"}) {
		t.Fatalf("depth 4: %v", got)
	}
	if _, err := e.fs.ListDir(ctx, connect.NewRequest(&fspb.ListDirRequest{Path: file, Depth: 1})); codeOf(err) != connect.CodeInvalidArgument {
		t.Fatalf("listdir on file: %v", err)
	}
	if _, err := e.fs.ListDir(ctx, connect.NewRequest(&fspb.ListDirRequest{Path: "/does/not/exist", Depth: 1})); codeOf(err) != connect.CodeNotFound {
		t.Fatalf("listdir missing: %v", err)
	}

	// Move creates the destination's parents.
	mv, err := e.fs.Move(ctx, connect.NewRequest(&fspb.MoveRequest{Source: file, Destination: "moved/g.txt"}))
	if err != nil || mv.Msg.GetEntry().GetPath() != filepath.Join(e.userHome, "moved/g.txt") {
		t.Fatalf("move %+v %v", mv, err)
	}
	if _, err := e.fs.Move(ctx, connect.NewRequest(&fspb.MoveRequest{Source: file, Destination: "x"})); codeOf(err) != connect.CodeNotFound {
		t.Fatalf("move missing: %v", err)
	}

	// Remove is recursive.
	if _, err := e.fs.Remove(ctx, connect.NewRequest(&fspb.RemoveRequest{Path: "a"})); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(e.userHome, "a")); !os.IsNotExist(err) {
		t.Fatalf("not removed: %v", err)
	}
}

func TestFilesystemPermissionsAsUser(t *testing.T) {
	e := newTestEnv(t, testToken)
	ctx := context.Background()
	rootOnly := filepath.Join(e.root, "rootonly")
	if err := os.Mkdir(rootOnly, 0o700); err != nil {
		t.Fatal(err)
	}
	// The default user may not look into root's 0700 directory ...
	if _, err := e.fs.ListDir(ctx, connect.NewRequest(&fspb.ListDirRequest{Path: rootOnly, Depth: 1})); codeOf(err) != connect.CodePermissionDenied {
		t.Fatalf("user listdir rootonly: %v", err)
	}
	if _, err := e.fs.MakeDir(ctx, connect.NewRequest(&fspb.MakeDirRequest{Path: filepath.Join(rootOnly, "x")})); codeOf(err) != connect.CodePermissionDenied {
		t.Fatalf("user makedir in rootonly: %v", err)
	}
	if _, err := e.fs.Remove(ctx, connect.NewRequest(&fspb.RemoveRequest{Path: rootOnly})); codeOf(err) != connect.CodePermissionDenied {
		t.Fatalf("user remove rootonly: %v", err)
	}
	// ... but root may.
	rctx := asUserCtx(ctx, "root")
	mk, err := e.fs.MakeDir(rctx, connect.NewRequest(&fspb.MakeDirRequest{Path: filepath.Join(rootOnly, "x")}))
	if err != nil || mk.Msg.GetEntry().GetOwner() != "root" {
		t.Fatalf("root makedir: %+v %v", mk, err)
	}
}

func TestWatchDir(t *testing.T) {
	e := newTestEnv(t, testToken)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	dir := filepath.Join(e.userHome, "w")
	if err := os.MkdirAll(filepath.Join(dir, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	s, err := e.fs.WatchDir(ctx, connect.NewRequest(&fspb.WatchDirRequest{Path: dir, Recursive: true, IncludeEntry: true}))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if !s.Receive() || s.Msg().GetStart() == nil {
		t.Fatalf("first event not start: %v %v", s.Msg(), s.Err())
	}
	type ev struct {
		name string
		typ  fspb.EventType
	}
	events := make(chan ev, 100)
	entries := make(chan *fspb.EntryInfo, 100)
	go func() {
		for s.Receive() {
			if fe := s.Msg().GetFilesystem(); fe != nil {
				events <- ev{fe.GetName(), fe.GetType()}
				if fe.GetEntry() != nil {
					entries <- fe.GetEntry()
				}
			}
		}
		close(events)
	}()
	expect := func(name string, typ fspb.EventType) {
		t.Helper()
		timeout := time.After(5 * time.Second)
		for {
			select {
			case got, ok := <-events:
				if !ok {
					t.Fatalf("stream ended waiting for %s %v: %v", name, typ, s.Err())
				}
				if got.name == name && got.typ == typ {
					return
				}
			case <-timeout:
				t.Fatalf("no %v event for %s", typ, name)
			}
		}
	}
	f := filepath.Join(dir, "new.txt")
	writeFileT(t, f, "x")
	expect("new.txt", fspb.EventType_EVENT_TYPE_CREATE)
	if err := os.WriteFile(f, []byte("more"), 0o644); err != nil {
		t.Fatal(err)
	}
	expect("new.txt", fspb.EventType_EVENT_TYPE_WRITE)
	writeFileT(t, filepath.Join(dir, "sub", "deep.txt"), "d")
	expect("sub/deep.txt", fspb.EventType_EVENT_TYPE_CREATE)
	// A directory created after the watch started is watched too.
	if err := os.Mkdir(filepath.Join(dir, "later"), 0o755); err != nil {
		t.Fatal(err)
	}
	expect("later", fspb.EventType_EVENT_TYPE_CREATE)
	time.Sleep(100 * time.Millisecond)
	writeFileT(t, filepath.Join(dir, "later", "x"), "d")
	expect("later/x", fspb.EventType_EVENT_TYPE_CREATE)
	if err := os.Chmod(f, 0o600); err != nil {
		t.Fatal(err)
	}
	expect("new.txt", fspb.EventType_EVENT_TYPE_CHMOD)
	if err := os.Rename(f, filepath.Join(dir, "renamed.txt")); err != nil {
		t.Fatal(err)
	}
	expect("new.txt", fspb.EventType_EVENT_TYPE_RENAME)
	if err := os.Remove(filepath.Join(dir, "renamed.txt")); err != nil {
		t.Fatal(err)
	}
	expect("renamed.txt", fspb.EventType_EVENT_TYPE_REMOVE)
	select {
	case en := <-entries:
		if en.GetPath() == "" || en.GetOwner() == "" {
			t.Fatalf("bad entry %+v", en)
		}
	default:
		t.Fatal("include_entry gave no entries")
	}
}

func TestWatchMissingDirNotFound(t *testing.T) {
	e := newTestEnv(t, testToken)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, err := e.fs.WatchDir(ctx, connect.NewRequest(&fspb.WatchDirRequest{Path: "/nonexistent/dir"}))
	if err == nil {
		for s.Receive() {
		}
		err = s.Err()
		s.Close()
	}
	if codeOf(err) != connect.CodeNotFound {
		t.Fatalf("watch missing: %v", err)
	}
}

func TestPolledWatcher(t *testing.T) {
	e := newTestEnv(t, testToken)
	ctx := context.Background()
	cw, err := e.fs.CreateWatcher(ctx, connect.NewRequest(&fspb.CreateWatcherRequest{Path: e.userHome}))
	if err != nil {
		t.Fatal(err)
	}
	id := cw.Msg.GetWatcherId()
	writeFileT(t, filepath.Join(e.userHome, "p.txt"), "x")
	var got []*fspb.FilesystemEvent
	waitFor(t, 5*time.Second, "polled create event", func() bool {
		r, err := e.fs.GetWatcherEvents(ctx, connect.NewRequest(&fspb.GetWatcherEventsRequest{WatcherId: id}))
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, r.Msg.GetEvents()...)
		return slices.ContainsFunc(got, func(ev *fspb.FilesystemEvent) bool {
			return ev.GetName() == "p.txt" && ev.GetType() == fspb.EventType_EVENT_TYPE_CREATE
		})
	})
	if _, err := e.fs.RemoveWatcher(ctx, connect.NewRequest(&fspb.RemoveWatcherRequest{WatcherId: id})); err != nil {
		t.Fatal(err)
	}
	if _, err := e.fs.GetWatcherEvents(ctx, connect.NewRequest(&fspb.GetWatcherEventsRequest{WatcherId: id})); codeOf(err) != connect.CodeNotFound {
		t.Fatalf("events after remove: %v", err)
	}
}

// An upload is seen by a watcher as envd's is: create, chmod, write for a
// new file; chmod, then write, for one rewritten (the SDKs' watch tests
// count them). The rewrite still truncates.
func TestUploadWatchEvents(t *testing.T) {
	e := newTestEnv(t, testToken)
	ctx := context.Background()
	u, err := e.a.lookupUser("user")
	if err != nil {
		t.Fatal(err)
	}
	cw, err := e.fs.CreateWatcher(ctx, connect.NewRequest(&fspb.CreateWatcherRequest{Path: e.userHome}))
	if err != nil {
		t.Fatal(err)
	}
	id := cw.Msg.GetWatcherId()
	events := func(n int) []fspb.EventType {
		var got []fspb.EventType
		waitFor(t, 5*time.Second, fmt.Sprintf("%d events", n), func() bool {
			r, err := e.fs.GetWatcherEvents(ctx, connect.NewRequest(&fspb.GetWatcherEventsRequest{WatcherId: id}))
			if err != nil {
				t.Fatal(err)
			}
			for _, ev := range r.Msg.GetEvents() {
				if ev.GetName() == "up.txt" {
					got = append(got, ev.GetType())
				}
			}
			return len(got) >= n
		})
		return got
	}
	path := filepath.Join(e.userHome, "up.txt")
	if err := writeFile(u, path, strings.NewReader("a longer first version"), nil); err != nil {
		t.Fatal(err)
	}
	if got := events(3); !slices.Equal(got, []fspb.EventType{fspb.EventType_EVENT_TYPE_CREATE, fspb.EventType_EVENT_TYPE_CHMOD, fspb.EventType_EVENT_TYPE_WRITE}) {
		t.Fatalf("new file: %v", got)
	}
	if err := writeFile(u, path, strings.NewReader("second"), nil); err != nil {
		t.Fatal(err)
	}
	if got := events(2); got[0] != fspb.EventType_EVENT_TYPE_CHMOD || !slices.Contains(got[1:], fspb.EventType_EVENT_TYPE_WRITE) || slices.Contains(got, fspb.EventType_EVENT_TYPE_CREATE) {
		t.Fatalf("rewrite: %v", got)
	}
	if b, err := os.ReadFile(path); err != nil || string(b) != "second" {
		t.Fatalf("rewritten content %q %v", b, err)
	}
	if fi, err := os.Stat(path); err != nil || fi.Sys().(*syscall.Stat_t).Uid != 1000 {
		t.Fatalf("owner: %v", err)
	}
}

// statEntry is a Stat answer's entry, nil when there is no answer.
func statEntry(r *connect.Response[fspb.StatResponse]) *fspb.EntryInfo {
	if r == nil {
		return nil
	}
	return r.Msg.GetEntry()
}
