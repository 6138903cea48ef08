// Package diskstore holds the sandboxes' disk images on a filesystem that
// clones files (reflink), so a sandbox's disk is a copy of one formatted
// blank image, made in a few hundred microseconds, instead of an image
// formatted at every create.
//
// The per-sandbox ext4 image stays what it was (internal/diskimage): its
// size is the sandbox's disk limit, a write past it fails with ENOSPC, and
// `df` in the sandbox reports it. Only where the image comes from changes.
// A clone shares the blank's extents until the sandbox writes, so it costs
// the host nothing up front.
//
// The store is Dir when Dir's filesystem already clones (XFS with reflink,
// btrfs); otherwise an XFS image made once at Image and mounted on Dir.
// A host that has neither (no xfs in the kernel, no mkfs.xfs, no loop
// mount) falls back to formatting each image at create ("images"), which
// works on any filesystem with loop devices.
package diskstore

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/cubicle-dev/cubicle/internal/diskimage"
)

// Kind is how a store makes disk images.
type Kind string

const (
	// Reflink: clones of a formatted blank on a filesystem that clones.
	Reflink Kind = "reflink"
	// Images: each image is made and formatted at create.
	Images Kind = "images"
)

// Mode is what the operator asked for (serve --disk-store).
type Mode string

const (
	// Auto uses reflink where the host can and images otherwise.
	Auto Mode = "auto"
	// ModeReflink requires reflink; Open fails where the host cannot.
	ModeReflink Mode = "reflink"
	// ModeImages always formats each image (today's fallback).
	ModeImages Mode = "images"
)

// ParseMode reads --disk-store.
func ParseMode(s string) (Mode, error) {
	switch m := Mode(s); m {
	case Auto, ModeReflink, ModeImages:
		return m, nil
	}
	return "", fmt.Errorf("disk store %q: want auto, reflink or images", s)
}

// ErrUnsupported is returned by Open in ModeReflink where the host cannot
// clone files.
var ErrUnsupported = errors.New("diskstore: reflink storage unsupported on this host")

// Config configures Open.
type Config struct {
	// Dir holds the disk images (root only). Required, absolute.
	Dir string
	// Image is the XFS image made and mounted on Dir when Dir's
	// filesystem does not clone; "" never makes one.
	Image string
	// ImageBytes is Image's (sparse) size; 0: the size of the filesystem
	// Image is on, so the store never runs out before its host does.
	ImageBytes int64
	// Mode; default Auto.
	Mode Mode
	// Filesystems is the kernel's list of filesystems; default
	// /proc/filesystems.
	Filesystems string
	// MkfsXFS is the mkfs.xfs binary; default looked up in PATH.
	MkfsXFS string
}

// Store makes disk images. Safe for concurrent use.
type Store struct {
	kind   Kind
	dir    string
	reason string

	mountedHere bool // Open mounted the store image (Release undoes it)

	mu     sync.Mutex
	blanks map[int]*blank
	tick   uint64
}

type blank struct {
	once  sync.Once
	err   error
	users int    // Creates cloning it now (under Store.mu)
	used  uint64 // Store.tick at its last use
}

// Open chooses how disk images are made and prepares the store. In Auto
// mode, anything that keeps reflink from working is a reason for the
// Images fallback (Reason), not an error.
func Open(ctx context.Context, cfg Config) (*Store, error) {
	if cfg.Mode == "" {
		cfg.Mode = Auto
	}
	if _, err := ParseMode(string(cfg.Mode)); err != nil {
		return nil, err
	}
	if !filepath.IsAbs(cfg.Dir) {
		return nil, fmt.Errorf("diskstore: dir %q is not absolute", cfg.Dir)
	}
	s := &Store{dir: filepath.Clean(cfg.Dir), blanks: map[int]*blank{}}
	if cfg.Mode == ModeImages {
		s.kind, s.reason = Images, "--disk-store images"
		return s, nil
	}
	mounted, err := prepare(ctx, cfg)
	if err == nil {
		s.kind, s.mountedHere = Reflink, mounted
		return s, nil
	}
	if cfg.Mode == ModeReflink || !errors.Is(err, ErrUnsupported) {
		return nil, err
	}
	s.kind, s.reason = Images, err.Error()
	return s, nil
}

// prepare makes Dir a directory that clones files: as it is, or with the
// store image mounted on it (mounted: by this call). ErrUnsupported says
// the host cannot; on any error nothing stays mounted.
func prepare(ctx context.Context, cfg Config) (mounted bool, err error) {
	if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
		return false, fmt.Errorf("diskstore: %w", err)
	}
	if err := os.Chmod(cfg.Dir, 0o700); err != nil {
		return false, fmt.Errorf("diskstore: %w", err)
	}
	if err := probeClone(cfg.Dir); err == nil {
		return false, prepareDirs(cfg.Dir)
	} else if cfg.Image == "" {
		return false, fmt.Errorf("%w: %s cannot clone files (%v) and no store image is configured", ErrUnsupported, cfg.Dir, err)
	}
	if err := mountImage(ctx, cfg); err != nil {
		return false, err
	}
	if err := probeClone(cfg.Dir); err != nil {
		err = fmt.Errorf("diskstore: the store image mounted on %s cannot clone files: %w", cfg.Dir, err)
		return false, errors.Join(err, unix.Unmount(cfg.Dir, 0))
	}
	if err := prepareDirs(cfg.Dir); err != nil {
		return false, errors.Join(err, unix.Unmount(cfg.Dir, 0))
	}
	return true, nil
}

func prepareDirs(dir string) error {
	for _, sub := range []string{"disks", "layers", ".blank", ".scratch"} {
		if err := os.MkdirAll(filepath.Join(dir, sub), 0o700); err != nil {
			return fmt.Errorf("diskstore: %w", err)
		}
	}
	// Scratch clones are a snapshot's while it copies; one left here
	// belonged to a process that is gone.
	ents, err := os.ReadDir(filepath.Join(dir, ".scratch"))
	if err != nil {
		return fmt.Errorf("diskstore: %w", err)
	}
	for _, e := range ents {
		p := filepath.Join(dir, ".scratch", e.Name())
		if err := diskimage.Release(p); err != nil {
			return fmt.Errorf("diskstore: %w", err)
		}
		if err := os.Remove(p); err != nil {
			return fmt.Errorf("diskstore: %w", err)
		}
	}
	return nil
}

// mountImage makes cfg.Image (once) and mounts it on cfg.Dir.
func mountImage(ctx context.Context, cfg Config) error {
	if ok, err := kernelHas(cfg.Filesystems, "xfs"); err != nil {
		return fmt.Errorf("%w: %v", ErrUnsupported, err)
	} else if !ok {
		return fmt.Errorf("%w: the kernel has no xfs", ErrUnsupported)
	}
	img := filepath.Clean(cfg.Image)
	// Never mount one image twice: two XFS superblocks over one file
	// corrupt it. An image attached to a loop device that is not mounted
	// here (a store detached while a sandbox disk still used it) is left
	// alone, and so is the fallback.
	if devs := diskimage.LoopsOf(img); len(devs) > 0 {
		return fmt.Errorf("%w: the store image %s is attached to %v but not mounted on %s; unmount it (or remove the loop devices) to use reflink storage",
			ErrUnsupported, img, devs, cfg.Dir)
	}
	if _, err := os.Stat(img); errors.Is(err, fs.ErrNotExist) {
		if err := makeImage(ctx, cfg, img); err != nil {
			return err
		}
	} else if err != nil {
		return fmt.Errorf("diskstore: %w", err)
	}
	// discard: a deleted sandbox disk's blocks go back to the host.
	if out, err := exec.CommandContext(ctx, "mount", "-t", "xfs", "-o", "loop,noatime,nosuid,nodev,discard", img, cfg.Dir).CombinedOutput(); err != nil {
		return fmt.Errorf("%w: mount the store image %s on %s: %v: %s", ErrUnsupported, img, cfg.Dir, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// makeImage formats a sparse XFS image with reflink at img, through a
// temporary name so a crash leaves no half-made store.
func makeImage(ctx context.Context, cfg Config, img string) error {
	mkfs := cfg.MkfsXFS
	if mkfs == "" {
		mkfs = "mkfs.xfs"
	}
	bin, err := exec.LookPath(mkfs)
	if err != nil {
		return fmt.Errorf("%w: %v (Debian: apt-get install xfsprogs)", ErrUnsupported, err)
	}
	size := cfg.ImageBytes
	if size <= 0 {
		var st unix.Statfs_t
		if err := unix.Statfs(filepath.Dir(img), &st); err != nil {
			return fmt.Errorf("diskstore: %w", err)
		}
		size = int64(st.Blocks) * st.Bsize
	}
	tmp := img + ".new"
	_ = os.Remove(tmp)
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("diskstore: %w", err)
	}
	err = f.Truncate(size)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("diskstore: %w", err)
	}
	// The smallest log mkfs takes (64 MiB): the image's metadata is
	// written at once, and sandbox disks are few large files.
	if out, err := exec.CommandContext(ctx, bin, "-q", "-m", "reflink=1", "-l", "size=64m", tmp).CombinedOutput(); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("%w: mkfs.xfs: %v: %s", ErrUnsupported, err, strings.TrimSpace(string(out)))
	}
	if err := os.Rename(tmp, img); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("diskstore: %w", err)
	}
	return nil
}

// kernelHas reports whether the kernel lists filesystem name.
func kernelHas(list, name string) (bool, error) {
	if list == "" {
		list = "/proc/filesystems"
	}
	f, err := os.Open(list)
	if err != nil {
		return false, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) > 0 && fields[len(fields)-1] == name {
			return true, nil
		}
	}
	return false, sc.Err()
}

// probeClone clones a small file in dir and removes both.
func probeClone(dir string) error {
	src, err := os.CreateTemp(dir, ".probe-")
	if err != nil {
		return err
	}
	defer os.Remove(src.Name())
	defer src.Close()
	if _, err := src.Write(make([]byte, 4096)); err != nil {
		return err
	}
	dst := src.Name() + ".clone"
	defer os.Remove(dst)
	return Clone(src.Name(), dst)
}

// Clone makes dst (which must not exist) a copy of src that shares its
// extents. On error dst is removed.
func Clone(src, dst string) (err error) {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := out.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			os.Remove(dst)
		}
	}()
	if err := unix.IoctlFileClone(int(out.Fd()), int(in.Fd())); err != nil {
		return &os.LinkError{Op: "clone", Old: src, New: dst, Err: err}
	}
	return nil
}

// Release unmounts the store image when Open mounted it: for a server
// whose start failed after Open, so a refused start leaves no mount. A
// store in use (a disk mounted from it) stays; so does one that was
// mounted before Open (a restarted server's running sandboxes use it).
func (s *Store) Release() error {
	if s == nil || !s.mountedHere {
		return nil
	}
	if err := unix.Unmount(s.dir, 0); err != nil && !errors.Is(err, unix.EBUSY) {
		return fmt.Errorf("diskstore: unmount %s: %w", s.dir, err)
	}
	s.mountedHere = false
	return nil
}

// Kind is how this store makes images.
func (s *Store) Kind() Kind { return s.kind }

// Reason says why a store in Auto mode fell back to Images ("" otherwise).
func (s *Store) Reason() string { return s.reason }

// Dir is where the store keeps images.
func (s *Store) Dir() string { return s.dir }

// Path is where the disk image called name (a sandbox ID) lives in a
// Reflink store; "" for an Images store, whose images live with their
// owners.
func (s *Store) Path(name string) string {
	if s == nil || s.kind != Reflink {
		return ""
	}
	return filepath.Join(s.DisksDir(), name+".img")
}

// DisksDir holds a Reflink store's disk images, nothing else; "" for an
// Images store.
func (s *Store) DisksDir() string {
	if s == nil || s.kind != Reflink {
		return ""
	}
	return filepath.Join(s.dir, "disks")
}

// Layer is where a snapshot called name keeps its layer in a Reflink
// store, as a clone of the disk it was taken from; "" for an Images
// store.
func (s *Store) Layer(name string) string {
	if s == nil || s.kind != Reflink {
		return ""
	}
	return filepath.Join(s.dir, "layers", name+".img")
}

// Scratch is a path in a Reflink store for a short-lived clone called
// name (a snapshot's copy source); "" for an Images store. What is left
// there is removed at the next Open.
func (s *Store) Scratch(name string) string {
	if s == nil || s.kind != Reflink {
		return ""
	}
	return filepath.Join(s.dir, ".scratch", name+".img")
}

// Create makes a formatted ext4 image of sizeMB MiB at path (which must
// not exist): a clone of the blank of that size in a Reflink store (path
// must then be in it, see Path), a freshly formatted image otherwise. On
// error nothing is left at path.
func (s *Store) Create(ctx context.Context, path string, sizeMB int) error {
	if s == nil || s.kind != Reflink {
		return diskimage.Create(ctx, path, sizeMB)
	}
	if sizeMB <= 0 {
		return fmt.Errorf("diskstore: size %d MiB is not positive", sizeMB)
	}
	b, p, err := s.blank(ctx, sizeMB)
	if err != nil {
		return err
	}
	err = Clone(p, path)
	s.mu.Lock()
	b.users--
	s.mu.Unlock()
	if err != nil {
		return fmt.Errorf("diskstore: %w", err)
	}
	return nil
}

// MaxBlanks is how many blanks (one per disk size) a store keeps. Sizes
// come from templates, which tenants build; past this the least recently
// used blank not being cloned is removed (its clones keep their extents).
const MaxBlanks = 16

// blank is the formatted image of sizeMB that disks of that size clone,
// made at its first use and kept; the caller holds it (users) until its
// clone is made. A failed make is retried at the next.
func (s *Store) blank(ctx context.Context, sizeMB int) (*blank, string, error) {
	p := s.blankPath(sizeMB)
	s.mu.Lock()
	b := s.blanks[sizeMB]
	s.tick++
	if b == nil {
		// Held before eviction runs, so the new entry is never its victim.
		b = &blank{users: 1, used: s.tick}
		s.blanks[sizeMB] = b
		s.evictLocked()
	} else {
		b.users++
		b.used = s.tick
	}
	s.mu.Unlock()
	b.once.Do(func() {
		if _, err := os.Stat(p); err == nil {
			return // made by an earlier run
		}
		tmp := p + ".new"
		_ = os.Remove(tmp)
		if err := diskimage.Create(ctx, tmp, sizeMB); err != nil {
			b.err = err
			return
		}
		b.err = os.Rename(tmp, p)
	})
	if b.err != nil {
		s.mu.Lock()
		b.users--
		if s.blanks[sizeMB] == b {
			delete(s.blanks, sizeMB)
		}
		s.mu.Unlock()
		return nil, "", fmt.Errorf("diskstore: blank image of %d MiB: %w", sizeMB, b.err)
	}
	return b, p, nil
}

func (s *Store) blankPath(sizeMB int) string {
	return filepath.Join(s.dir, ".blank", strconv.Itoa(sizeMB)+".img")
}

// evictLocked removes the least recently used idle blanks past MaxBlanks,
// and blank files on disk that no entry holds (an earlier run's).
func (s *Store) evictLocked() {
	for len(s.blanks) > MaxBlanks {
		victim, oldest := -1, uint64(0)
		for size, b := range s.blanks {
			if b.users == 0 && (victim < 0 || b.used < oldest) {
				victim, oldest = size, b.used
			}
		}
		if victim < 0 {
			return // all being cloned: the next make evicts
		}
		delete(s.blanks, victim)
		_ = os.Remove(s.blankPath(victim))
	}
	if ents, err := os.ReadDir(filepath.Join(s.dir, ".blank")); err == nil && len(ents) > MaxBlanks {
		for _, e := range ents {
			name, ok := strings.CutSuffix(e.Name(), ".img")
			if !ok {
				continue // a blank being made (.img.new)
			}
			if size, err := strconv.Atoi(name); err != nil || s.blanks[size] == nil {
				_ = os.Remove(filepath.Join(s.dir, ".blank", e.Name()))
			}
		}
	}
}
