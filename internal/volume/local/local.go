// Package local is the built-in volume plugin: each volume is a directory
// under a root on the node's own disk, bind-mounted into the volume base dir
// on attach. It suits single-node installations and tests; the data does not
// follow a sandbox to another node.
package local

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

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

var _ volume.Plugin = (*Plugin)(nil)

// New returns a plugin keeping volume data in root/<volumeID>.
func New(root string) *Plugin { return &Plugin{root: filepath.Clean(root)} }

func (p *Plugin) dataDir(id string) (string, error) {
	if err := volume.ValidateName(id); err != nil {
		return "", fmt.Errorf("%w: local: volume id: %v", volume.ErrPlugin, err)
	}
	return filepath.Join(p.root, id), nil
}

func fail(op string, err error) error {
	return fmt.Errorf("%w: local: %s: %v", volume.ErrPlugin, op, err)
}

// Create makes the data directory; creating an existing volume is a no-op.
func (p *Plugin) Create(_ context.Context, req volume.CreateRequest) (volume.CreateResult, error) {
	dir, err := p.dataDir(req.VolumeID)
	if err != nil {
		return volume.CreateResult{}, err
	}
	// Root only: sandboxes write here, and their files (set-ID ones
	// included) must not be reachable by the host's other users.
	if err := os.MkdirAll(p.root, 0o700); err != nil {
		return volume.CreateResult{}, fail("create", err)
	}
	if err := os.Chmod(p.root, 0o700); err != nil {
		return volume.CreateResult{}, fail("create", err)
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

// Destroy deletes the volume's data; a missing volume is not an error.
func (p *Plugin) Destroy(_ context.Context, req volume.DestroyRequest) error {
	dir, err := p.dataDir(req.VolumeID)
	if err != nil {
		return err
	}
	if err := os.RemoveAll(dir); err != nil {
		return fail("destroy", err)
	}
	return nil
}

// Attach bind-mounts the data directory at <VolumeBaseDir>/local-<volumeID>.
// Whatever the ref count says, the result is "mounted once": an existing
// mount (a later sandbox, or one left by a crashed node process) is reused,
// a missing one is made.
func (p *Plugin) Attach(_ context.Context, req volume.AttachRequest) (volume.AttachResult, error) {
	src, err := p.dataDir(req.VolumeID)
	if err != nil {
		return volume.AttachResult{}, err
	}
	if !filepath.IsAbs(req.VolumeBaseDir) {
		return volume.AttachResult{}, fail("attach", fmt.Errorf("volume base dir %q is not absolute", req.VolumeBaseDir))
	}
	if fi, err := os.Stat(src); err != nil || !fi.IsDir() {
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
	if !mounted {
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

// unmountDir removes every bind mount stacked on target, then target.
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
