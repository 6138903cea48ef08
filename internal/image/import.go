package image

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"syscall"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"golang.org/x/sys/unix"
)

// defaultEnv is what a rootfs import gets, since a bare tree carries no config.
var defaultEnv = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}

// ImportRootfs stores the directory tree dir as a single-layer image ref.
func (s *Store) ImportRootfs(ref, dir string) error {
	if _, err := NormalizeRef(ref); err != nil {
		return err
	}
	fi, err := os.Stat(dir)
	if err != nil {
		return err
	}
	if !fi.IsDir() {
		return fmt.Errorf("image: %s is not a directory", dir)
	}
	f, err := os.CreateTemp(filepath.Join(s.dir, "uploads"), "rootfs-*.tar.gz")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	// BestSpeed: the layer lives on local disk, so CPU time matters more than
	// bytes.
	zw, err := gzip.NewWriterLevel(f, gzip.BestSpeed)
	if err != nil {
		f.Close()
		return err
	}
	bw := bufio.NewWriterSize(zw, 1<<20)
	if err := WriteTar(bw, dir); err != nil {
		f.Close()
		return err
	}
	if err := bw.Flush(); err != nil {
		f.Close()
		return err
	}
	if err := zw.Close(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return s.importLayerFile(ref, f.Name())
}

// importLayerFile wraps one (gzip or plain) layer tar in a fresh image.
func (s *Store) importLayerFile(ref, path string) error {
	layer, err := tarball.LayerFromFile(path, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return err
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		return err
	}
	img = mutate.MediaType(img, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	cf, err := img.ConfigFile()
	if err != nil {
		return err
	}
	cf = cf.DeepCopy()
	cf.OS = "linux"
	cf.Architecture = runtime.GOARCH
	cf.Created = v1.Time{Time: time.Now().UTC().Truncate(time.Second)}
	cf.Config.Env = defaultEnv
	cf.Config.Cmd = []string{"/bin/sh"}
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		return err
	}
	return s.Put(ref, img)
}

// WriteTar writes the tree under dir as a tar stream (no compression), with
// numeric owners, modes, symlinks and hard links preserved. Entries are in
// lexical order so equal trees give equal layers.
func WriteTar(w io.Writer, dir string) error {
	tw := tar.NewWriter(w)
	if err := writeTree(tw, dir, false); err != nil {
		return err
	}
	return tw.Close()
}

// writeTree writes dir's entries to tw as WriteTar does; overlay
// translates an overlayfs upper directory's whiteouts (overlayEntry).
func writeTree(tw *tar.Writer, dir string, overlay bool) error {
	type inode struct{ dev, ino uint64 }
	seen := map[inode]string{}
	return filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		if rel == "." {
			return nil
		}
		rel = filepath.ToSlash(rel)
		fi, err := d.Info()
		if err != nil {
			return err
		}
		if fi.Mode()&os.ModeSocket != 0 {
			return nil
		}
		link := ""
		if fi.Mode()&os.ModeSymlink != 0 {
			if link, err = os.Readlink(p); err != nil {
				return err
			}
		}
		hdr, err := tar.FileInfoHeader(fi, link)
		if err != nil {
			return err
		}
		hdr.Name = rel
		if fi.IsDir() {
			hdr.Name += "/"
		}
		hdr.Uname, hdr.Gname = "", "" // numeric ids only: names are the host's
		hdr.Format = tar.FormatPAX
		hdr.AccessTime, hdr.ChangeTime = time.Time{}, time.Time{}
		if st, ok := fi.Sys().(*syscall.Stat_t); ok {
			hdr.Uid, hdr.Gid = int(st.Uid), int(st.Gid)
			if fi.Mode().IsRegular() && st.Nlink > 1 {
				k := inode{uint64(st.Dev), st.Ino}
				if first, ok := seen[k]; ok {
					hdr.Typeflag, hdr.Linkname, hdr.Size = tar.TypeLink, first, 0
				} else {
					seen[k] = rel
				}
			}
		}
		if hdr.Typeflag != tar.TypeLink {
			if err := addXattrs(hdr, p); err != nil {
				return err
			}
		}
		opaque := false
		if overlay {
			repl, skip, opq, err := overlayEntry(p, fi, hdr)
			if err != nil {
				return err
			}
			if skip {
				return nil
			}
			if repl != nil {
				return tw.WriteHeader(repl)
			}
			opaque = opq
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if opaque {
			return tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: hdr.Name + whiteoutOpaque, Mode: 0o600, Format: tar.FormatPAX})
		}
		if hdr.Typeflag == tar.TypeReg {
			f, err := os.Open(p)
			if err != nil {
				return err
			}
			_, err = io.Copy(tw, f)
			f.Close()
			return err
		}
		return nil
	})
}

// addXattrs records p's extended attributes in hdr as PAX records (what
// the unpackers apply): file capabilities above all (base's ping carries
// cap_net_raw, which a sandbox's user needs). trusted.* is left out:
// overlayfs keeps its own state there (overlayEntry translates it) and
// only a privileged writer could set it again.
func addXattrs(hdr *tar.Header, p string) error {
	buf := make([]byte, 1024)
	n, err := unix.Llistxattr(p, buf)
	if errors.Is(err, unix.ERANGE) {
		if n, err = unix.Llistxattr(p, nil); err == nil {
			buf = make([]byte, n)
			n, err = unix.Llistxattr(p, buf)
		}
	}
	if errors.Is(err, unix.ENOTSUP) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("%s: list xattrs: %w", p, err)
	}
	for name := range strings.SplitSeq(string(buf[:n]), "\x00") {
		if name == "" || strings.HasPrefix(name, "trusted.") {
			continue
		}
		sz, err := unix.Lgetxattr(p, name, nil)
		if errors.Is(err, unix.ENODATA) {
			continue // removed meanwhile
		}
		if err != nil {
			return fmt.Errorf("%s: xattr %s: %w", p, name, err)
		}
		val := make([]byte, sz)
		if sz, err = unix.Lgetxattr(p, name, val); err != nil {
			return fmt.Errorf("%s: xattr %s: %w", p, name, err)
		}
		if hdr.PAXRecords == nil {
			hdr.PAXRecords = map[string]string{}
		}
		hdr.PAXRecords["SCHILY.xattr."+name] = string(val[:sz])
	}
	return nil
}

// ImportTar stores the image in path as ref. path may be:
//   - an OCI image layout directory, or a tar (optionally gzip) of one;
//   - a `docker save` tarball;
//   - a root filesystem tarball (.tar or .tar.gz), imported as one layer;
//   - a plain directory, imported like ImportRootfs.
func (s *Store) ImportTar(ref, path string) error {
	if _, err := NormalizeRef(ref); err != nil {
		return err
	}
	fi, err := os.Stat(path)
	if err != nil {
		return err
	}
	if fi.IsDir() {
		if _, err := os.Stat(filepath.Join(path, "oci-layout")); err == nil {
			return s.importLayoutDir(ref, path)
		}
		return s.ImportRootfs(ref, path)
	}
	kind, err := sniffArchive(path)
	if err != nil {
		return err
	}
	switch kind {
	case archiveOCI:
		tmp, err := os.MkdirTemp(filepath.Join(s.dir, "uploads"), "layout-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(tmp)
		if err := extractPlain(path, tmp); err != nil {
			return err
		}
		return s.importLayoutDir(ref, tmp)
	case archiveDocker:
		img, err := tarball.ImageFromPath(path, nil)
		if err != nil {
			return err
		}
		return s.Put(ref, img)
	default:
		return s.importLayerFile(ref, path)
	}
}

// importLayoutDir copies the first image (or the one named like ref) from an
// OCI layout directory.
func (s *Store) importLayoutDir(ref, dir string) error {
	src := &Store{dir: dir} // read-only view: Open would create dirs in the source
	want, _ := NormalizeRef(ref)
	var pick *v1.Descriptor
	idx, err := src.readIndex()
	if err != nil {
		return err
	}
	for i := range idx.Manifests {
		d := idx.Manifests[i]
		n := d.Annotations[AnnotationRefName]
		if pick == nil || n == want || strings.HasSuffix(want, ":"+n) {
			pick = &d
		}
		if n == want {
			break
		}
	}
	if pick == nil {
		return fmt.Errorf("%w: empty OCI layout %s", ErrNotFound, dir)
	}
	img, err := src.imageByDescriptor(*pick)
	if err != nil {
		return err
	}
	return s.Put(ref, img)
}

type archiveKind int

const (
	archiveRootfs archiveKind = iota
	archiveOCI
	archiveDocker
)

// sniffArchive looks at the top-level names: oci-layout marks an OCI layout,
// manifest.json a docker save; anything else is a root filesystem.
func sniffArchive(path string) (archiveKind, error) {
	r, closeFn, err := openMaybeGzip(path)
	if err != nil {
		return 0, err
	}
	defer closeFn()
	tr := tar.NewReader(r)
	var names []string
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return 0, fmt.Errorf("image: %s: %w", path, err)
		}
		n := strings.TrimPrefix(strings.TrimLeft(hdr.Name, "/"), "./")
		if !strings.Contains(n, "/") {
			names = append(names, n)
		}
	}
	sort.Strings(names)
	has := func(n string) bool {
		i := sort.SearchStrings(names, n)
		return i < len(names) && names[i] == n
	}
	switch {
	case has("oci-layout") && has("index.json"):
		return archiveOCI, nil
	case has("manifest.json") && !has("etc") && !has("bin"):
		return archiveDocker, nil
	}
	return archiveRootfs, nil
}

func openMaybeGzip(path string) (io.Reader, func(), error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, nil, err
	}
	br := bufio.NewReader(f)
	magic, _ := br.Peek(2)
	if bytes.Equal(magic, []byte{0x1f, 0x8b}) {
		zr, err := gzip.NewReader(br)
		if err != nil {
			f.Close()
			return nil, nil, err
		}
		return zr, func() { zr.Close(); f.Close() }, nil
	}
	return br, func() { f.Close() }, nil
}

// extractPlain unpacks a small metadata-only archive (an OCI layout) with
// regular files and dirs only.
func extractPlain(path, dest string) error {
	r, closeFn, err := openMaybeGzip(path)
	if err != nil {
		return err
	}
	defer closeFn()
	return eachEntry(r, func(tr *tar.Reader, hdr *tar.Header, rel string) error {
		t := filepath.Join(dest, rel)
		switch hdr.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(t, 0o755); err != nil {
				return err
			}
		//lint:ignore SA1019 archives from old tools still mark files '\x00'
		case tar.TypeReg, tar.TypeRegA:
			if err := os.MkdirAll(filepath.Dir(t), 0o755); err != nil {
				return err
			}
			f, err := os.Create(t)
			if err != nil {
				return err
			}
			_, err = io.Copy(f, tr)
			f.Close()
			if err != nil {
				return err
			}
		}
		return nil
	})
}
