package oci

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
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

	n, err := copyLayer(src, dst, shift)
	if err != nil {
		t.Fatal(err)
	}
	if n != int64(len("hello")+len("#!/bin/sh\n")) {
		t.Errorf("copied %d bytes", n)
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
	if _, err := copyLayer(src, dst, shift); !os.IsExist(err) {
		t.Errorf("copy onto an existing layer = %v, want exist error", err)
	}
}

// TestCopyLayerOpensBeneath: what the copy opens is resolved beneath the
// upper dir with every symlink refused, so a directory swapped for a link
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
	c := &layerCopy{src: src, root: root}
	for _, rel := range []string{"swapped/passwd", "swapped", "../" + filepath.Base(src) + "/swapped/hostname"} {
		if f, err := c.open(rel, 0); err == nil {
			f.Close()
			t.Errorf("open(%q) followed a link out of the upper dir", rel)
		}
	}
}
