package oci

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/cubicle-dev/cubicle/internal/runtime"
)

// TestCopyLayer copies an upper dir the way a sandbox leaves one: files,
// a hard link, a symlink pointing at a host file, a whiteout, an opaque
// dir, a fifo, a device node the sandbox made, overlay bookkeeping xattrs
// and a set-ID bit, all owned by the sandbox's shifted IDs.
func TestCopyLayer(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("needs root (chown, mknod, trusted xattrs)")
	}
	const shift = usernsBase + 3*usernsSize
	src, dst := filepath.Join(t.TempDir(), "upper"), filepath.Join(t.TempDir(), "layer")
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(src, "home/user"), 0o755))
	must(os.WriteFile(filepath.Join(src, "home/user/a.txt"), []byte("hello"), 0o640))
	must(os.Link(filepath.Join(src, "home/user/a.txt"), filepath.Join(src, "home/user/b.txt")))
	must(os.Symlink("/etc/shadow", filepath.Join(src, "home/user/link")))
	must(unix.Mknod(filepath.Join(src, "home/user/gone"), unix.S_IFCHR, 0)) // a whiteout: 0:0, no permissions
	must(unix.Mknod(filepath.Join(src, "home/user/fifo"), unix.S_IFIFO|0o600, 0))
	must(unix.Mknod(filepath.Join(src, "home/user/sda"), unix.S_IFBLK|0o600, int(unix.Mkdev(8, 0))))
	must(os.Mkdir(filepath.Join(src, "opaque"), 0o755))
	must(unix.Setxattr(filepath.Join(src, "opaque"), "trusted.overlay.opaque", []byte("y"), 0))
	must(unix.Setxattr(filepath.Join(src, "home"), "trusted.overlay.origin", []byte("x"), 0))
	must(unix.Setxattr(filepath.Join(src, "home/user/a.txt"), "user.note", []byte("kept"), 0))
	must(os.WriteFile(filepath.Join(src, "suid"), []byte("#!/bin/sh\n"), 0o755))
	filepath.Walk(src, func(p string, _ os.FileInfo, _ error) error {
		return os.Lchown(p, shift+1000, shift+1000)
	})
	must(os.Lchown(filepath.Join(src, "suid"), shift, shift))
	must(unix.Chmod(filepath.Join(src, "suid"), 0o4755))

	n, err := copyLayer(src, dst, shift, budget{})
	if err != nil {
		t.Fatal(err)
	}
	// Two files of one block each (the hard link is free), plus whatever
	// the directories take.
	if n < 2*blockSize || n > 2*blockSize+16*blockSize {
		t.Errorf("charged %d bytes", n)
	}
	st := func(rel string) *syscall.Stat_t {
		t.Helper()
		fi, err := os.Lstat(filepath.Join(dst, rel))
		if err != nil {
			t.Fatal(err)
		}
		return fi.Sys().(*syscall.Stat_t)
	}
	if a, b := st("home/user/a.txt"), st("home/user/b.txt"); a.Ino != b.Ino || a.Uid != 1000 || a.Gid != 1000 || a.Mode&0o7777 != 0o640 {
		t.Errorf("a.txt %+v / b.txt %+v: want one inode, owner 1000, mode 0640", a, b)
	}
	if target, err := os.Readlink(filepath.Join(dst, "home/user/link")); err != nil || target != "/etc/shadow" {
		t.Errorf("symlink = %q, %v; want the link itself, not the host file", target, err)
	}
	if w := st("home/user/gone"); w.Mode&unix.S_IFMT != unix.S_IFCHR || w.Rdev != 0 {
		t.Errorf("whiteout not kept: %+v", w)
	}
	if f := st("home/user/fifo"); f.Mode&unix.S_IFMT != unix.S_IFIFO {
		t.Errorf("fifo not kept: %+v", f)
	}
	if _, err := os.Lstat(filepath.Join(dst, "home/user/sda")); !os.IsNotExist(err) {
		t.Errorf("a device node the sandbox made was copied: %v", err)
	}
	if v, err := getXattr(filepath.Join(dst, "opaque"), "trusted.overlay.opaque"); err != nil || string(v) != "y" {
		t.Errorf("opaque marker = %q, %v", v, err)
	}
	if _, err := getXattr(filepath.Join(dst, "home"), "trusted.overlay.origin"); err == nil {
		t.Errorf("overlay origin xattr was copied")
	}
	if v, err := getXattr(filepath.Join(dst, "home/user/a.txt"), "user.note"); err != nil || string(v) != "kept" {
		t.Errorf("user xattr = %q, %v", v, err)
	}
	if s := st("suid"); s.Uid != 0 || s.Mode&0o7777 != 0o4755 {
		t.Errorf("suid: uid %d mode %o; want 0 and 4755 (mode set after chown)", s.Uid, s.Mode&0o7777)
	}
	if r := st("."); r.Uid != 1000 {
		t.Errorf("root owner %d", r.Uid)
	}
	if _, err := copyLayer(src, dst, shift, budget{}); !os.IsExist(err) {
		t.Errorf("copy onto an existing layer = %v, want exist error", err)
	}
}

// TestCopyLayerOpensBeneath: what the copy opens is resolved beneath its
// directory with every symlink refused, so a directory swapped for a link
// to the host's /etc mid-walk yields an error, never a host file.
func TestCopyLayerOpensBeneath(t *testing.T) {
	src := t.TempDir()
	if err := os.Symlink("/etc", filepath.Join(src, "swapped")); err != nil {
		t.Fatal(err)
	}
	root, err := unix.Open(src, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(root)
	for _, rel := range []string{"swapped/passwd", "swapped", "../" + filepath.Base(src) + "/swapped/hostname"} {
		if fd, err := openBeneath(root, rel, unix.O_RDONLY); err == nil {
			unix.Close(fd)
			t.Errorf("open(%q) followed a link out of the upper dir", rel)
		}
	}
}

// TestCopyLayerSparse: a file that is mostly hole (a sandbox's
// `truncate -s 3G`, with a few bytes written in the middle and at the end)
// is copied as the same holes: the layer takes a few blocks of the host's
// disk, the file keeps its apparent size and its data sits at the same
// offsets.
func TestCopyLayerSparse(t *testing.T) {
	src, dst := filepath.Join(t.TempDir(), "upper"), filepath.Join(t.TempDir(), "layer")
	if err := os.Mkdir(src, 0o755); err != nil {
		t.Fatal(err)
	}
	const size = 3 << 30
	f, err := os.Create(filepath.Join(src, "big"))
	if err != nil {
		t.Fatal(err)
	}
	marks := map[int64]string{1 << 30: "middle", size - 4: "end\n"}
	for off, s := range marks {
		if _, err := f.WriteAt([]byte(s), off); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if err := os.WriteFile(filepath.Join(src, "empty"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	// Limited to 1 MiB: a hole costs nothing against it.
	n, err := copyLayer(src, dst, 0, budget{1 << 20, "test"})
	if err != nil {
		t.Fatal(err)
	}
	if n > 16*blockSize {
		t.Errorf("charged %d bytes for two written blocks", n)
	}
	var st unix.Stat_t
	if err := unix.Stat(filepath.Join(dst, "big"), &st); err != nil {
		t.Fatal(err)
	}
	if st.Size != size || st.Blocks*512 > 1<<20 {
		t.Fatalf("copy: size %d, %d bytes allocated; want %d and a few blocks", st.Size, st.Blocks*512, int64(size))
	}
	g, err := os.Open(filepath.Join(dst, "big"))
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	for off, s := range marks {
		b := make([]byte, len(s))
		if _, err := g.ReadAt(b, off); err != nil || string(b) != s {
			t.Errorf("at %d: %q, %v; want %q", off, b, err, s)
		}
	}
	if fi, err := os.Stat(filepath.Join(dst, "empty")); err != nil || fi.Size() != 0 {
		t.Errorf("empty file: %v %v", fi, err)
	}
}

// TestCopyLayerLimit: real data past the limit stops the copy with
// runtime.ErrSnapshotTooLarge before it is written; holes do not count.
func TestCopyLayerLimit(t *testing.T) {
	src, dst := filepath.Join(t.TempDir(), "upper"), filepath.Join(t.TempDir(), "layer")
	if err := os.Mkdir(src, 0o755); err != nil {
		t.Fatal(err)
	}
	data := make([]byte, 2<<20)
	for i := range data {
		data[i] = byte(i)
	}
	if err := os.WriteFile(filepath.Join(src, "real"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	n, err := copyLayer(src, dst, 0, budget{1 << 20, "test"})
	if !errors.Is(err, runtime.ErrSnapshotTooLarge) {
		t.Fatalf("copy of 2 MiB with a 1 MiB limit = %d, %v; want ErrSnapshotTooLarge", n, err)
	}
	var st unix.Stat_t
	if err := unix.Stat(filepath.Join(dst, "real"), &st); err == nil && st.Blocks*512 > 0 {
		t.Errorf("the refused extent was written: %d bytes allocated", st.Blocks*512)
	}
}

// TestCopyLayerDeep: a directory chain whose full path is past PATH_MAX,
// with hard links between its top and its bottom, copies whole (the walk
// is relative to open directories) holding few descriptors.
func TestCopyLayerDeep(t *testing.T) {
	src, dst := filepath.Join(t.TempDir(), "upper"), filepath.Join(t.TempDir(), "layer")
	if err := os.Mkdir(src, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(src, "top"), []byte("top"), 0o644); err != nil {
		t.Fatal(err)
	}
	name := strings.Repeat("d", 200)
	const depth = 40 // 40 × 201 bytes: about twice PATH_MAX
	fd, err := unix.Open(src, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		t.Fatal(err)
	}
	for range depth {
		if err := unix.Mkdirat(fd, name, 0o755); err != nil {
			t.Fatal(err)
		}
		next, err := unix.Openat(fd, name, unix.O_RDONLY|unix.O_DIRECTORY, 0)
		unix.Close(fd)
		if err != nil {
			t.Fatal(err)
		}
		fd = next
	}
	bottom, err := unix.Openat(fd, "deep", unix.O_WRONLY|unix.O_CREAT, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	unix.Write(bottom, []byte("deep"))
	unix.Close(bottom)
	top, err := unix.Open(src, unix.O_PATH|unix.O_DIRECTORY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Linkat(top, "top", fd, "top-link", 0); err != nil {
		t.Fatal(err)
	}
	if err := unix.Linkat(fd, "deep", top, "deep-link", 0); err != nil {
		t.Fatal(err)
	}
	unix.Close(fd)
	unix.Close(top)
	if len(src)+depth*(len(name)+1) <= unix.PathMax {
		t.Fatal("the chain is not past PATH_MAX")
	}

	if n := fdsUnder(t, src, dst); n != 0 {
		t.Fatalf("%d descriptors under the trees before the copy", n)
	}
	if _, err := copyLayer(src, dst, 0, budget{}); err != nil {
		t.Fatal(err)
	}
	if n := fdsUnder(t, src, dst); n != 0 {
		t.Errorf("the copy left %d descriptors open under its trees", n)
	}
	at, err := unix.Open(dst, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		t.Fatal(err)
	}
	for range depth {
		next, err := unix.Openat(at, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW, 0)
		unix.Close(at)
		if err != nil {
			t.Fatal(err)
		}
		at = next
	}
	defer unix.Close(at)
	read := func(dir int, n string) (string, uint64) {
		t.Helper()
		f, err := unix.Openat(dir, n, unix.O_RDONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer unix.Close(f)
		b := make([]byte, 16)
		k, _ := unix.Read(f, b)
		var st unix.Stat_t
		unix.Fstat(f, &st)
		return string(b[:k]), st.Ino
	}
	dtop, err := unix.Open(dst, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(dtop)
	deep, deepIno := read(at, "deep")
	_, deepLinkIno := read(dtop, "deep-link")
	topS, topIno := read(dtop, "top")
	_, topLinkIno := read(at, "top-link")
	if deep != "deep" || topS != "top" || deepIno != deepLinkIno || topIno != topLinkIno {
		t.Errorf("deep %q top %q; links share inodes: %v %v", deep, topS, deepIno == deepLinkIno, topIno == topLinkIno)
	}
	// Clean-up: os.RemoveAll walks relative to open directories too.
}

// fdsUnder counts this process's descriptors open on a path under one of
// roots. A count of the whole table would race with other tests'
// goroutines opening and closing their own descriptors.
func fdsUnder(t *testing.T, roots ...string) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range ents {
		target, err := os.Readlink(filepath.Join("/proc/self/fd", e.Name()))
		if errors.Is(err, unix.ENAMETOOLONG) {
			n++ // only the deep chains under roots are that long
			continue
		}
		if err != nil {
			continue // closed since the listing
		}
		for _, r := range roots {
			if target == r || strings.HasPrefix(target, r+"/") {
				n++
				break
			}
		}
	}
	return n
}
