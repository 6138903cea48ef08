package image

import (
	"archive/tar"
	"bytes"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/cubicle-dev/cubicle/internal/testenv"
)

// makeTree builds a tiny rootfs: dirs, a file, a symlink, a hard link.
func makeTree(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	must(t, os.MkdirAll(filepath.Join(dir, "bin"), 0o755))
	must(t, os.MkdirAll(filepath.Join(dir, "etc"), 0o755))
	must(t, os.WriteFile(filepath.Join(dir, "etc", "hostname"), []byte("cubicle\n"), 0o644))
	must(t, os.WriteFile(filepath.Join(dir, "bin", "tool"), []byte("#!/bin/sh\necho hi\n"), 0o4755))
	must(t, os.Chmod(filepath.Join(dir, "bin", "tool"), 0o4755|os.ModeSetuid))
	must(t, os.Link(filepath.Join(dir, "bin", "tool"), filepath.Join(dir, "bin", "tool2")))
	must(t, os.Symlink("tool", filepath.Join(dir, "bin", "sh")))
	if os.Geteuid() == 0 {
		must(t, os.Lchown(filepath.Join(dir, "etc", "hostname"), 1000, 1001))
	}
	return dir
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func serve(t *testing.T, h http.Handler) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	must(t, err)
	srv := &http.Server{Handler: h}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return ln.Addr().String()
}

func TestNormalizeRef(t *testing.T) {
	for in, want := range map[string]string{
		"cubicle/base:latest":                  "cubicle/base:latest",
		"cubicle/base":                         "cubicle/base:latest",
		"127.0.0.1:5000/cubicle/tpl_abc:bld_1": "cubicle/tpl_abc:bld_1",
		"localhost/x:y":                        "x:y",
		"registry.example.com/a/b/c:v1.2":      "a/b/c:v1.2",
	} {
		got, err := NormalizeRef(in)
		if err != nil || got != want {
			t.Errorf("NormalizeRef(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "UPPER/x", "a/b@sha256:00", "x:", "x:-bad"} {
		if _, err := NormalizeRef(bad); !errors.Is(err, ErrInvalidRef) {
			t.Errorf("NormalizeRef(%q) err = %v, want ErrInvalidRef", bad, err)
		}
	}
}

func TestImportPushPullRestartUnpack(t *testing.T) {
	storeDir := t.TempDir()
	s, err := Open(storeDir)
	must(t, err)
	tree := makeTree(t)
	must(t, s.ImportRootfs("cubicle/base:latest", tree))

	// The directory is a valid OCI layout that go-containerregistry can read.
	lp, err := layout.FromPath(storeDir)
	must(t, err)
	if _, err := lp.ImageIndex(); err != nil {
		t.Fatal(err)
	}

	addr := serve(t, NewRegistry(s))
	// Pull what was imported.
	ref, err := name.ParseReference(addr+"/cubicle/base:latest", name.Insecure)
	must(t, err)
	pulled, err := remote.Image(ref)
	must(t, err)
	local, err := s.Get("cubicle/base:latest")
	must(t, err)
	d1, _ := pulled.Digest()
	d2, _ := local.Digest()
	if d1 != d2 {
		t.Fatalf("pulled %s, stored %s", d1, d2)
	}

	// Push a derived image with a second layer.
	layer2 := layerFromEntries(t, []tarEntry{{name: "etc/extra", body: "x"}})
	img2, err := mutate.AppendLayers(pulled, layer2)
	must(t, err)
	pushRef, err := name.ParseReference(addr+"/cubicle/tpl_a:bld_1", name.Insecure)
	must(t, err)
	must(t, remote.Write(pushRef, img2))
	want, _ := img2.Digest()

	tags, err := remote.List(pushRef.Context())
	must(t, err)
	if len(tags) != 1 || tags[0] != "bld_1" {
		t.Fatalf("tags = %v", tags)
	}

	// Restart: a new Store and Registry over the same directory.
	s2, err := Open(storeDir)
	must(t, err)
	addr2 := serve(t, NewRegistry(s2))
	ref2, _ := name.ParseReference(addr2+"/cubicle/tpl_a:bld_1", name.Insecure)
	again, err := remote.Image(ref2)
	must(t, err)
	if got, _ := again.Digest(); got != want {
		t.Fatalf("after restart digest %s, want %s", got, want)
	}
	// Blobs stream intact (digest verified by the client while reading).
	ls, err := again.Layers()
	must(t, err)
	for _, l := range ls {
		rc, err := l.Compressed()
		must(t, err)
		_, err = io.Copy(io.Discard, rc)
		must(t, err)
		rc.Close()
	}
	ents, err := s2.List()
	must(t, err)
	if len(ents) != 2 || ents[0].Ref != "cubicle/base:latest" || ents[1].Ref != "cubicle/tpl_a:bld_1" {
		t.Fatalf("List = %+v", ents)
	}

	// Unpack keeps modes, owners, symlinks and hard links.
	dest := filepath.Join(t.TempDir(), "rootfs")
	must(t, s2.Unpack(addr2+"/cubicle/tpl_a:bld_1", dest))
	if b, err := os.ReadFile(filepath.Join(dest, "etc/extra")); err != nil || string(b) != "x" {
		t.Fatalf("etc/extra = %q, %v", b, err)
	}
	fi, err := os.Stat(filepath.Join(dest, "bin/tool"))
	must(t, err)
	if fi.Mode()&os.ModeSetuid == 0 || fi.Mode().Perm() != 0o755 {
		t.Errorf("bin/tool mode = %v", fi.Mode())
	}
	fi2, err := os.Stat(filepath.Join(dest, "bin/tool2"))
	must(t, err)
	if fi.Sys().(*syscall.Stat_t).Ino != fi2.Sys().(*syscall.Stat_t).Ino {
		t.Error("hard link lost")
	}
	if l, err := os.Readlink(filepath.Join(dest, "bin/sh")); err != nil || l != "tool" {
		t.Errorf("symlink = %q, %v", l, err)
	}
	if os.Geteuid() == 0 {
		st, _ := os.Lstat(filepath.Join(dest, "etc/hostname"))
		if sys := st.Sys().(*syscall.Stat_t); sys.Uid != 1000 || sys.Gid != 1001 {
			t.Errorf("owner = %d:%d", sys.Uid, sys.Gid)
		}
	}
	if _, err := os.Stat(dest + ".tmp"); !os.IsNotExist(err) {
		t.Errorf("tmp dir left: %v", err)
	}

	// Unpacking again over an existing dest swaps it atomically.
	must(t, os.WriteFile(filepath.Join(dest, "stale"), nil, 0o644))
	must(t, s2.Unpack("cubicle/base:latest", dest))
	if _, err := os.Stat(filepath.Join(dest, "stale")); !os.IsNotExist(err) {
		t.Error("old tree not replaced")
	}
	if _, err := os.Stat(filepath.Join(dest, "etc/extra")); !os.IsNotExist(err) {
		t.Error("base image has etc/extra")
	}

	// Delete and GC.
	must(t, s2.Delete("cubicle/tpl_a:bld_1"))
	if _, err := s2.Get("cubicle/tpl_a:bld_1"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Get after Delete: %v", err)
	}
	if err := s2.Delete("cubicle/tpl_a:bld_1"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("second Delete: %v", err)
	}
	if _, err := remote.Image(ref2); err == nil {
		t.Fatal("deleted image still pullable")
	}
	if _, err := s2.Get("cubicle/base:latest"); err != nil {
		t.Fatal(err)
	}
}

type tarEntry struct {
	name, body, link string
	typ              byte
	mode             int64
}

func layerFromEntries(t *testing.T, ents []tarEntry) v1.Layer {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range ents {
		h := &tar.Header{Name: e.name, Typeflag: e.typ, Linkname: e.link, Mode: e.mode}
		if h.Typeflag == 0 {
			h.Typeflag = tar.TypeReg
		}
		if h.Mode == 0 {
			h.Mode = 0o644
			if h.Typeflag == tar.TypeDir {
				h.Mode = 0o755
			}
		}
		if h.Typeflag == tar.TypeReg {
			h.Size = int64(len(e.body))
		}
		must(t, tw.WriteHeader(h))
		if h.Typeflag == tar.TypeReg {
			tw.Write([]byte(e.body))
		}
	}
	must(t, tw.Close())
	b := buf.Bytes()
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil })
	must(t, err)
	return l
}

func TestUnpackWhiteouts(t *testing.T) {
	s, err := Open(t.TempDir())
	must(t, err)
	l1 := layerFromEntries(t, []tarEntry{
		{name: "etc/", typ: tar.TypeDir},
		{name: "etc/keep", body: "k"},
		{name: "etc/gone", body: "g"},
		{name: "opq/", typ: tar.TypeDir},
		{name: "opq/old1", body: "1"},
		{name: "opq/sub/", typ: tar.TypeDir},
		{name: "opq/sub/old2", body: "2"},
		{name: "usr/lib/", typ: tar.TypeDir},
		{name: "lib", typ: tar.TypeSymlink, link: "usr/lib"},
	})
	l2 := layerFromEntries(t, []tarEntry{
		{name: "etc/.wh.gone"},
		// New content listed before the opaque marker must survive it.
		{name: "opq/new", body: "n"},
		{name: "opq/.wh..wh..opq"},
		// Written through the lower layer's symlink: lands in usr/lib.
		{name: "lib/libx.so", body: "x"},
	})
	img, err := mutate.AppendLayers(mustEmpty(t), l1, l2)
	must(t, err)
	must(t, s.Put("t/wh:1", img))
	dest := filepath.Join(t.TempDir(), "rootfs")
	must(t, s.Unpack("t/wh:1", dest))
	exists := func(p string) bool { _, err := os.Lstat(filepath.Join(dest, p)); return err == nil }
	for p, want := range map[string]bool{
		"etc/keep": true, "etc/gone": false, "etc/.wh.gone": false,
		"opq": true, "opq/new": true, "opq/old1": false, "opq/sub": false, "opq/.wh..wh..opq": false,
		"usr/lib/libx.so": true,
	} {
		if got := exists(p); got != want {
			t.Errorf("%s exists = %v, want %v", p, got, want)
		}
	}
	if fi, err := os.Lstat(filepath.Join(dest, "lib")); err != nil || fi.Mode()&os.ModeSymlink == 0 {
		t.Errorf("lib should still be a symlink: %v", err)
	}
}

func mustEmpty(t *testing.T) v1.Image {
	t.Helper()
	img, err := mutate.AppendLayers(emptyImage())
	must(t, err)
	return img
}

func TestUnpackRefusesEscapes(t *testing.T) {
	s, err := Open(t.TempDir())
	must(t, err)
	outside := t.TempDir()
	for i, ents := range [][]tarEntry{
		{{name: "../escape", body: "x"}},
		{{name: "a/../../escape", body: "x"}},
		{{name: "evil", typ: tar.TypeLink, link: "../../etc/passwd"}},
	} {
		img, err := mutate.AppendLayers(mustEmpty(t), layerFromEntries(t, ents))
		must(t, err)
		ref := "t/esc:" + string(rune('a'+i))
		must(t, s.Put(ref, img))
		dest := filepath.Join(outside, "d", "rootfs")
		if err := s.Unpack(ref, dest); !errors.Is(err, ErrUnsafePath) {
			t.Errorf("case %d: err = %v, want ErrUnsafePath", i, err)
		}
		if _, err := os.Stat(dest); !os.IsNotExist(err) {
			t.Errorf("case %d: dest created on failure", i)
		}
		if _, err := os.Stat(dest + ".tmp"); !os.IsNotExist(err) {
			t.Errorf("case %d: tmp left on failure", i)
		}
	}
	if _, err := os.Stat(filepath.Join(outside, "d", "escape")); err == nil {
		t.Error("file written outside dest")
	}

	// An absolute symlink followed by a file below it: resolved as if
	// dest were "/", so the file goes under dest (when the link's target
	// exists there) or nowhere.
	img, err := mutate.AppendLayers(mustEmpty(t), layerFromEntries(t, []tarEntry{
		{name: strings.TrimPrefix(outside, "/") + "/", typ: tar.TypeDir},
		{name: "link", typ: tar.TypeSymlink, link: outside},
		{name: "link/planted", body: "x"},
	}))
	must(t, err)
	must(t, s.Put("t/esc:sym", img))
	dest := filepath.Join(t.TempDir(), "rootfs")
	must(t, s.Unpack("t/esc:sym", dest))
	if _, err := os.Stat(filepath.Join(outside, "planted")); err == nil {
		t.Error("symlink let a file out of dest")
	}
	if _, err := os.Stat(filepath.Join(dest, strings.TrimPrefix(outside, "/"), "planted")); err != nil {
		t.Errorf("file not placed under dest: %v", err)
	}
}

// A layer that makes a directory, replaces it with a symlink to a host
// directory and then writes a file, a directory and (at the end of the
// layer, when directory times are set) a time through it changes nothing
// outside the root: not the host directory's entries, not its mtime.
// Whether such a layer applies or fails, the host is as it was.
func TestUnpackSymlinkPlantedInSameTar(t *testing.T) {
	s, err := Open(t.TempDir())
	must(t, err)
	outside := t.TempDir()
	must(t, os.WriteFile(filepath.Join(outside, "keep"), []byte("host"), 0o644))
	old := time.Date(2001, 2, 3, 4, 5, 6, 0, time.UTC)
	must(t, os.Chtimes(outside, old, old))
	for i, ents := range [][]tarEntry{
		{
			{name: "d/", typ: tar.TypeDir},
			{name: "d", typ: tar.TypeSymlink, link: outside},
		},
		{
			{name: "d/", typ: tar.TypeDir},
			{name: "d", typ: tar.TypeSymlink, link: outside},
			{name: "d/planted", body: "x"},
			{name: "d/sub/", typ: tar.TypeDir},
		},
		{
			{name: "e", typ: tar.TypeSymlink, link: outside},
			{name: "e/sub/", typ: tar.TypeDir},
			{name: "e/keep", body: "layer"},
		},
		{
			{name: "up", typ: tar.TypeSymlink, link: "../../../../../../../../" + strings.TrimPrefix(outside, "/")},
			{name: "up/planted", body: "x"},
			{name: "up/", typ: tar.TypeDir},
		},
	} {
		img, err := mutate.AppendLayers(mustEmpty(t), layerFromEntries(t, ents))
		must(t, err)
		ref := "t/plant:" + string(rune('a'+i))
		must(t, s.Put(ref, img))
		dest := filepath.Join(t.TempDir(), "rootfs")
		err = s.Unpack(ref, dest)
		t.Logf("case %d: %v", i, err)
		ents, rerr := os.ReadDir(outside)
		if rerr != nil || len(ents) != 1 || ents[0].Name() != "keep" {
			t.Errorf("case %d: the host directory holds %v, %v; want only keep", i, ents, rerr)
		}
		if b, _ := os.ReadFile(filepath.Join(outside, "keep")); string(b) != "host" {
			t.Errorf("case %d: host file rewritten: %q", i, b)
		}
		if fi, err := os.Stat(outside); err != nil || !fi.ModTime().Equal(old) {
			t.Errorf("case %d: the host directory's mtime changed to %v (%v)", i, fi.ModTime(), err)
		}
	}
}

func TestGetNotFound(t *testing.T) {
	s, err := Open(t.TempDir())
	must(t, err)
	if _, err := s.Get("nope/x:1"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("err = %v", err)
	}
	addr := serve(t, NewRegistry(s))
	resp, err := http.Get("http://" + addr + "/v2/nope/x/manifests/1")
	must(t, err)
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Fatalf("status %d", resp.StatusCode)
	}
}

func TestImportTarFormats(t *testing.T) {
	s, err := Open(t.TempDir())
	must(t, err)
	tree := makeTree(t)
	work := t.TempDir()

	// Root filesystem tarball.
	rootTar := filepath.Join(work, "rootfs.tar")
	f, err := os.Create(rootTar)
	must(t, err)
	must(t, WriteTar(f, tree))
	must(t, f.Close())
	must(t, s.ImportTar("t/rootfs:tar", rootTar))
	dest := filepath.Join(work, "u1")
	must(t, s.Unpack("t/rootfs:tar", dest))
	if b, _ := os.ReadFile(filepath.Join(dest, "etc/hostname")); string(b) != "cubicle\n" {
		t.Fatalf("hostname = %q", b)
	}

	// OCI layout directory (written by go-containerregistry) and a tar of it.
	base, err := s.Get("t/rootfs:tar")
	must(t, err)
	lp, err := layout.Write(filepath.Join(work, "oci"), emptyIndex())
	must(t, err)
	must(t, lp.AppendImage(base))
	must(t, s.ImportTar("t/oci:dir", filepath.Join(work, "oci")))
	ociTar := filepath.Join(work, "oci.tar")
	f, err = os.Create(ociTar)
	must(t, err)
	must(t, WriteTar(f, filepath.Join(work, "oci")))
	must(t, f.Close())
	must(t, s.ImportTar("t/oci:tar", ociTar))

	// docker save tarball.
	dockerTar := filepath.Join(work, "docker.tar")
	tag, _ := name.NewTag("t/docker:save")
	must(t, tarball.WriteToFile(dockerTar, tag, base))
	must(t, s.ImportTar("t/docker:save", dockerTar))

	want, _ := base.Digest()
	for _, r := range []string{"t/oci:dir", "t/oci:tar"} {
		img, err := s.Get(r)
		must(t, err)
		if got, _ := img.Digest(); got != want {
			t.Errorf("%s digest %s, want %s", r, got, want)
		}
	}
	dimg, err := s.Get("t/docker:save")
	must(t, err)
	dl, _ := dimg.Layers()
	bl, _ := base.Layers()
	d1, _ := dl[0].DiffID()
	d2, _ := bl[0].DiffID()
	if len(dl) != 1 || d1 != d2 {
		t.Errorf("docker import layers differ")
	}
}

func emptyImage() v1.Image { return empty.Image }

func emptyIndex() v1.ImageIndex { return empty.Index }

// TestImportBaseRootfs times importing and unpacking the real base image
// (busybox + bash + python3) when it is installed.
func TestImportBaseRootfs(t *testing.T) {
	const base = "/var/lib/cubicle/images/base/rootfs"
	if testing.Short() {
		t.Skip("-short")
	}
	if _, err := os.Stat(filepath.Join(base, "bin/sh")); err != nil {
		testenv.Skip(t, "base rootfs not installed (scripts/install builds it)")
	}
	s, err := Open(t.TempDir())
	must(t, err)
	t0 := time.Now()
	must(t, s.ImportRootfs("cubicle/base:latest", base))
	t.Logf("import %s: %v", base, time.Since(t0))
	t0 = time.Now()
	dest := filepath.Join(t.TempDir(), "rootfs")
	must(t, s.Unpack("cubicle/base:latest", dest))
	t.Logf("unpack: %v", time.Since(t0))
	if _, err := os.Lstat(filepath.Join(dest, "bin/sh")); err != nil {
		t.Fatal(err)
	}
}
