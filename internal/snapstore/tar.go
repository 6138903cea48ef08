package snapstore

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

const xattrPAX = "SCHILY.xattr."

// keptXattr: the extended attributes a package carries, as the node's
// snapshot copy keeps them (docs/snapshots.md): overlay opaque dirs, user
// attributes and file capabilities. Anything else in a package is refused.
func keptXattr(name string) bool {
	return name == "trusted.overlay.opaque" || name == "security.capability" || strings.HasPrefix(name, "user.")
}

// pack writes the tree at dir as a PAX tar: modes, owners, times, hard
// links, symlinks (never followed), overlay whiteouts (0/0 character
// devices), FIFOs and kept xattrs. Holes are not kept (archive/tar writes
// no sparse files): a sparse file travels at its apparent size.
func pack(dir string, w io.Writer) error {
	tw := tar.NewWriter(w)
	links := map[[2]uint64]string{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		st, ok := fi.Sys().(*syscall.Stat_t)
		if !ok {
			return fmt.Errorf("%s: no stat", p)
		}
		var target string
		switch m := fi.Mode(); {
		case m&fs.ModeSymlink != 0:
			if target, err = os.Readlink(p); err != nil {
				return err
			}
		case m&fs.ModeCharDevice != 0:
			if st.Rdev != 0 {
				return fmt.Errorf("%w: %s: a device node other than a whiteout", ErrBadPackage, rel)
			}
		case m&fs.ModeSocket != 0:
			return nil // the snapshot copy drops them; never packed
		case m&fs.ModeDevice != 0:
			return fmt.Errorf("%w: %s: a block device", ErrBadPackage, rel)
		}
		hdr, err := tar.FileInfoHeader(fi, target)
		if err != nil {
			return err
		}
		hdr.Name, hdr.Uid, hdr.Gid, hdr.Uname, hdr.Gname, hdr.Format = filepath.ToSlash(rel), int(st.Uid), int(st.Gid), "", "", tar.FormatPAX
		if fi.IsDir() && rel != "." {
			hdr.Name += "/"
		}
		if fi.Mode().IsRegular() && st.Nlink > 1 {
			key := [2]uint64{st.Dev, st.Ino}
			if first, ok := links[key]; ok {
				hdr.Typeflag, hdr.Linkname, hdr.Size = tar.TypeLink, first, 0
			} else {
				links[key] = hdr.Name
			}
		}
		if fi.IsDir() || hdr.Typeflag == tar.TypeReg {
			// Only these carry kept xattrs (whiteouts and FIFOs cannot be
			// opened to set them again).
			if hdr.PAXRecords, err = xattrs(p); err != nil {
				return err
			}
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if hdr.Typeflag != tar.TypeReg {
			return nil
		}
		f, err := os.OpenFile(p, os.O_RDONLY|unix.O_NOFOLLOW, 0)
		if err != nil {
			return err
		}
		defer f.Close()
		if _, err := io.CopyN(tw, f, hdr.Size); err != nil {
			return fmt.Errorf("%s: %w", rel, err)
		}
		return nil
	})
	if err != nil {
		return err
	}
	return tw.Close()
}

func xattrs(p string) (map[string]string, error) {
	sz, err := unix.Llistxattr(p, nil)
	if err != nil || sz == 0 {
		if errors.Is(err, unix.ENOTSUP) {
			err = nil
		}
		return nil, err
	}
	buf := make([]byte, sz)
	if sz, err = unix.Llistxattr(p, buf); err != nil {
		return nil, err
	}
	var out map[string]string
	for _, name := range strings.Split(strings.TrimRight(string(buf[:sz]), "\x00"), "\x00") {
		if !keptXattr(name) {
			continue
		}
		v := make([]byte, 64<<10)
		n, err := unix.Lgetxattr(p, name, v)
		if errors.Is(err, unix.ENODATA) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("%s: xattr %s: %w", p, name, err)
		}
		if out == nil {
			out = map[string]string{}
		}
		out[xattrPAX+name] = string(v[:n])
	}
	return out, nil
}

// unpack extracts a package tar into dst (an empty dir). Every operation
// goes through an os.Root on dst, and an entry's parent must be a
// directory this tar made: nothing is written outside dst or through a
// symlink, whatever the (hostile) package holds.
func unpack(r io.Reader, dst string) error {
	root, err := os.OpenRoot(dst)
	if err != nil {
		return err
	}
	defer root.Close()
	dirs, files := map[string]bool{".": true}, map[string]bool{}
	type dirTime struct {
		name  string
		atime time.Time
		mtime time.Time
	}
	var dirTimes []dirTime
	tr := tar.NewReader(r)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return fmt.Errorf("%w: %v", ErrBadPackage, err)
		}
		name := path.Clean(strings.TrimSuffix(hdr.Name, "/"))
		if path.IsAbs(name) || name == ".." || strings.HasPrefix(name, "../") {
			return fmt.Errorf("%w: entry %q leaves its part", ErrBadPackage, hdr.Name)
		}
		if !dirs[path.Dir(name)] {
			return fmt.Errorf("%w: entry %q is not under a directory of the package", ErrBadPackage, hdr.Name)
		}
		if (files[name] || dirs[name]) && name != "." {
			return fmt.Errorf("%w: entry %q twice", ErrBadPackage, hdr.Name)
		}
		if name == "." && hdr.Typeflag != tar.TypeDir {
			return fmt.Errorf("%w: the part's root is not a directory", ErrBadPackage)
		}
		for k := range hdr.PAXRecords {
			x, ok := strings.CutPrefix(k, xattrPAX)
			if ok && (!keptXattr(x) || (hdr.Typeflag != tar.TypeDir && hdr.Typeflag != tar.TypeReg)) {
				return fmt.Errorf("%w: %q: xattr %s", ErrBadPackage, hdr.Name, x)
			}
		}
		mode := hdr.FileInfo().Mode()
		switch hdr.Typeflag {
		case tar.TypeDir:
			if name != "." {
				if err := root.Mkdir(name, 0o700); err != nil {
					return err
				}
			}
			dirs[name] = true
		case tar.TypeReg:
			f, err := root.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
			if err != nil {
				return err
			}
			_, err = io.Copy(f, tr)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return err
			}
			files[name] = true
		case tar.TypeSymlink:
			if err := root.Symlink(hdr.Linkname, name); err != nil {
				return err
			}
			files[name] = true
		case tar.TypeLink:
			target := path.Clean(hdr.Linkname)
			if fi, err := root.Lstat(target); !files[target] || err != nil || !fi.Mode().IsRegular() {
				return fmt.Errorf("%w: %q links to %q, not a file of the package", ErrBadPackage, hdr.Name, hdr.Linkname)
			}
			if err := root.Link(target, name); err != nil {
				return err
			}
			files[name] = true
			continue // the target's attributes are the link's
		case tar.TypeChar, tar.TypeFifo:
			dev, kind := uint32(0), uint32(unix.S_IFIFO)
			if hdr.Typeflag == tar.TypeChar {
				if hdr.Devmajor != 0 || hdr.Devminor != 0 {
					return fmt.Errorf("%w: %q: a device node other than a whiteout", ErrBadPackage, hdr.Name)
				}
				kind = unix.S_IFCHR
			}
			if err := mknodIn(root, name, kind|0o600, int(dev)); err != nil {
				return err
			}
			files[name] = true
		default:
			return fmt.Errorf("%w: %q: entry type %q", ErrBadPackage, hdr.Name, hdr.Typeflag)
		}
		// Owner before mode (chown clears set-ID bits), capabilities after
		// both (chown clears them too).
		if err := root.Lchown(name, hdr.Uid, hdr.Gid); err != nil {
			return err
		}
		if hdr.Typeflag == tar.TypeSymlink {
			continue
		}
		if err := root.Chmod(name, mode&(fs.ModePerm|fs.ModeSetuid|fs.ModeSetgid|fs.ModeSticky)); err != nil {
			return err
		}
		if err := setXattrs(root, name, hdr.PAXRecords); err != nil {
			return err
		}
		if hdr.Typeflag == tar.TypeDir {
			dirTimes = append(dirTimes, dirTime{name, hdr.AccessTime, hdr.ModTime})
		} else if hdr.Typeflag == tar.TypeReg {
			if err := root.Chtimes(name, orTime(hdr.AccessTime, hdr.ModTime), hdr.ModTime); err != nil {
				return err
			}
		}
	}
	// Deepest first: setting a child's times touches no parent, but
	// creating it did.
	slices.Reverse(dirTimes)
	for _, d := range dirTimes {
		if err := root.Chtimes(d.name, orTime(d.atime, d.mtime), d.mtime); err != nil {
			return err
		}
	}
	return nil
}

func orTime(a, b time.Time) time.Time {
	if a.IsZero() {
		return b
	}
	return a
}

// mknodIn makes a whiteout or FIFO at name, relative to its parent opened
// through root (mknodat never follows its last component).
func mknodIn(root *os.Root, name string, mode uint32, dev int) error {
	parent, err := root.Open(path.Dir(name))
	if err != nil {
		return err
	}
	defer parent.Close()
	if err := unix.Mknodat(int(parent.Fd()), path.Base(name), mode, dev); err != nil {
		return fmt.Errorf("mknod %s: %w", name, err)
	}
	return nil
}

func setXattrs(root *os.Root, name string, pax map[string]string) error {
	var f *os.File
	for k, v := range pax {
		x, ok := strings.CutPrefix(k, xattrPAX)
		if !ok {
			continue
		}
		if f == nil {
			var err error
			// O_PATH cannot set xattrs; a whiteout or FIFO carries none
			// that a package keeps, so only dirs and files are opened.
			if f, err = root.OpenFile(name, os.O_RDONLY|unix.O_NONBLOCK, 0); err != nil {
				return err
			}
			defer f.Close()
		}
		if err := unix.Fsetxattr(int(f.Fd()), x, []byte(v), 0); err != nil {
			return fmt.Errorf("%s: xattr %s: %w", name, x, err)
		}
	}
	return nil
}
