package oci

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/cubicle-dev/cubicle/internal/diskimage"
	"github.com/cubicle-dev/cubicle/internal/diskstore"
	"github.com/cubicle-dev/cubicle/internal/runtime"
)

// A snapshot of a sandbox whose disk is in the reflink store and whose
// upper is stored 0-based is a clone of that disk (a layer disk): cloning
// is metadata, so the snapshot takes milliseconds whatever the sandbox
// wrote, and its forks share the extents. The clone's upper dir, cleaned
// of what a lower layer must not carry (layerClean), is bind-mounted
// read-only as <dst>/rootfs; <dst>/layer-disk marks the snapshot so that
// OpenSnapshot mounts it again after a reboot and DeleteSnapshot removes
// the clone.

// layerDiskMarker names the file that marks a snapshot dir whose layer is
// a clone in the store.
const layerDiskMarker = "layer-disk"

// layerMountMu serialises mounting and unmounting snapshot layers, so two
// creates from one snapshot after a reboot mount it once.
var layerMountMu sync.Mutex

// errLayerTooDeep: the tree is deeper than layerClean walks; the snapshot
// copies the layer instead (copyLayer takes any depth).
var errLayerTooDeep = errors.New("oci: layer deeper than a clone is cleaned")

// maxCleanDepth bounds layerClean's descriptors (one per level).
const maxCleanDepth = 256

// layersBesideStore reports whether a snapshot at dst may be a clone in
// the store: the snapshot dir is on the filesystem that holds the store
// (the data dir's), so its bytes stay where the operator put snapshots. A
// snapshot dir mounted elsewhere gets copies.
func (d *Driver) layersBesideStore(dst string) bool {
	var a, b unix.Stat_t
	if d.cfg.Disks.Layer("x") == "" ||
		unix.Stat(filepath.Dir(dst), &a) != nil || unix.Stat(filepath.Dir(d.cfg.Disks.Dir()), &b) != nil {
		return false
	}
	return a.Dev == b.Dev
}

// layerImage is the store path of the clone behind snapshot dir dst.
func (d *Driver) layerImage(dst string) string { return d.cfg.Disks.Layer(filepath.Base(dst)) }

// snapshotClone makes the layer of a snapshot at dst a clone of id's
// store disk img: cloned while the sandbox is held, *release (when set)
// called and cleared as soon as the clone exists, then cleaned, mounted
// and marked. It returns the layer's bytes. deep means the tree is too
// deep to clean in place: the clone is left mounted read-only at
// dst/.disk for the caller to copy from. On error nothing is left.
func (d *Driver) snapshotClone(ctx context.Context, id, img, dst string, release *func() error) (n int64, deep bool, err error) {
	clone, err := d.cloneLayer(ctx, id, img, dst)
	if err != nil {
		return 0, false, err
	}
	if r := *release; r != nil {
		*release = nil
		if err := r(); err != nil {
			return 0, false, errors.Join(err, removeIfExists(clone))
		}
	}
	n, err = mountLayer(ctx, clone, dst, true)
	if errors.Is(err, errLayerTooDeep) {
		return 0, true, nil
	}
	if err != nil {
		return 0, false, errors.Join(err, diskimage.Release(clone), removeIfExists(clone))
	}
	// The clone is free when taken, but keeps its blocks when the source
	// rewrites them: it is bounded like a copy.
	if b := d.snapshotBudget(id, dst); b.bytes > 0 && n > b.bytes {
		err = fmt.Errorf("%w: its files take more than %d bytes, %s", runtime.ErrSnapshotTooLarge, b.bytes, b.what)
		return 0, false, errors.Join(err, d.dropLayerDisk(dst))
	}
	if err := os.WriteFile(filepath.Join(dst, layerDiskMarker), nil, 0o600); err != nil {
		return 0, false, errors.Join(err, d.dropLayerDisk(dst))
	}
	return n, false, nil
}

// cloneLayer clones id's store disk img into the snapshot dir dst's layer
// image, for a held sandbox (its dirty pages are synced first).
func (d *Driver) cloneLayer(ctx context.Context, id, img, dst string) (string, error) {
	if err := d.syncDisk(id); err != nil {
		return "", err
	}
	clone := d.layerImage(dst)
	// One left by a crash before its snapshot dir was made is not in use.
	if err := errors.Join(diskimage.Release(clone), removeIfExists(clone)); err != nil {
		return "", err
	}
	if err := diskstore.Clone(img, clone); err != nil {
		return "", fmt.Errorf("oci: snapshot %s: clone disk: %w", id, err)
	}
	return clone, nil
}

// mountLayer mounts the layer image clone at dst/rootfs: the image is
// mounted read-write at dst/.disk (the journal of a clone of a mounted
// disk is replayed there), cleaned when clean is set, made read-only, and
// its upper dir bound at dst/rootfs; dst/.disk is then unmounted. It
// returns the bytes the layer allocates when clean is set. On
// errLayerTooDeep the read-only image stays mounted at dst/.disk for the
// caller to copy from (unmountLayerDisk).
func mountLayer(ctx context.Context, clone, dst string, clean bool) (n int64, err error) {
	mnt := filepath.Join(dst, ".disk")
	if err := os.Mkdir(mnt, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return 0, err
	}
	if err := diskimage.Mount(ctx, clone, mnt); err != nil {
		os.Remove(mnt)
		return 0, err
	}
	keep := false
	defer func() {
		if !keep {
			err = errors.Join(err, unmountLayerDisk(dst))
		}
	}()
	upper := filepath.Join(mnt, "upper")
	var cleanErr error
	if clean {
		n, cleanErr = layerClean(upper)
		if cleanErr != nil && !errors.Is(cleanErr, errLayerTooDeep) {
			return 0, cleanErr
		}
	}
	// Read-only from here on: the superblock, not only this mount, so
	// nothing that reaches the filesystem another way can write it.
	if err := unix.Mount("", mnt, "", unix.MS_REMOUNT|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOATIME, ""); err != nil {
		return 0, fmt.Errorf("oci: remount layer read-only: %w", err)
	}
	if cleanErr != nil {
		keep = true
		return 0, cleanErr
	}
	root := filepath.Join(dst, "rootfs")
	if err := os.Mkdir(root, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return 0, err
	}
	if err := unix.Mount(upper, root, "", unix.MS_BIND, ""); err != nil {
		return 0, fmt.Errorf("oci: bind layer: %w", err)
	}
	if err := unix.Mount("", root, "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOATIME, ""); err != nil {
		unix.Unmount(root, unix.MNT_DETACH)
		return 0, fmt.Errorf("oci: bind layer read-only: %w", err)
	}
	return n, nil
}

// unmountLayerDisk takes down dst/.disk.
func unmountLayerDisk(dst string) error {
	mnt := filepath.Join(dst, ".disk")
	if err := unmount(mnt); err != nil {
		return err
	}
	return removeIfExists(mnt)
}

// OpenSnapshot implements runtime.Snapshotter: a snapshot whose layer is
// a clone in the store is mounted again when it is not (after a reboot).
func (d *Driver) OpenSnapshot(ctx context.Context, dst string) error {
	if _, ok := statOK(filepath.Join(dst, layerDiskMarker)); !ok {
		return nil
	}
	layerMountMu.Lock()
	defer layerMountMu.Unlock()
	root := filepath.Join(dst, "rootfs")
	if mounted, err := isMountPoint(root); err != nil || mounted {
		return err
	}
	clone := d.layerImage(dst)
	if clone == "" {
		return fmt.Errorf("oci: snapshot %s: its layer is a clone in the reflink disk store, which this server does not use", filepath.Base(dst))
	}
	// Cleaned when it was taken.
	_, err := mountLayer(ctx, clone, dst, false)
	return err
}

// DeleteSnapshot implements runtime.Snapshotter.
// A snapshot a crash cut short has no marker but may have its clone, and
// its layer mounted: the clone is named for the snapshot, so it goes too.
func (d *Driver) DeleteSnapshot(ctx context.Context, dst string) error {
	_, marked := statOK(filepath.Join(dst, layerDiskMarker))
	_, cloned := statOK(d.layerImage(dst))
	if marked || cloned {
		layerMountMu.Lock()
		err := d.dropLayerDisk(dst)
		layerMountMu.Unlock()
		if err != nil {
			return err
		}
	}
	return os.RemoveAll(dst)
}

// dropLayerDisk unmounts a layer disk and removes its image. Sandboxes
// that mounted the layer keep it (overlayfs holds its own reference);
// its blocks are freed when the last of them goes.
func (d *Driver) dropLayerDisk(dst string) error {
	errs := []error{unmountUnder(dst)}
	if clone := d.layerImage(dst); clone != "" {
		errs = append(errs, diskimage.Release(clone), removeIfExists(clone))
	}
	return errors.Join(errs...)
}

// LayerImages lists the snapshots' layer images in the store, for the
// server's free-space budget: each holds blocks its source disk may
// rewrite (then no longer shared).
func (d *Driver) LayerImages() ([]string, error) {
	dir := filepath.Dir(d.cfg.Disks.Layer("x"))
	if dir == "." {
		return nil, nil
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, nil
		}
		return nil, err
	}
	out := make([]string, 0, len(ents))
	for _, e := range ents {
		if strings.HasSuffix(e.Name(), ".img") {
			out = append(out, filepath.Join(dir, e.Name()))
		}
	}
	return out, nil
}

// isMountPoint reports whether p is the root of a mount (a bind of a
// subdir included): its mount ID differs from its parent's.
func isMountPoint(p string) (bool, error) {
	id := func(p string) (uint64, error) {
		var stx unix.Statx_t
		if err := unix.Statx(unix.AT_FDCWD, p, unix.AT_SYMLINK_NOFOLLOW, unix.STATX_MNT_ID, &stx); err != nil {
			return 0, err
		}
		return stx.Mnt_id, nil
	}
	a, err := id(p)
	if err != nil {
		if errors.Is(err, unix.ENOENT) {
			return false, nil
		}
		return false, err
	}
	b, err := id(filepath.Dir(p))
	if err != nil {
		return false, err
	}
	return a != b, nil
}

func removeIfExists(p string) error {
	if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// layerClean makes a clone's upper dir fit to be a lower layer, in place,
// with what copyLayer leaves out removed: sockets and device nodes other
// than overlay whiteouts, and the overlay's bookkeeping xattrs of its
// upper (origin, impure, redirect…; opaque and whiteout stay). The IDs are
// already 0-based. It returns the bytes the layer allocates (what a copy
// would have charged). The walk never follows a symlink and is bounded
// in depth (errLayerTooDeep).
func layerClean(upper string) (int64, error) {
	fd, err := unix.Open(upper, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0, fmt.Errorf("oci: layer: %w", err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return 0, err
	}
	n := st.Blocks * 512
	m, err := cleanDir(fd, 0)
	return n + m, err
}

// cleanDir cleans the entries of the directory open as fd (closing it).
func cleanDir(fd, depth int) (int64, error) {
	defer unix.Close(fd)
	if depth >= maxCleanDepth {
		return 0, errLayerTooDeep
	}
	if err := cleanXattrs(fd, ""); err != nil {
		return 0, err
	}
	names, err := readNames(fd)
	if err != nil {
		return 0, err
	}
	var n int64
	for _, name := range names {
		var st unix.Stat_t
		if err := unix.Fstatat(fd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return 0, fmt.Errorf("oci: layer: stat %s: %w", name, err)
		}
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFDIR:
			sub, err := unix.Openat(fd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
			if err != nil {
				return 0, fmt.Errorf("oci: layer: open %s: %w", name, err)
			}
			m, err := cleanDir(sub, depth+1)
			if err != nil {
				return 0, err
			}
			n += st.Blocks*512 + m
		case unix.S_IFSOCK, unix.S_IFBLK:
			if err := unix.Unlinkat(fd, name, 0); err != nil {
				return 0, fmt.Errorf("oci: layer: remove %s: %w", name, err)
			}
		case unix.S_IFCHR:
			if !isWhiteout(&st) {
				if err := unix.Unlinkat(fd, name, 0); err != nil {
					return 0, fmt.Errorf("oci: layer: remove %s: %w", name, err)
				}
				continue
			}
			if err := cleanXattrs(fd, name); err != nil {
				return 0, err
			}
		default: // regular files, symlinks, fifos
			if err := cleanXattrs(fd, name); err != nil {
				return 0, err
			}
			n += st.Blocks * 512
		}
	}
	return n, nil
}

// cleanXattrs removes the overlay's upper bookkeeping from name in dirfd
// ("" for dirfd itself).
func cleanXattrs(dirfd int, name string) error {
	fd := dirfd
	if name != "" {
		var err error
		if fd, err = unix.Openat(dirfd, name, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0); err != nil {
			return fmt.Errorf("oci: layer: open %s: %w", name, err)
		}
		defer unix.Close(fd)
	}
	p := fdPath(fd)
	names, err := listXattrs(p)
	if err != nil {
		return err
	}
	for _, x := range names {
		if !strings.HasPrefix(x, "trusted.overlay.") || x == "trusted.overlay.opaque" || x == "trusted.overlay.whiteout" {
			continue
		}
		if err := unix.Removexattr(p, x); err != nil && !errors.Is(err, unix.ENODATA) {
			return fmt.Errorf("oci: layer: remove xattr %s of %s: %w", x, name, err)
		}
	}
	return nil
}
