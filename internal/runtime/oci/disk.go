package oci

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/cubicle-dev/cubicle/internal/diskimage"
)

// Each sandbox's writable layer lives on a filesystem of its own: a sparse
// ext4 image of Resources.DiskMB (internal/diskimage), loop-mounted at
// <dir>/disk, holding the overlay's upper and work dirs. Writes past the
// size fail with ENOSPC inside the sandbox and never reach the host's disk
// beyond it; `df` in the sandbox reports the image (overlayfs reports its
// upper filesystem).
const diskImage = "disk.img"

// diskDir is where the sandbox's upper and work dirs live.
func (d *Driver) diskDir(id string) string { return filepath.Join(d.dir(id), "disk") }

// DiskImage is the path of sandbox id's disk image (absent when the
// sandbox has no disk limit); the server's free-space budget reads it.
func (d *Driver) DiskImage(id string) string { return filepath.Join(d.dir(id), diskImage) }

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
	img := d.DiskImage(id)
	if err := diskimage.Create(ctx, img, sizeMB); err != nil {
		return fmt.Errorf("oci: disk image: %w", err)
	}
	if err := diskimage.Mount(ctx, img, mnt); err != nil {
		return fmt.Errorf("oci: mount disk image: %w", err)
	}
	return nil
}
