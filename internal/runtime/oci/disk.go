package oci

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/cubicle-dev/cubicle/internal/diskimage"
)

// Each sandbox's writable layer lives on a filesystem of its own: a sparse
// ext4 image of Resources.DiskMB (internal/diskimage, kept in the
// root-only privateDir), loop-mounted at <dir>/disk, holding the overlay's
// upper and work dirs. Writes past the size fail with ENOSPC inside the
// sandbox and never reach the host's disk beyond it; `df` in the sandbox
// reports the image (overlayfs reports its upper filesystem).
//
// With a reflink store (Config.Disks, internal/diskstore) the image is a
// clone of a formatted blank in the store instead of being made and
// formatted here; otherwise it lives in the private dir.
const diskImage = "disk.img"

// diskDir is where the sandbox's upper and work dirs live.
func (d *Driver) diskDir(id string) string { return filepath.Join(d.dir(id), "disk") }

// DiskImage is the path of sandbox id's disk image (absent when the
// sandbox has no disk limit). A sandbox made before the driver had a
// reflink store keeps its image in its private dir.
func (d *Driver) DiskImage(id string) string {
	priv := filepath.Join(d.priv(id), diskImage)
	p := d.cfg.Disks.Path(id)
	if p == "" {
		return priv
	}
	if _, err := os.Lstat(p); errors.Is(err, fs.ErrNotExist) {
		if _, err := os.Lstat(priv); err == nil {
			return priv
		}
	}
	return p
}

// removeDiskImage removes id's image from the reflink store (the private
// dir's goes with that dir).
func (d *Driver) removeDiskImage(id string) error {
	p := d.cfg.Disks.Path(id)
	if p == "" {
		return nil
	}
	if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}

// DiskImages lists the disk images of the sandboxes on disk, by sandbox
// ID, for the server's free-space budget.
func (d *Driver) DiskImages() (map[string]string, error) {
	ents, err := os.ReadDir(d.cfg.SandboxDir)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	out := make(map[string]string, len(ents))
	for _, e := range ents {
		if !e.IsDir() || strings.HasPrefix(e.Name(), ".") {
			continue
		}
		img := d.DiskImage(e.Name())
		if _, err := os.Stat(img); err == nil {
			out[e.Name()] = img
		}
	}
	return out, nil
}

// setupDisk makes <dir>/disk: a mounted image of sizeMB, or a plain
// directory when sizeMB is 0 (no limit). The mount is torn down by
// unmountUnder with the rest of the sandbox's mounts (loop devices that
// mount(8) sets up are auto-cleared on unmount).
func (d *Driver) setupDisk(ctx context.Context, id string, sizeMB int) error {
	mnt := d.diskDir(id)
	if err := os.Mkdir(mnt, 0o700); err != nil {
		return err
	}
	if sizeMB <= 0 {
		return nil
	}
	img := filepath.Join(d.priv(id), diskImage)
	if p := d.cfg.Disks.Path(id); p != "" {
		img = p
		// A crash between this create and its clean-up may have left one.
		if err := d.removeDiskImage(id); err != nil {
			return err
		}
	}
	if err := d.cfg.Disks.Create(ctx, img, sizeMB); err != nil {
		return fmt.Errorf("oci: disk image: %w", err)
	}
	if err := diskimage.Mount(ctx, img, mnt); err != nil {
		return fmt.Errorf("oci: mount disk image: %w", err)
	}
	return nil
}

// diskBytes is the size of the sandbox's disk image, which bounds what a
// snapshot of it may take; 0 when it has none (no limit).
func (d *Driver) diskBytes(id string) int64 {
	fi, err := os.Stat(d.DiskImage(id))
	if err != nil {
		return 0
	}
	return fi.Size()
}
