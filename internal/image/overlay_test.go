package image

import (
	"archive/tar"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"golang.org/x/sys/unix"

	"github.com/cubicle-dev/cubicle/internal/testenv"
)

// treeOf lists a tree: path, type, mode, owner, content or link target.
func treeOf(t *testing.T, root string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		st := fi.Sys().(*syscall.Stat_t)
		line := fmt.Sprintf("%s %v %d:%d", rel, fi.Mode(), st.Uid, st.Gid)
		switch {
		case fi.Mode()&os.ModeSymlink != 0:
			l, _ := os.Readlink(p)
			line += " -> " + l
		case fi.Mode().IsRegular():
			b, _ := os.ReadFile(p)
			line += " " + string(b)
		}
		out = append(out, line)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(out)
	return out
}

// The overlay layer of a build, stacked on its base's tree, shows exactly
// what unpacking the whole image shows.
func TestUnpackOverlayMatchesFlat(t *testing.T) {
	testenv.RequireRoot(t, "overlay mounts, whiteout devices, trusted xattrs")
	base := layerFromEntries(t, []tarEntry{
		{name: "usr/", typ: tar.TypeDir},
		{name: "usr/lib/", typ: tar.TypeDir},
		{name: "usr/lib/a", body: "a"},
		{name: "lib", typ: tar.TypeSymlink, link: "usr/lib"},
		{name: "tmp/", typ: tar.TypeDir, mode: 0o1777},
		{name: "etc/", typ: tar.TypeDir},
		{name: "etc/old", body: "old"},
		{name: "etc/keep", body: "keep"},
		{name: "opt/", typ: tar.TypeDir},
		{name: "opt/d/", typ: tar.TypeDir},
		{name: "opt/d/x", body: "x"},
		{name: "opt/d/y", body: "y"},
		{name: "srv/", typ: tar.TypeDir, mode: 0o700},
		{name: "srv/gone/", typ: tar.TypeDir},
		{name: "srv/gone/f", body: "f"},
		{name: "srv/gone2/", typ: tar.TypeDir},
		{name: "srv/gone2/f", body: "f"},
	})
	step1 := layerFromEntries(t, []tarEntry{
		// No entry for the parent directories: they come from the base.
		{name: "tmp/new", body: "n"},
		{name: "lib/b", body: "b"}, // through the base's symlink
		{name: "etc/.wh.old"},
		{name: "opt/d/.wh..wh..opq"},
		{name: "opt/d/z", body: "z"},
		{name: "usr/lib/hard", typ: tar.TypeLink, link: "usr/lib/a"},
		{name: "srv/.wh.gone"},
		{name: "srv/.wh.gone2"},
	})
	step2 := layerFromEntries(t, []tarEntry{
		{name: "etc/old", body: "again"},      // recreated after its whiteout
		{name: "srv/gone/", typ: tar.TypeDir}, // a directory where a whiteout was
		{name: "srv/gone/g", body: "g"},
		{name: "srv/gone2/h", body: "h"}, // its directory only implied
		{name: "tmp/.wh.new"},
	})
	img, err := mutate.AppendLayers(mustEmpty(t), base, step1, step2)
	must(t, err)
	baseImg, err := mutate.AppendLayers(mustEmpty(t), base)
	must(t, err)

	dir := t.TempDir()
	flat, lower, up := filepath.Join(dir, "flat"), filepath.Join(dir, "lower"), filepath.Join(dir, "upper")
	must(t, UnpackImage(img, flat))
	must(t, UnpackImage(baseImg, lower))
	must(t, UnpackOverlay(img, 1, up, []string{lower}))

	mnt := filepath.Join(dir, "mnt")
	must(t, os.Mkdir(mnt, 0o755))
	must(t, unix.Mount("overlay", mnt, "overlay", unix.MS_RDONLY, "lowerdir="+up+":"+lower))
	t.Cleanup(func() { unix.Unmount(mnt, unix.MNT_DETACH) })

	want, got := treeOf(t, flat), treeOf(t, mnt)
	// The roots are different directories.
	want, got = want[1:], got[1:]
	if strings.Join(want, "\n") != strings.Join(got, "\n") {
		t.Fatalf("merged overlay differs from the flat unpack\nflat:\n%s\n\noverlay:\n%s", strings.Join(want, "\n"), strings.Join(got, "\n"))
	}
	// Only what the steps changed is in the layer.
	if _, err := os.Lstat(filepath.Join(up, "usr/lib/a")); err == nil {
		t.Fatal("the base's files were copied into the layer")
	}
}

// The overlay unpacker has the same end-of-layer passes (opaque markers,
// directory times) over paths resolved earlier: a layer that marks d
// opaque and then replaces d with a symlink to a host directory must
// neither empty that directory nor change its mtime.
func TestUnpackOverlaySymlinkPlantedInSameTar(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("needs root: whiteout devices, trusted xattrs")
	}
	outside := t.TempDir()
	must(t, os.WriteFile(filepath.Join(outside, "keep"), []byte("host"), 0o644))
	old := time.Date(2001, 2, 3, 4, 5, 6, 0, time.UTC)
	must(t, os.Chtimes(outside, old, old))
	layer := layerFromEntries(t, []tarEntry{
		{name: "d/", typ: tar.TypeDir},
		{name: "d/.wh..wh..opq"},
		{name: "d", typ: tar.TypeSymlink, link: outside},
	})
	img, err := mutate.AppendLayers(mustEmpty(t), layer)
	must(t, err)
	err = UnpackOverlay(img, 0, filepath.Join(t.TempDir(), "upper"), nil)
	t.Logf("unpack: %v", err)
	if b, err := os.ReadFile(filepath.Join(outside, "keep")); err != nil || string(b) != "host" {
		t.Errorf("the host file is gone or changed: %q, %v", b, err)
	}
	if fi, err := os.Stat(outside); err != nil || !fi.ModTime().Equal(old) {
		t.Errorf("the host directory's mtime changed: %v, %v", fi.ModTime(), err)
	}
}
