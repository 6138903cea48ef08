package contextstore

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

// modeBits are the mode bits a tar member keeps on extraction.
const modeBits = fs.ModePerm | fs.ModeSetuid | fs.ModeSetgid | fs.ModeSticky

// Extract unpacks the tar stored for hash into dest/<hash>/, replacing any
// earlier copy. Modes, symlinks, hard links and mtimes are preserved;
// ownership is applied only when running as root. The tree is built in a
// temporary sibling and renamed into place, so dest/<hash> is either the
// previous copy or a complete new one. dest/<hash> itself is mode 0700: the
// builder reads it as this process, and a setuid file from an upload must
// not be reachable by other host users.
func (s *Store) Extract(hash, dest string) error {
	if !hashRe.MatchString(hash) {
		return ErrInvalidHash
	}
	f, err := os.Open(s.Path(hash))
	if errors.Is(err, os.ErrNotExist) {
		return ErrNotFound
	}
	if err != nil {
		return fmt.Errorf("contextstore: %w", err)
	}
	defer f.Close()
	// Put validated this file; check again so a tampered or foreign file in
	// the store dir cannot write outside dest.
	if err := validate(tar.NewReader(f), nil); err != nil {
		return err
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return fmt.Errorf("contextstore: %w", err)
	}

	if err := os.MkdirAll(dest, 0o755); err != nil {
		return fmt.Errorf("contextstore: %w", err)
	}
	tmp, err := os.MkdirTemp(dest, "."+hash+".*"+partialSuffix)
	if err != nil {
		return fmt.Errorf("contextstore: %w", err)
	}
	ok := false
	defer func() {
		if !ok {
			removeTree(tmp)
		}
	}()
	if err := unpack(tar.NewReader(f), tmp); err != nil {
		return err
	}
	final := filepath.Join(dest, hash)
	if _, err := os.Lstat(final); err == nil {
		if err := removeTree(final); err != nil {
			return fmt.Errorf("contextstore: replacing %s: %w", final, err)
		}
	}
	if err := os.Rename(tmp, final); err != nil {
		return fmt.Errorf("contextstore: %w", err)
	}
	ok = true
	return nil
}

type dirMeta struct {
	mode     fs.FileMode
	uid, gid int
	owned    bool
	mtime    time.Time
}

func unpack(tr *tar.Reader, dir string) error {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return fmt.Errorf("contextstore: %w", err)
	}
	defer root.Close()
	asRoot := os.Geteuid() == 0
	// Directories are created writable and get their real mode, owner and
	// mtime last, deepest first, so read-only directories can still be
	// filled and child writes do not bump their mtime. Parents without an
	// entry of their own get 0755, as tar(1) gives them.
	dirs := map[string]*dirMeta{}
	mkParents := func(name string) error {
		for p := path.Dir(name); p != "."; p = path.Dir(p) {
			if _, ok := dirs[p]; !ok {
				dirs[p] = &dirMeta{mode: 0o755}
			}
		}
		if d := path.Dir(name); d != "." {
			return root.MkdirAll(d, 0o700)
		}
		return nil
	}
	owner := func(name string, h *tar.Header) error {
		if !asRoot {
			return nil
		}
		return root.Lchown(name, h.Uid, h.Gid)
	}

	err = validate(tr, func(e entry, r io.Reader) error {
		h := e.hdr
		mode := h.FileInfo().Mode() & modeBits
		if err := mkParents(e.Name); err != nil {
			return err
		}
		switch h.Typeflag {
		case tar.TypeDir:
			if err := root.MkdirAll(e.Name, 0o700); err != nil {
				return err
			}
			dirs[e.Name] = &dirMeta{mode: mode, uid: h.Uid, gid: h.Gid, owned: true, mtime: h.ModTime}
			return nil
		case tar.TypeSymlink:
			// The target, absolute ones included, is stored as is: validate
			// lets no member pass through a symlink, and root would refuse
			// to follow one out of dir anyway.
			if err := root.Symlink(h.Linkname, e.Name); err != nil {
				return err
			}
			return owner(e.Name, h)
		case tar.TypeLink:
			return root.Link(e.Linkname, e.Name)
		}
		out, err := root.OpenFile(e.Name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			return err
		}
		_, err = io.Copy(out, r)
		if cerr := out.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return err
		}
		// chown before chmod: chown clears setuid/setgid.
		if err := owner(e.Name, h); err != nil {
			return err
		}
		if err := root.Chmod(e.Name, mode); err != nil {
			return err
		}
		return root.Chtimes(e.Name, h.ModTime, h.ModTime)
	})
	if err != nil {
		if errors.Is(err, ErrBadArchive) || errors.Is(err, ErrUnsafePath) {
			return err
		}
		return fmt.Errorf("contextstore: extracting: %w", err)
	}

	names := make([]string, 0, len(dirs))
	for n := range dirs {
		names = append(names, n)
	}
	sort.Slice(names, func(i, j int) bool {
		if di, dj := strings.Count(names[i], "/"), strings.Count(names[j], "/"); di != dj {
			return di > dj
		}
		return names[i] < names[j]
	})
	for _, n := range names {
		m := dirs[n]
		if asRoot && m.owned {
			if err := root.Lchown(n, m.uid, m.gid); err != nil {
				return fmt.Errorf("contextstore: extracting: %w", err)
			}
		}
		if err := root.Chmod(n, m.mode); err != nil {
			return fmt.Errorf("contextstore: extracting: %w", err)
		}
		if !m.mtime.IsZero() {
			if err := root.Chtimes(n, m.mtime, m.mtime); err != nil {
				return fmt.Errorf("contextstore: extracting: %w", err)
			}
		}
	}
	return nil
}

// removeTree is os.RemoveAll that first makes directories writable, since
// an extracted tree may contain read-only ones.
func removeTree(dir string) error {
	_ = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			_ = os.Chmod(p, 0o700)
		}
		return nil
	})
	return os.RemoveAll(dir)
}
