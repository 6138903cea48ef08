// Package local is the built-in volume plugin. A volume created with a
// size is a sparse ext4 image, root/<volumeID>.img (internal/diskimage,
// as sandbox disks are), loop-mounted at the attach directory: writes past
// the size fail with ENOSPC in every sandbox and through the volume-content
// API, and the host's disk pays only for what was written. A volume
// created without one (and every volume made before sizes existed) is a
// plain directory, root/<volumeID>, bind-mounted there. It suits
// single-node installations and tests; the data does not follow a sandbox
// to another node.
package local

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/cubicle-dev/cubicle/internal/diskimage"
	"github.com/cubicle-dev/cubicle/internal/volume"
	"github.com/cubicle-dev/cubicle/internal/volume/internal/mountinfo"
)

// dirPrefix names the attach directory: <VolumeBaseDir>/local-<volumeID>, the
// protocol's recommended <driver>-<volumeID>.
const dirPrefix = "local-"

// MetadataMountDir is the metadata key Attach sets to the host path; Detach
// needs it because DetachRequest carries no base dir.
const MetadataMountDir = "mount_dir"

// Plugin implements volume.Plugin on the local filesystem.
type Plugin struct {
	root string
}

var (
	_ volume.Plugin    = (*Plugin)(nil)
	_ volume.Sized     = (*Plugin)(nil)
	_ volume.HostBound = (*Plugin)(nil)
)

// imageExt names a sized volume's image, root/<volumeID>.img.
const imageExt = ".img"

// EnforcesSize: sized volumes are images (volume.Sized).
func (p *Plugin) EnforcesSize() bool { return true }

// KeepsDataOnHost: a volume is files under root on this host
// (volume.HostBound).
func (p *Plugin) KeepsDataOnHost() bool { return true }

// New returns a plugin keeping volume data in root/<volumeID>.
func New(root string) *Plugin { return &Plugin{root: filepath.Clean(root)} }

func (p *Plugin) dataDir(id string) (string, error) {
	if err := volume.ValidateName(id); err != nil {
		return "", fmt.Errorf("%w: local: volume id: %v", volume.ErrPlugin, err)
	}
	return filepath.Join(p.root, id), nil
}

// image is a volume's image path; it exists only for sized volumes.
func (p *Plugin) image(id string) string { return filepath.Join(p.root, id+imageExt) }

// Image is one sized volume's image.
type Image struct {
	VolumeID string
	Path     string
}

// Images lists the sized volumes' images under root (the server's
// free-space budget counts what each may still take from the disk).
func Images(root string) ([]Image, error) {
	ents, err := os.ReadDir(root)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []Image
	for _, e := range ents {
		id, ok := strings.CutSuffix(e.Name(), imageExt)
		if !ok || !e.Type().IsRegular() || volume.ValidateName(id) != nil {
			continue
		}
		out = append(out, Image{VolumeID: id, Path: filepath.Join(root, e.Name())})
	}
	return out, nil
}

func fail(op string, err error) error {
	return fmt.Errorf("%w: local: %s: %v", volume.ErrPlugin, op, err)
}

// Create makes the volume: an image of req.SizeMB, or a data directory
// when SizeMB is 0. Creating an existing volume is a no-op.
func (p *Plugin) Create(ctx context.Context, req volume.CreateRequest) (volume.CreateResult, error) {
	dir, err := p.dataDir(req.VolumeID)
	if err != nil {
		return volume.CreateResult{}, err
	}
	if req.SizeMB < 0 {
		return volume.CreateResult{}, fail("create", fmt.Errorf("size %d MiB is negative", req.SizeMB))
	}
	// Root only: sandboxes write here, and their files (set-ID ones
	// included) must not be reachable by the host's other users.
	if err := os.MkdirAll(p.root, 0o700); err != nil {
		return volume.CreateResult{}, fail("create", err)
	}
	if err := os.Chmod(p.root, 0o700); err != nil {
		return volume.CreateResult{}, fail("create", err)
	}
	if _, err := os.Stat(p.image(req.VolumeID)); err == nil {
		return volume.CreateResult{}, nil
	}
	if fi, err := os.Stat(dir); err == nil && fi.IsDir() {
		return volume.CreateResult{}, nil
	}
	if req.SizeMB > 0 {
		if err := p.createImage(ctx, req.VolumeID, req.SizeMB); err != nil {
			return volume.CreateResult{}, fail("create", err)
		}
		return volume.CreateResult{}, nil
	}
	switch err := os.Mkdir(dir, 0o777); {
	case errors.Is(err, fs.ErrExist):
		return volume.CreateResult{}, nil
	case err != nil:
		return volume.CreateResult{}, fail("create", err)
	}
	// Sandboxes run as uid 1000 as well as root; chmod because mkdir's mode
	// is filtered by the umask.
	if err := os.Chmod(dir, 0o777); err != nil {
		return volume.CreateResult{}, fail("create", err)
	}
	return volume.CreateResult{}, nil
}

// createImage formats the image under a temporary name, gives its root
// directory the data directory's mode, and renames it into place, so a
// crash never leaves a half-made image that Attach would take for the
// volume. Nothing is left behind on error.
func (p *Plugin) createImage(ctx context.Context, id string, sizeMB int) (err error) {
	tmp := filepath.Join(p.root, ".create-"+id+imageExt)
	mnt := filepath.Join(p.root, ".create-"+id)
	// Leftovers of a crashed create of the same volume.
	_ = diskimage.Release(tmp)
	_ = os.Remove(tmp)
	_ = os.Remove(mnt)
	if err := diskimage.Create(ctx, tmp, sizeMB); err != nil {
		return err
	}
	defer func() {
		if err != nil {
			_ = diskimage.Release(tmp)
			_ = os.Remove(mnt)
			_ = os.Remove(tmp)
		}
	}()
	if err := os.Mkdir(mnt, 0o700); err != nil {
		return err
	}
	if err := diskimage.Mount(ctx, tmp, mnt); err != nil {
		return err
	}
	// Sandboxes run as uid 1000 as well as root; mkfs's lost+found would
	// show up in every listing of the volume (e2fsck remakes it if needed).
	err = errors.Join(os.Chmod(mnt, 0o777), os.Remove(filepath.Join(mnt, "lost+found")))
	if uerr := diskimage.Release(tmp); err == nil {
		err = uerr
	}
	if err != nil {
		return err
	}
	if err := os.Remove(mnt); err != nil {
		return err
	}
	return os.Rename(tmp, p.image(id))
}

// Destroy deletes the volume's data; a missing volume is not an error. An
// image still mounted (an attach left by a crashed node process) is
// unmounted and its loop device detached first, so its blocks are freed.
func (p *Plugin) Destroy(_ context.Context, req volume.DestroyRequest) error {
	dir, err := p.dataDir(req.VolumeID)
	if err != nil {
		return err
	}
	img := p.image(req.VolumeID)
	if err := diskimage.Release(img); err != nil {
		return fail("destroy", err)
	}
	if err := os.Remove(img); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fail("destroy", err)
	}
	if err := os.RemoveAll(dir); err != nil {
		return fail("destroy", err)
	}
	return nil
}

// Attach mounts the volume at <VolumeBaseDir>/local-<volumeID>: its image
// loop-mounted, or its data directory bind-mounted. Whatever the ref count
// says, the result is "mounted once": an existing mount (a later sandbox,
// one left by a crashed node process or kept across a serve restart) is
// reused, a missing one (after a host reboot) is made.
func (p *Plugin) Attach(ctx context.Context, req volume.AttachRequest) (volume.AttachResult, error) {
	src, err := p.dataDir(req.VolumeID)
	if err != nil {
		return volume.AttachResult{}, err
	}
	if !filepath.IsAbs(req.VolumeBaseDir) {
		return volume.AttachResult{}, fail("attach", fmt.Errorf("volume base dir %q is not absolute", req.VolumeBaseDir))
	}
	img := p.image(req.VolumeID)
	_, err = os.Stat(img)
	sized := err == nil
	if fi, err := os.Stat(src); !sized && (err != nil || !fi.IsDir()) {
		return volume.AttachResult{}, fail("attach", fmt.Errorf("volume %q does not exist (no %s)", req.VolumeID, src))
	}
	target := filepath.Join(req.VolumeBaseDir, dirPrefix+req.VolumeID)
	if err := os.MkdirAll(req.VolumeBaseDir, 0o700); err != nil {
		return volume.AttachResult{}, fail("attach", err)
	}
	if err := os.Mkdir(target, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
		return volume.AttachResult{}, fail("attach", err)
	}
	mounted, err := mountinfo.IsMountpoint(target)
	if err != nil {
		return volume.AttachResult{}, fail("attach", err)
	}
	switch {
	case mounted:
	case sized:
		if err := diskimage.Mount(ctx, img, target); err != nil {
			return volume.AttachResult{}, fail("attach", err)
		}
	default:
		if err := unix.Mount(src, target, "", unix.MS_BIND, ""); err != nil {
			return volume.AttachResult{}, fail("attach", fmt.Errorf("bind-mount %s on %s: %w", src, target, err))
		}
	}
	return volume.AttachResult{HostPath: target, Metadata: map[string]string{MetadataMountDir: target}}, nil
}

// Detach unmounts and removes the attach directory when the last holder on
// the node goes (RefCount 0); the data stays in the root. Detaching what is
// not mounted is a no-op.
func (p *Plugin) Detach(_ context.Context, req volume.DetachRequest) error {
	if _, err := p.dataDir(req.VolumeID); err != nil {
		return err
	}
	if req.RefCount > 0 {
		return nil
	}
	target := req.Metadata[MetadataMountDir]
	if target == "" {
		// No metadata: the attach never got recorded (a crash mid-attach).
		// Detach has no base dir, so find this volume's mount points by name.
		mps, err := mountinfo.Mountpoints()
		if err != nil {
			return fail("detach", err)
		}
		var errs []error
		for _, mp := range mps {
			if filepath.Base(mp) == dirPrefix+req.VolumeID {
				errs = append(errs, unmountDir(mp))
			}
		}
		return errors.Join(errs...)
	}
	// Metadata travels through the caller; only ever unmount a path this
	// plugin could have produced for this volume.
	if !filepath.IsAbs(target) || filepath.Base(target) != dirPrefix+req.VolumeID {
		return fail("detach", fmt.Errorf("%s %q is not a local attach directory for volume %q", MetadataMountDir, target, req.VolumeID))
	}
	return unmountDir(target)
}

// unmountDir removes every mount stacked on target, then target. An
// image's loop device clears itself when its last mount goes.
func unmountDir(target string) error {
	// Loop: attach races can stack more than one bind mount on the path.
	for range 16 {
		mounted, err := mountinfo.IsMountpoint(target)
		if err != nil {
			return fail("detach", err)
		}
		if !mounted {
			break
		}
		if err := unix.Unmount(target, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) {
			return fail("detach", fmt.Errorf("unmount %s: %w", target, err))
		}
	}
	if err := os.Remove(target); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fail("detach", err)
	}
	return nil
}
