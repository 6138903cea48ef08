package oci

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cubicle-dev/cubicle/internal/diskimage"
	"github.com/cubicle-dev/cubicle/internal/diskstore"
	"github.com/cubicle-dev/cubicle/internal/runtime"
)

var _ runtime.Snapshotter = (*Driver)(nil)

// stoppedMarker marks a sandbox stopped by Stop (a filesystem pause): no
// runtime container, files and mounts kept.
func (d *Driver) stoppedMarker(id string) string { return filepath.Join(d.priv(id), "stopped") }

// MemorySnapshots implements runtime.Snapshotter: gVisor checkpoints
// itself; runc and crun would need CRIU, which cannot run on every host
// (Debian 12's 3.17 fails `criu check` on these kernels), so their
// snapshots are filesystem snapshots.
func (d *Driver) MemorySnapshots() bool { return d.cfg.Runtime == "runsc" }

// Snapshot implements runtime.Snapshotter.
//
// runc/crun: the container is frozen (cgroup freezer) while its upper dir
// is copied, then thawed, so the copy is one instant of its files.
// runsc: the sandbox is paused, checkpointed with --leave-running (which
// also flushes the sentry's file caches to the upper dir), its upper dir
// copied, and resumed. A sandbox paused with its memory kept is copied as
// it is (runsc: its checkpoint image is hard-linked, never rewritten).
func (d *Driver) Snapshot(ctx context.Context, id, dst string, memory bool) (_ runtime.SnapshotInfo, err error) {
	unlock := d.lock(id)
	defer unlock()
	info, err := d.inspectLocked(ctx, id)
	if err != nil {
		return runtime.SnapshotInfo{}, err
	}
	if err := os.Mkdir(dst, 0o700); err != nil {
		return runtime.SnapshotInfo{}, err
	}
	defer func() {
		if err != nil {
			os.RemoveAll(dst)
		}
	}()
	out := runtime.SnapshotInfo{Kind: runtime.SnapshotFilesystem, Layer: filepath.Join(dst, "rootfs")}
	_, stopped := statOK(d.stoppedMarker(id))
	memory = memory && d.MemorySnapshots() && !stopped
	// release lets go of a sandbox this call holds still; it runs once,
	// after the copy or as soon as a clone of the disk stands in for it.
	var release func() error
	defer func() {
		if release != nil {
			if rerr := release(); rerr != nil {
				err = errors.Join(err, rerr)
			}
		}
	}()
	disk := d.storeDisk(id)
	if info.State == runtime.StateRunning && !stopped && disk != "" {
		// Most of what the sandbox has not yet written out goes before it
		// is held; the sync while held (cloneDisk) then has little left.
		if err := d.syncDisk(id); err != nil {
			return runtime.SnapshotInfo{}, err
		}
	}
	switch {
	case info.State == runtime.StateStopped:
		return runtime.SnapshotInfo{}, fmt.Errorf("%w: %s is stopped", runtime.ErrNotRunning, id)
	case stopped:
	case d.cfg.Runtime == "runsc" && info.State == runtime.StatePaused && d.cfg.RunscPauseMode == "checkpoint":
		// Checkpointed by Pause: the image is already on disk.
		if memory {
			out.Checkpoint = filepath.Join(dst, "checkpoint")
			if err := linkTree(d.checkpointDir(id), out.Checkpoint); err != nil {
				return runtime.SnapshotInfo{}, err
			}
		}
	case info.State == runtime.StatePaused:
		// Frozen by Pause: nothing runs, the files hold still.
	case d.cfg.Runtime == "runsc":
		if _, err := d.run(ctx, "pause", id); err != nil {
			return runtime.SnapshotInfo{}, err
		}
		release = func() error {
			if st, ok, _ := d.state(context.WithoutCancel(ctx), id); ok && st.Status == "paused" {
				_, err := d.run(context.WithoutCancel(ctx), "resume", id)
				return err
			}
			return nil
		}
		img := filepath.Join(dst, "checkpoint")
		if err := os.Mkdir(img, 0o700); err != nil {
			return runtime.SnapshotInfo{}, err
		}
		if err := d.checkpointFits(id, img); err != nil {
			return runtime.SnapshotInfo{}, err
		}
		if _, err := d.run(ctx, "checkpoint", "--leave-running", "--image-path", img, id); err != nil {
			return runtime.SnapshotInfo{}, err
		}
		if memory {
			out.Checkpoint = img
		}
		// The checkpoint resumed the kernel: hold it again while the
		// files are read, so they match the image.
		if st, ok, _ := d.state(ctx, id); ok && st.Status == "running" {
			if _, err := d.run(ctx, "pause", id); err != nil {
				return runtime.SnapshotInfo{}, err
			}
		}
	default:
		if _, err := d.run(ctx, "pause", id); err != nil {
			return runtime.SnapshotInfo{}, err
		}
		release = func() error {
			_, err := d.run(context.WithoutCancel(ctx), "resume", id)
			return err
		}
	}
	var shift uint32
	_, zeroBased := statOK(d.upperIdmapped(id))
	zeroBased = zeroBased || !d.userns()
	if !zeroBased {
		d.mu.Lock()
		slot, ok := d.slots[id]
		d.mu.Unlock()
		if ok {
			shift = slotBase(slot)
		}
	}
	src := d.UpperDir(id)
	if disk != "" && zeroBased && d.layersBesideStore(dst) {
		// The layer is a clone of the disk: nothing is copied.
		n, deep, cerr := d.snapshotClone(ctx, id, disk, dst, &release)
		if cerr != nil {
			return runtime.SnapshotInfo{}, cerr
		}
		if !deep {
			return d.snapshotDone(out, n), nil
		}
		// Too deep to clean in place: copied, from the clone.
		clone := d.layerImage(dst)
		defer func() {
			err = errors.Join(err, unmountLayerDisk(dst), diskimage.Release(clone), removeIfExists(clone))
		}()
		src = filepath.Join(dst, ".disk", "upper")
	}
	if release != nil && disk != "" {
		// A sandbox held for the copy runs again as soon as its disk is
		// cloned (a reflink store: milliseconds whatever it wrote); the
		// copy reads the clone.
		upper, drop, err := d.cloneDisk(ctx, id, disk)
		if err != nil {
			return runtime.SnapshotInfo{}, err
		}
		defer func() {
			if derr := drop(); derr != nil {
				err = errors.Join(err, derr)
			}
		}()
		src = upper
		r := release
		release = nil
		if err := r(); err != nil {
			return runtime.SnapshotInfo{}, err
		}
	}
	n, err := copyLayer(src, out.Layer, shift, d.snapshotBudget(id, dst))
	if errors.Is(err, runtime.ErrSnapshotTooLarge) {
		return runtime.SnapshotInfo{}, err
	}
	if err != nil {
		return runtime.SnapshotInfo{}, fmt.Errorf("oci: snapshot %s: copy writable layer: %w", id, err)
	}
	return d.snapshotDone(out, n), nil
}

// snapshotDone completes out, whose layer takes n bytes: its kind and
// size, and the checkpoint dir of a runsc snapshot that keeps no memory
// removed.
func (d *Driver) snapshotDone(out runtime.SnapshotInfo, n int64) runtime.SnapshotInfo {
	if out.Checkpoint != "" {
		out.Kind = runtime.SnapshotMemory
		n += dirBytes(out.Checkpoint)
	} else {
		os.RemoveAll(filepath.Join(filepath.Dir(out.Layer), "checkpoint"))
	}
	out.SizeBytes = n
	return out
}

// storeDisk is id's disk image when it lives in the reflink store, where a
// snapshot can clone it; "" otherwise (no store, no disk limit, or an
// image made before the store, in the private dir).
func (d *Driver) storeDisk(id string) string {
	if p := d.cfg.Disks.Path(id); p != "" && p == d.DiskImage(id) {
		return p
	}
	return ""
}

// cloneDisk clones a held sandbox's disk image img (storeDisk) and mounts
// the clone read-only, for a snapshot to copy from once the sandbox runs
// again: it returns the clone's upper dir and what takes it down.
func (d *Driver) cloneDisk(ctx context.Context, id, img string) (upper string, drop func() error, err error) {
	// The disk's dirty pages reach the image file before it is cloned;
	// nothing writes meanwhile (the sandbox is held).
	if err := d.syncDisk(id); err != nil {
		return "", nil, err
	}
	clone := d.cfg.Disks.Scratch(id + "-" + strconv.FormatInt(time.Now().UnixNano(), 36))
	if err := diskstore.Clone(img, clone); err != nil {
		return "", nil, fmt.Errorf("oci: snapshot %s: clone disk: %w", id, err)
	}
	// In the root-only private dir: nothing the sandbox's uid can swap
	// for a link between the mkdir and the mount. A delete meeting a
	// crashed snapshot unmounts it (destroy).
	mnt := d.snapshotDiskMount(id)
	drop = func() error {
		return errors.Join(diskimage.Release(clone), os.Remove(clone), os.Remove(mnt))
	}
	if err := os.Mkdir(mnt, 0o700); err != nil {
		return "", nil, errors.Join(fmt.Errorf("oci: snapshot %s: %w", id, err), os.Remove(clone))
	}
	if err := diskimage.MountReadOnly(ctx, clone, mnt); err != nil {
		return "", nil, errors.Join(err, drop())
	}
	return filepath.Join(mnt, "upper"), drop, nil
}

// snapshotDiskMount is where a snapshot mounts the clone it copies from.
func (d *Driver) snapshotDiskMount(id string) string {
	return filepath.Join(d.priv(id), "snapshot-disk")
}

// syncDisk writes id's disk's dirty pages to its image (loop devices do
// direct I/O, so they land in the image file, not in a cache above it).
func (d *Driver) syncDisk(id string) error {
	dfd, err := unix.Open(d.diskDir(id), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
	if err != nil {
		return fmt.Errorf("oci: snapshot %s: %w", id, err)
	}
	defer unix.Close(dfd)
	if err := unix.Syncfs(dfd); err != nil {
		return fmt.Errorf("oci: snapshot %s: syncfs: %w", id, err)
	}
	return nil
}

// checkpointFits refuses a runsc checkpoint of id into dir that dir's
// filesystem cannot hold, before runsc fills it: gVisor writes the memory
// the sandbox uses, which its cgroup counts (memory.current: the sentry's
// memory file included). That is an upper bound (the image is compressed),
// so a checkpoint it admits does not fail for space.
func (d *Driver) checkpointFits(id, dir string) error {
	st, err := readStats(d.cfg.CgroupParent, id)
	if err != nil {
		return nil // unmeasured: runsc tries, and its failure is the answer
	}
	var fs unix.Statfs_t
	if err := unix.Statfs(dir, &fs); err != nil {
		return err
	}
	free := int64(fs.Bavail) * fs.Bsize
	if need := int64(st.MemoryBytes); need > free {
		return fmt.Errorf("%w: its memory image may take %d MiB (the memory it uses), more than what the snapshot store has free (%d MiB)",
			runtime.ErrSnapshotTooLarge, (need+1<<20-1)>>20, free>>20)
	}
	return nil
}

// snapshotBudget is what the copy of id's layer into dst may take: the
// sandbox's disk size, or what dst's filesystem has free when that is less
// (sparse disk images overcommit the host: a copy must not fill it).
func (d *Driver) snapshotBudget(id, dst string) budget {
	b := budget{bytes: d.diskBytes(id), what: "the sandbox's disk size"}
	var fs unix.Statfs_t
	if err := unix.Statfs(dst, &fs); err == nil {
		if free := int64(fs.Bavail) * fs.Bsize; b.bytes == 0 || free < b.bytes {
			b = budget{bytes: max(free, 1), what: "what the snapshot store has free"}
		}
	}
	return b
}

// Stop implements runtime.Snapshotter.
func (d *Driver) Stop(ctx context.Context, id string) error {
	unlock := d.lock(id)
	defer unlock()
	info, err := d.inspectLocked(ctx, id)
	if err != nil {
		return err
	}
	if _, stopped := statOK(d.stoppedMarker(id)); stopped {
		return fmt.Errorf("%w: %s is already stopped", runtime.ErrNotRunning, id)
	}
	if info.State == runtime.StateStopped {
		return fmt.Errorf("%w: %s is stopped", runtime.ErrNotRunning, id)
	}
	if st, exists, err := d.state(ctx, id); err != nil {
		return err
	} else if exists {
		if err := d.removeContainer(ctx, id, st.Status); err != nil {
			return err
		}
	}
	d.abortHostConns(id)
	// A memory pause's image is of no use once the sandbox will reboot.
	if err := os.RemoveAll(d.checkpointDir(id)); err != nil {
		return err
	}
	if err := removeCgroups(d.cfg.CgroupParent, id); err != nil {
		return err
	}
	return os.WriteFile(d.stoppedMarker(id), nil, 0o600)
}

// start boots a stopped sandbox's container again from its bundle.
func (d *Driver) startStopped(ctx context.Context, id string) error {
	if d.cfg.Runtime == "runsc" {
		if err := d.restoreNetnsFor(id); err != nil {
			return err
		}
	}
	if d.userns() {
		if err := d.restageMounts(id); err != nil {
			return err
		}
	}
	if err := d.runContainer(ctx, id, nil); err != nil {
		// run removes what it made when it fails; a half-made container
		// left by a killed run is removed here.
		_, _ = d.run(context.WithoutCancel(ctx), "delete", "--force", id)
		return err
	}
	return os.Remove(d.stoppedMarker(id))
}

// linkTree recreates src's tree at dst with hard links to its files (a
// checkpoint image is written once and only ever read).
func linkTree(src, dst string) error {
	return filepath.WalkDir(src, func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		t := filepath.Join(dst, rel)
		switch {
		case e.IsDir():
			return os.Mkdir(t, 0o700)
		case e.Type().IsRegular():
			return os.Link(p, t)
		default:
			return fmt.Errorf("oci: unexpected %s in checkpoint image", p)
		}
	})
}

func statOK(p string) (os.FileInfo, bool) {
	fi, err := os.Stat(p)
	return fi, err == nil
}
