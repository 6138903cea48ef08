package snapstore

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"

	"github.com/cubicle-dev/cubicle/internal/testenv"
	"github.com/cubicle-dev/cubicle/internal/volume/s3/s3test"
)

func newStore(t *testing.T) (*Store, *s3test.Server) {
	t.Helper()
	gw := s3test.Start(t)
	cfg, err := Parse("s3://" + gw.Bucket + "?endpoint=" + url.QueryEscape(gw.Endpoint) + "&region=" + gw.Region + "&prefix=snaps/&pathStyle=true")
	if err != nil {
		t.Fatal(err)
	}
	cfg.AccessKey, cfg.SecretKey = gw.AccessKey, gw.SecretKey
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s, gw
}

// snapshotDir makes what a node's snapshot dir holds: a layer with files,
// a hard link, a symlink out of the tree, a whiteout, an opaque dir, a
// set-UID file owned by another user, and a checkpoint.
func snapshotDir(t *testing.T, parent, id string) string {
	t.Helper()
	dir := filepath.Join(parent, id)
	rootfs := filepath.Join(dir, PartRootfs)
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(rootfs, "home/user/deep"), 0o755))
	must(os.WriteFile(filepath.Join(rootfs, "home/user/deep/data.txt"), []byte("hello from node a\n"), 0o640))
	must(unix.Setxattr(filepath.Join(rootfs, "home/user/deep/data.txt"), "user.note", []byte("kept"), 0))
	must(os.Link(filepath.Join(rootfs, "home/user/deep/data.txt"), filepath.Join(rootfs, "home/user/hard")))
	must(os.Symlink("/etc/shadow", filepath.Join(rootfs, "home/user/escape")))
	must(unix.Mknod(filepath.Join(rootfs, "home/removed"), unix.S_IFCHR, 0))
	must(os.Mkdir(filepath.Join(rootfs, "opaque"), 0o755))
	must(unix.Setxattr(filepath.Join(rootfs, "opaque"), "trusted.overlay.opaque", []byte("y"), 0))
	must(os.WriteFile(filepath.Join(rootfs, "suid"), bytes.Repeat([]byte{7}, 1<<20), 0o755))
	must(os.Chown(filepath.Join(rootfs, "suid"), 1000, 1000))
	must(os.Chmod(filepath.Join(rootfs, "suid"), 0o755|os.ModeSetuid))
	must(os.MkdirAll(filepath.Join(dir, PartCheckpoint), 0o755))
	must(os.WriteFile(filepath.Join(dir, PartCheckpoint, "checkpoint.img"), []byte("memory"), 0o600))
	return dir
}

// A snapshot dir pushed through presigned PUT URLs and fetched through
// presigned GET URLs into another node's snapshot dir is the same tree:
// contents, hard links, symlinks (not followed), whiteouts, opaque dirs,
// owners and set-ID bits.
func TestPushFetchRoundTrip(t *testing.T) {
	testenv.RequireRoot(t, "owners, whiteouts and trusted.* xattrs")
	ctx := context.Background()
	s, gw := newStore(t)
	nodeA, nodeB := t.TempDir(), t.TempDir()
	src := snapshotDir(t, nodeA, "snap_rt")
	puts, err := s.PutURLs(ctx, "snap_rt", PartRootfs, PartCheckpoint)
	if err != nil {
		t.Fatal(err)
	}
	pushed, err := Push(ctx, http.DefaultClient, src, puts)
	if err != nil {
		t.Fatal(err)
	}
	if len(pushed) != 2 || !digestRe.MatchString(pushed[0].Digest) || pushed[0].URL != "" {
		t.Fatalf("pushed: %+v", pushed)
	}
	if keys := gw.Keys(t, "snaps/snap_rt/"); len(keys) != 2 {
		t.Fatalf("objects: %v", keys)
	}
	gets, err := s.GetURLs(ctx, "snap_rt", pushed)
	if err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(nodeB, "snap_rt")
	if err := Fetch(ctx, http.DefaultClient, dst, gets); err != nil {
		t.Fatal(err)
	}
	rootfs := filepath.Join(dst, PartRootfs)
	if b, err := os.ReadFile(filepath.Join(rootfs, "home/user/deep/data.txt")); err != nil || string(b) != "hello from node a\n" {
		t.Fatalf("file: %q %v", b, err)
	}
	v := make([]byte, 8)
	a, _ := os.Stat(filepath.Join(rootfs, "home/user/deep/data.txt"))
	h, _ := os.Stat(filepath.Join(rootfs, "home/user/hard"))
	if !os.SameFile(a, h) || a.Mode().Perm() != 0o640 {
		t.Fatalf("hard link or mode lost: %v %v", a.Mode(), h)
	}
	if n, err := unix.Getxattr(filepath.Join(rootfs, "home/user/deep/data.txt"), "user.note", v); err != nil || string(v[:n]) != "kept" {
		t.Fatalf("user xattr: %q %v", v[:n], err)
	}
	if l, err := os.Readlink(filepath.Join(rootfs, "home/user/escape")); err != nil || l != "/etc/shadow" {
		t.Fatalf("symlink: %q %v", l, err)
	}
	if fi, err := os.Lstat(filepath.Join(rootfs, "home/removed")); err != nil || fi.Mode()&os.ModeCharDevice == 0 || fi.Sys().(*syscall.Stat_t).Rdev != 0 {
		t.Fatalf("whiteout: %v %v", fi, err)
	}
	if n, err := unix.Getxattr(filepath.Join(rootfs, "opaque"), "trusted.overlay.opaque", v); err != nil || string(v[:n]) != "y" {
		t.Fatalf("opaque: %q %v", v[:n], err)
	}
	fi, err := os.Stat(filepath.Join(rootfs, "suid"))
	if err != nil || fi.Mode()&os.ModeSetuid == 0 || fi.Sys().(*syscall.Stat_t).Uid != 1000 || fi.Size() != 1<<20 {
		t.Fatalf("set-UID file: %v %v", fi, err)
	}
	if b, err := os.ReadFile(filepath.Join(dst, PartCheckpoint, "checkpoint.img")); err != nil || string(b) != "memory" {
		t.Fatalf("checkpoint: %q %v", b, err)
	}
	// Fetching over an existing snapshot dir is refused; nothing staged stays.
	if err := Fetch(ctx, http.DefaultClient, dst, gets); !errors.Is(err, os.ErrExist) {
		t.Fatalf("fetch over an existing dir: %v", err)
	}
	if err := s.Delete(ctx, "snap_rt"); err != nil {
		t.Fatal(err)
	}
	if keys := gw.Keys(t, "snaps/snap_rt/"); len(keys) != 0 {
		t.Fatalf("objects after delete: %v", keys)
	}
	if err := s.Delete(ctx, "snap_rt"); err != nil {
		t.Fatalf("second delete: %v", err)
	}
	if left, _ := filepath.Glob(filepath.Join(nodeB, ".fetch-*")); len(left) != 0 {
		t.Fatalf("staging left: %v", left)
	}
}

// An object whose bytes are not the recorded digest (replaced in the
// bucket, or the digest wrong) is refused, and nothing is unpacked.
func TestFetchRefusesDigestMismatch(t *testing.T) {
	testenv.RequireRoot(t, "owners and whiteouts")
	ctx := context.Background()
	s, gw := newStore(t)
	src := snapshotDir(t, t.TempDir(), "snap_dm")
	puts, err := s.PutURLs(ctx, "snap_dm", PartRootfs)
	if err != nil {
		t.Fatal(err)
	}
	pushed, err := Push(ctx, http.DefaultClient, src, puts)
	if err != nil {
		t.Fatal(err)
	}
	nodeB := t.TempDir()
	for name, tamper := range map[string]func(o *Object){
		"digest": func(o *Object) { o.Digest = "sha256:" + strings.Repeat("0", 64) },
		"size":   func(o *Object) { o.Size-- },
	} {
		o := pushed[0]
		tamper(&o)
		gets, err := s.GetURLs(ctx, "snap_dm", []Object{o})
		if err != nil {
			t.Fatal(err)
		}
		if err := Fetch(ctx, http.DefaultClient, filepath.Join(nodeB, "snap_dm"), gets); !errors.Is(err, ErrDigestMismatch) {
			t.Fatalf("%s: %v, want ErrDigestMismatch", name, err)
		}
	}
	// The object replaced in the bucket behind the control plane's back.
	c, err := gw.Client()
	if err != nil {
		t.Fatal(err)
	}
	var evil bytes.Buffer
	tw := tar.NewWriter(&evil)
	tw.WriteHeader(&tar.Header{Name: "x", Mode: 0o644, Size: 1, Typeflag: tar.TypeReg})
	tw.Write([]byte("x"))
	tw.Close()
	if _, err := c.PutObject(ctx, gw.Bucket, s.Key("snap_dm", PartRootfs), bytes.NewReader(evil.Bytes()), int64(evil.Len()), putOpts()); err != nil {
		t.Fatal(err)
	}
	gets, err := s.GetURLs(ctx, "snap_dm", pushed)
	if err != nil {
		t.Fatal(err)
	}
	if err := Fetch(ctx, http.DefaultClient, filepath.Join(nodeB, "snap_dm"), gets); !errors.Is(err, ErrDigestMismatch) {
		t.Fatalf("replaced object: %v, want ErrDigestMismatch", err)
	}
	if left, _ := os.ReadDir(nodeB); len(left) != 0 {
		t.Fatalf("a refused fetch left %v", left)
	}
}

// A presigned URL reaches only its own object with its own method: the
// same signature on another snapshot's key, or a PUT URL used to read, is
// refused by the S3 server.
func TestPresignedURLReachesOnlyItsObject(t *testing.T) {
	ctx := context.Background()
	s, gw := newStore(t)
	c, err := gw.Client()
	if err != nil {
		t.Fatal(err)
	}
	secret := []byte("another team's snapshot")
	if _, err := c.PutObject(ctx, gw.Bucket, s.Key("snap_other", PartRootfs), bytes.NewReader(secret), int64(len(secret)), putOpts()); err != nil {
		t.Fatal(err)
	}
	mine := []byte("mine")
	if _, err := c.PutObject(ctx, gw.Bucket, s.Key("snap_mine", PartRootfs), bytes.NewReader(mine), int64(len(mine)), putOpts()); err != nil {
		t.Fatal(err)
	}
	gets, err := s.GetURLs(ctx, "snap_mine", []Object{{Part: PartRootfs, Digest: "sha256:" + strings.Repeat("a", 64), Size: 4}})
	if err != nil {
		t.Fatal(err)
	}
	status := func(method, u string, body io.Reader) (int, string) {
		t.Helper()
		req, _ := http.NewRequestWithContext(ctx, method, u, body)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := status(http.MethodGet, gets[0].URL, nil); code != http.StatusOK || body != "mine" {
		t.Fatalf("own object: %d %q", code, body)
	}
	other := strings.Replace(gets[0].URL, "snap_mine", "snap_other", 1)
	if code, body := status(http.MethodGet, other, nil); code != http.StatusForbidden || strings.Contains(body, string(secret)) {
		t.Fatalf("GET URL moved to another key: %d %q", code, body)
	}
	puts, err := s.PutURLs(ctx, "snap_mine", PartRootfs)
	if err != nil {
		t.Fatal(err)
	}
	if code, body := status(http.MethodGet, puts[0].URL, nil); code != http.StatusForbidden || body == "mine" {
		t.Fatalf("PUT URL used to read: %d %q", code, body)
	}
	otherPut := strings.Replace(puts[0].URL, "snap_mine", "snap_other", 1)
	if code, _ := status(http.MethodPut, otherPut, strings.NewReader("overwritten")); code != http.StatusForbidden {
		t.Fatalf("PUT URL moved to another key: %d", code)
	}
	if code, _ := status(http.MethodGet, gets[0].URL, nil); code != http.StatusOK {
		t.Fatal("own object gone")
	}
}

func putOpts() minio.PutObjectOptions { return minio.PutObjectOptions{} }

// The bucket as plain objects (what --image-store uses): put, stat, get,
// remove, under the configured prefix; a missing key is ErrObjectNotFound.
func TestObjects(t *testing.T) {
	s, gw := newStore(t)
	ctx := context.Background()
	if ok, err := s.HasObject(ctx, "blobs/a"); err != nil || ok {
		t.Fatalf("HasObject before put: %v %v", ok, err)
	}
	if _, err := s.GetObject(ctx, "blobs/a"); !errors.Is(err, ErrObjectNotFound) {
		t.Fatalf("GetObject before put: %v", err)
	}
	if err := s.PutObject(ctx, "blobs/a", strings.NewReader("hello"), 5); err != nil {
		t.Fatal(err)
	}
	if ok, err := s.HasObject(ctx, "blobs/a"); err != nil || !ok {
		t.Fatalf("HasObject after put: %v %v", ok, err)
	}
	rc, err := s.GetObject(ctx, "blobs/a")
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(rc)
	rc.Close()
	if err != nil || string(b) != "hello" {
		t.Fatalf("GetObject: %q %v", b, err)
	}
	// The key is under the prefix, in the bucket the URL names.
	mc, err := minio.New(strings.TrimPrefix(gw.Endpoint, "http://"), &minio.Options{Creds: credentials.NewStaticV4(gw.AccessKey, gw.SecretKey, ""), Region: gw.Region, BucketLookup: minio.BucketLookupPath})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := mc.StatObject(ctx, gw.Bucket, "snaps/blobs/a", minio.StatObjectOptions{}); err != nil {
		t.Fatalf("object not under the prefix: %v", err)
	}
	if err := s.RemoveObject(ctx, "blobs/a"); err != nil {
		t.Fatal(err)
	}
	if err := s.RemoveObject(ctx, "blobs/a"); err != nil {
		t.Fatalf("removing a missing object: %v", err)
	}
	if _, err := s.GetObject(ctx, "blobs/a"); !errors.Is(err, ErrObjectNotFound) {
		t.Fatalf("GetObject after remove: %v", err)
	}
}
