package agent

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"connectrpc.com/connect"
	"golang.org/x/sys/unix"

	fspb "github.com/cubicle-dev/cubicle/sdk/go/envd/filesystem"
)

// ownerOf returns path's uid:gid (not following a final symlink).
func ownerOf(t *testing.T, path string) string {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		t.Fatalf("stat %s: %v", path, err)
	}
	return fmt.Sprintf("%d:%d", st.Uid, st.Gid)
}

func (e *testEnv) upload(t *testing.T, path, content string) (int, string) {
	t.Helper()
	hdr := e.tok()
	hdr["Content-Type"] = "application/octet-stream"
	resp, b := e.do(t, "POST", "/files?path="+url.QueryEscape(path), strings.NewReader(content), hdr)
	return resp.StatusCode, string(b)
}

// rootDir makes a root-owned 0755 directory under the test root: like /, the
// user may search it but not create entries in it.
func (e *testEnv) rootDir(t *testing.T, parts ...string) string {
	t.Helper()
	d := filepath.Join(append([]string{e.root}, parts...)...)
	if err := os.MkdirAll(d, 0o755); err != nil {
		t.Fatal(err)
	}
	return d
}

// envd creates missing parents as root and hands them to the user, so a user
// may write /0/a.txt; existing directories keep their owner.
func TestUploadCreatesParentsTheUserCannot(t *testing.T) {
	e := newTestEnv(t, testToken)
	top := e.rootDir(t, "top")   // stands in for /
	e.rootDir(t, "top", "exist") // a root-owned directory on the way

	p := filepath.Join(top, "0", "a.txt")
	if st, b := e.upload(t, p, "zero"); st != 200 {
		t.Fatalf("octet-stream into a new dir under a root dir: %d %s", st, b)
	}
	if got, err := os.ReadFile(p); err != nil || string(got) != "zero" {
		t.Fatalf("content %q %v", got, err)
	}
	if o := ownerOf(t, filepath.Join(top, "0")); o != "1000:1000" {
		t.Fatalf("new dir owner %s", o)
	}
	if o := ownerOf(t, p); o != "1000:1000" {
		t.Fatalf("file owner %s", o)
	}
	if o := ownerOf(t, top); o != "0:0" {
		t.Fatalf("existing parent changed owner: %s", o)
	}

	// Multipart, through an existing root-owned directory, several levels deep.
	deep := filepath.Join(top, "exist", "new", "deeper", "b.txt")
	ct, body := multipartBody(t, map[string]string{deep: "deep"}, []string{deep})
	hdr := e.tok()
	hdr["Content-Type"] = ct
	resp, b := e.do(t, "POST", "/files", body, hdr)
	if resp.StatusCode != 200 {
		t.Fatalf("multipart: %d %s", resp.StatusCode, b)
	}
	for path, want := range map[string]string{
		filepath.Join(top, "exist"):                  "0:0",
		filepath.Join(top, "exist", "new"):           "1000:1000",
		filepath.Join(top, "exist", "new", "deeper"): "1000:1000",
		deep: "1000:1000",
	} {
		if o := ownerOf(t, path); o != want {
			t.Fatalf("%s owner %s want %s", path, o, want)
		}
	}

	// Parallel uploads into one new tree (the SDKs write concurrently) all
	// succeed: none sees a directory before it is the user's.
	var wg sync.WaitGroup
	errs := make(chan string, 8)
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if st, b := e.upload(t, filepath.Join(top, "par", "x", fmt.Sprintf("%d.txt", i)), "p"); st != 200 {
				errs <- fmt.Sprintf("parallel upload %d: %d %s", i, st, b)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for msg := range errs {
		t.Error(msg)
	}
}

// envd writes as root, so a user may add a file to a directory that exists
// and that it may search but not write (one made by root through the API,
// say). The agent does too, but never takes over a file that exists, never
// follows a link there, and never fills a directory the user could change.
func TestUploadNewFileIntoRootsDirectory(t *testing.T) {
	e := newTestEnv(t, testToken)
	d := e.rootDir(t, "made-by-root")
	p := filepath.Join(d, "x.txt")
	if st, b := e.upload(t, p, "by user"); st != 200 {
		t.Fatalf("new file in a root directory: %d %s", st, b)
	}
	if got, err := os.ReadFile(p); err != nil || string(got) != "by user" || ownerOf(t, p) != "1000:1000" || ownerOf(t, d) != "0:0" {
		t.Fatalf("content %q %v, owner %s, dir %s", got, err, ownerOf(t, p), ownerOf(t, d))
	}
	// Now the user's: rewriting it is an ordinary write.
	if st, b := e.upload(t, p, "again"); st != 200 {
		t.Fatalf("rewrite of the user's file: %d %s", st, b)
	}

	// A file root owns there stays root's, unchanged.
	rootFile := filepath.Join(d, "root.txt")
	writeFileT(t, rootFile, "root's")
	if st, b := e.upload(t, rootFile, "taken"); st != 403 {
		t.Fatalf("root's file: %d %s", st, b)
	}
	if got, _ := os.ReadFile(rootFile); string(got) != "root's" || ownerOf(t, rootFile) != "0:0" {
		t.Fatalf("root's file changed: %q %s", got, ownerOf(t, rootFile))
	}
	// A link there (root's: the user cannot make one) is not followed.
	target := filepath.Join(e.root, "link-target")
	if err := os.Symlink(target, filepath.Join(d, "link")); err != nil {
		t.Fatal(err)
	}
	if st, _ := e.upload(t, filepath.Join(d, "link"), "x"); st == 200 {
		t.Fatal("upload through a link in root's directory succeeded")
	}
	if _, err := os.Lstat(target); !os.IsNotExist(err) {
		t.Fatalf("the link's target was created: %v", err)
	}
	// Not through a symlink to such a directory, though the user could
	// follow it: another user's link must not steer root's file.
	if err := os.Symlink(d, filepath.Join(e.userHome, "to-root-dir")); err != nil {
		t.Fatal(err)
	}
	if st, _ := e.upload(t, filepath.Join(e.userHome, "to-root-dir", "via-link.txt"), "x"); st != 403 {
		t.Fatalf("through a symlink to a root directory: %d", st)
	}
	if _, err := os.Lstat(filepath.Join(d, "via-link.txt")); !os.IsNotExist(err) {
		t.Fatalf("root made a file through a symlink: %v", err)
	}
	// Not into a directory the user may not search (root's 0700 home).
	if st, _ := e.upload(t, filepath.Join(e.root, "root", "planted.txt"), "x"); st != 403 {
		t.Fatalf("into a directory the user may not search: %d", st)
	}
	// Not into one the user owns but made read-only: it may chmod it back.
	ro := filepath.Join(e.userHome, "ro-own")
	if err := os.Mkdir(ro, 0o555); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(ro, 1000, 1000); err != nil {
		t.Fatal(err)
	}
	if st, _ := e.upload(t, filepath.Join(ro, "x.txt"), "x"); st != 403 {
		t.Fatalf("into a user-owned read-only dir: %d", st)
	}
	if _, err := os.Lstat(filepath.Join(ro, "x.txt")); !os.IsNotExist(err) {
		t.Fatalf("root made a file in a user-owned dir: %v", err)
	}
}

// The root path must not widen what the user reaches: symlinks are followed
// with the user's rights, and a directory the user could tamper with is not
// filled by root.
func TestUploadParentsRootPathRefusals(t *testing.T) {
	e := newTestEnv(t, testToken)
	secretHome := filepath.Join(e.root, "root") // root's 0700 home
	top := e.rootDir(t, "top")

	// A user's symlink to a directory it may not search.
	if err := os.Symlink(secretHome, filepath.Join(e.userHome, "esc")); err != nil {
		t.Fatal(err)
	}
	if st, b := e.upload(t, "esc/new/x.txt", "x"); st != 403 {
		t.Fatalf("through a symlink into root's home: %d %s", st, b)
	}
	// Nor under a root directory the user may not search, named directly.
	if st, b := e.upload(t, filepath.Join(secretHome, "new2", "x.txt"), "x"); st != 403 {
		t.Fatalf("into root's home: %d %s", st, b)
	}
	for _, n := range []string{"new", "new2"} {
		if _, err := os.Lstat(filepath.Join(secretHome, n)); !os.IsNotExist(err) {
			t.Fatalf("root made %s in a directory the user cannot search: %v", n, err)
		}
	}

	// A dangling symlink planted on the way is never followed to make its target.
	target := filepath.Join(top, "target")
	if err := os.Symlink(target, filepath.Join(top, "dangle")); err != nil {
		t.Fatal(err)
	}
	if st, _ := e.upload(t, filepath.Join(top, "dangle", "x.txt"), "x"); st == 200 {
		t.Fatal("upload through a dangling symlink succeeded")
	}
	if _, err := os.Lstat(target); !os.IsNotExist(err) {
		t.Fatalf("dangling symlink's target was created: %v", err)
	}

	// A directory the user owns but made read-only: the user could swap what
	// root makes there, so root does not make it (the user may chmod it).
	ro := filepath.Join(e.userHome, "ro")
	if err := os.Mkdir(ro, 0o555); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(ro, 1000, 1000); err != nil {
		t.Fatal(err)
	}
	if st, b := e.upload(t, "ro/sub/x.txt", "x"); st != 403 {
		t.Fatalf("into a user-owned read-only dir: %d %s", st, b)
	}
	if _, err := os.Lstat(filepath.Join(ro, "sub")); !os.IsNotExist(err) {
		t.Fatalf("root made a dir in a user-owned dir: %v", err)
	}
}

// MakeDir and Move make missing parents the same way (envd's EnsureDirs).
func TestMakeDirMoveCreateParentsTheUserCannot(t *testing.T) {
	e := newTestEnv(t, testToken)
	ctx := context.Background()
	top := e.rootDir(t, "top")
	mk, err := e.fs.MakeDir(ctx, connect.NewRequest(&fspb.MakeDirRequest{Path: filepath.Join(top, "m", "n")}))
	if err != nil || mk.Msg.GetEntry().GetOwner() != "user" {
		t.Fatalf("makedir under a root dir: %+v %v", mk, err)
	}
	if o := ownerOf(t, filepath.Join(top, "m")); o != "1000:1000" {
		t.Fatalf("makedir parent owner %s", o)
	}
	src := filepath.Join(e.userHome, "f.txt")
	writeFileT(t, src, "f")
	if err := os.Chown(src, 1000, 1000); err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(top, "mv", "f.txt")
	if _, err := e.fs.Move(ctx, connect.NewRequest(&fspb.MoveRequest{Source: src, Destination: dst})); err != nil {
		t.Fatalf("move under a root dir: %v", err)
	}
	if got, err := os.ReadFile(dst); err != nil || string(got) != "f" || ownerOf(t, filepath.Join(top, "mv")) != "1000:1000" {
		t.Fatalf("moved %q %v", got, err)
	}
	// A missing source makes nothing.
	if _, err := e.fs.Move(ctx, connect.NewRequest(&fspb.MoveRequest{Source: src, Destination: filepath.Join(top, "mv2", "g")})); codeOf(err) != connect.CodeNotFound {
		t.Fatalf("move of a missing source: %v", err)
	}
	if _, err := os.Lstat(filepath.Join(top, "mv2")); !os.IsNotExist(err) {
		t.Fatalf("move of a missing source made its destination's parent: %v", err)
	}
}
