package oci

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/cubicle-dev/cubicle/internal/hostmount"
	"github.com/cubicle-dev/cubicle/internal/phase"
	"github.com/cubicle-dev/cubicle/internal/runtime"
)

// runc sandboxes run in a user namespace of their own: uid and gid 0..65535
// inside are usernsBase+slot*usernsSize+0..65535 on the host, one slot per
// sandbox, so root in a sandbox is an unprivileged host user no other
// sandbox shares. Image layers (and volumes) are mounted idmapped, so the
// same root-owned files serve every sandbox without a chown pass. The
// sandbox's own writable layer is written through an idmapped mount too
// (upperView), so it is stored 0-based like a layer: a snapshot of it
// needs no uid shift, and a clone of its disk serves any other range.
//
// The slot is recorded as the owner of the sandbox's dir (which is 0700,
// so only that uid and host root can enter it); New rebuilds the
// allocation from those owners after a restart.
const (
	usernsBase  = 1 << 30
	usernsSize  = 1 << 16
	usernsSlots = (1<<31 - usernsBase) / usernsSize // keeps kuids below 2^31 (ping_group_range)
)

// ErrUsernsExhausted: every user namespace slot is taken.
var ErrUsernsExhausted = errors.New("oci: no free user namespace range")

func slotBase(slot int) uint32 { return uint32(usernsBase + slot*usernsSize) }

// loadSlots reads the slots of existing sandbox dirs.
func (d *Driver) loadSlots() error {
	ents, err := os.ReadDir(d.cfg.SandboxDir)
	if err != nil {
		return err
	}
	for _, e := range ents {
		fi, err := os.Stat(filepath.Join(d.cfg.SandboxDir, e.Name()))
		if err != nil || !fi.IsDir() {
			continue
		}
		uid := fi.Sys().(*syscall.Stat_t).Uid
		if uid >= usernsBase && (uid-usernsBase)%usernsSize == 0 {
			d.slots[e.Name()] = int((uid - usernsBase) / usernsSize)
		}
	}
	return nil
}

// allocSlot gives id the lowest free slot and hands its dir to that range.
func (d *Driver) allocSlot(id string) (uint32, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	used := make(map[int]bool, len(d.slots))
	for _, s := range d.slots {
		used[s] = true
	}
	for s := 0; s < usernsSlots; s++ {
		if used[s] {
			continue
		}
		base := slotBase(s)
		if err := os.Chown(d.dir(id), int(base), int(base)); err != nil {
			return 0, err
		}
		d.slots[id] = s
		return base, nil
	}
	return 0, ErrUsernsExhausted
}

func (d *Driver) freeSlot(id string) {
	d.mu.Lock()
	delete(d.slots, id)
	d.mu.Unlock()
}

// userns reports whether sandboxes of this driver get a user namespace.
// Under runsc it holds the sentry and the gofer: gVisor starts both in the
// spec's user namespace, so a sentry escape lands as the sandbox's
// unprivileged host uid, not as host root.
func (d *Driver) userns() bool { return d.cfg.UserNS }

// ownedUserns: the driver makes the namespace itself and runc joins it
// (bindOwnedUserns). runsc makes its own from the spec's mappings: it
// cannot join one by path (setns into a user namespace needs a
// single-threaded caller), and the sentry answers inotify, mqueue and
// signals itself, so no per-user kernel budget is at stake.
func (d *Driver) ownedUserns() bool { return d.userns() && d.cfg.Runtime != "runsc" }

// idmappedRootfs builds the rootfs for a user-namespaced sandbox: each
// layer idmapped to the sandbox's range under <dir>/l/<i>, the upper dir
// owned by its root, then the overlay. It also stages every bind mount
// under <dir>/m/<i> (idmapped where the filesystem allows it, a plain
// bind otherwise) and returns the mounts with their staged sources: runc
// resolves sources inside the user namespace, which cannot traverse the
// host's root-only dirs.
func (d *Driver) idmappedRootfs(ctx context.Context, id string, base uint32, layers []string, upper, work, rootfs string, mounts []runtime.Mount, devs []runtime.Device) ([]runtime.Mount, error) {
	// Inside rootfs's phase: what user namespaces add to it.
	defer phase.Start(ctx, phase.Idmap)()
	ns, err := newUserns(base, usernsSize)
	if err != nil {
		return nil, err
	}
	defer ns.Close()
	// Only root and the sandbox's uid can enter <dir>; runc, as the
	// latter, must pass through m/ to the staged sources.
	for _, sub := range []string{"l", "m"} {
		if err := os.Mkdir(filepath.Join(d.dir(id), sub), 0o711); err != nil {
			return nil, err
		}
	}
	mapped := make([]string, len(layers))
	for i, l := range layers {
		mapped[i] = filepath.Join(d.dir(id), "l", fmt.Sprint(i))
		if err := os.Mkdir(mapped[i], 0o700); err != nil {
			return nil, err
		}
		if err := idmapMount(l, mapped[i], ns, false); err != nil {
			return nil, err
		}
	}
	// The overlay's root takes the upper dir's owner and mode.
	top, err := os.Stat(layers[0])
	if err != nil {
		return nil, err
	}
	if err := os.Chmod(upper, top.Mode().Perm()); err != nil {
		return nil, err
	}
	if err := d.mountUpperView(id, base, upper, work, mapped, rootfs); err != nil {
		return nil, err
	}
	staged, err := d.stageMounts(id, ns, mounts)
	if err != nil {
		return nil, err
	}
	// A user namespace cannot mknod: device nodes are made here, owned by
	// the sandbox's range, and bound in by buildSpec (the device cgroup
	// still decides what may be opened).
	for i, dev := range devs {
		mode := uint32(dev.FileMode & 0o7777)
		if mode == 0 {
			mode = 0o666
		}
		typ := uint32(unix.S_IFCHR)
		if dev.Type == 'b' {
			typ = unix.S_IFBLK
		}
		p := d.devNode(id, i)
		if err := unix.Mknod(p, typ|mode, int(unix.Mkdev(uint32(dev.Major), uint32(dev.Minor)))); err != nil {
			return nil, fmt.Errorf("oci: device node %s: %w", dev.Path, err)
		}
		if err := os.Chown(p, int(base+dev.UID), int(base+dev.GID)); err != nil {
			return nil, err
		}
		if err := os.Chmod(p, os.FileMode(mode&0o777)); err != nil { // mknod's mode went through the umask
			return nil, err
		}
	}
	return staged, nil
}

// upperIdmapped marks a sandbox whose upper dir is stored 0-based
// (mountUpperView); one without it (made before, or on a kernel whose
// overlayfs refused the view) stores its sandbox's host uids.
func (d *Driver) upperIdmapped(id string) string { return filepath.Join(d.priv(id), "upper-idmapped") }

// mountUpperView mounts the overlay of the mapped layers with the upper
// and work dirs (on the sandbox's disk) seen through an idmapped mount of
// the disk at <dir>/u: the sandbox's host uid base+n is stored as n. The
// mount's user namespace also maps n = 65536 to host root, because
// overlayfs makes its own entries (work dirs, whiteouts) as the mounter,
// host root, which must map to something on disk; no sandbox uid can
// make such an entry, and layers are mounted with the plain range, where
// 65536 is unmapped. Where the kernel's overlayfs refuses an idmapped
// upper (before 5.19) the upper is used as it is, storing host uids.
func (d *Driver) mountUpperView(id string, base uint32, upper, work string, mapped []string, rootfs string) error {
	view := filepath.Join(d.dir(id), "u")
	if err := os.Mkdir(view, 0o700); err != nil {
		return err
	}
	disk := filepath.Dir(upper)
	err := errNoIdmap
	if !d.noUpperView {
		ns, nerr := d.upperUserns(base)
		if nerr != nil {
			return nerr
		}
		err = idmapMount(disk, view, ns, false)
	}
	if err == nil {
		err = mountOverlay(mapped, filepath.Join(view, filepath.Base(upper)), filepath.Join(view, filepath.Base(work)), rootfs)
		if err == nil && !readOnly(rootfs) {
			return os.WriteFile(d.upperIdmapped(id), nil, 0o600)
		}
		// A kernel that cannot write the view mounts the overlay
		// read-only rather than failing: that is a refusal too.
		if err == nil {
			err = unix.Unmount(rootfs, unix.MNT_DETACH)
		}
		if uerr := unix.Unmount(view, unix.MNT_DETACH); uerr != nil {
			return uerr
		}
	}
	slog.Debug("oci: no idmapped upper; storing host uids", "sandbox", id, "err", err)
	// Host uids, as before the view: the seeded files too.
	if err := shiftTree(upper, base); err != nil {
		return err
	}
	return mountOverlay(mapped, upper, work, rootfs)
}

// shiftTree adds base to the owner of everything under dir (itself
// included): a fresh upper holding only seeded files, none a link to
// follow (Lchown never follows one).
func shiftTree(dir string, base uint32) error {
	return filepath.WalkDir(dir, func(p string, _ os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return err
		}
		return os.Lchown(p, int(base+st.Uid), int(base+st.Gid))
	})
}

// upperUserns is the user namespace of base's upper view (mountUpperView),
// made once per range and kept: a range's sandboxes come and go. The
// helper process that makes it runs outside d.mu, which every create
// takes for its slot.
func (d *Driver) upperUserns(base uint32) (*os.File, error) {
	d.mu.Lock()
	ns := d.upperNS[base]
	d.mu.Unlock()
	if ns != nil {
		return ns, nil
	}
	ns, err := newUsernsMap([]syscall.SysProcIDMap{
		{ContainerID: 0, HostID: int(base), Size: usernsSize},
		{ContainerID: usernsSize, HostID: 0, Size: 1},
	})
	if err != nil {
		return nil, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if won := d.upperNS[base]; won != nil {
		ns.Close() // made meanwhile by another create of this range
		return won, nil
	}
	if d.upperNS == nil {
		d.upperNS = map[uint32]*os.File{}
	}
	d.upperNS[base] = ns
	return ns, nil
}

// readOnly reports whether the filesystem at p is mounted read-only.
func readOnly(p string) bool {
	var st unix.Statfs_t
	return unix.Statfs(p, &st) == nil && st.Flags&unix.ST_RDONLY != 0
}

// stageMounts bind-mounts every mount's source under <dir>/m/<i>
// (idmapped where the filesystem allows it, a plain bind otherwise) and
// returns the mounts with their staged sources. The originals are kept in
// the root-only privateDir's mounts.json (never in <dir>, which the
// sandbox's uid owns and could swap it in), so restageMounts can redo it before a stopped sandbox
// boots again (a source replaced since, like an upgraded agent binary,
// would otherwise be a bind of a deleted file, which mount refuses).
func (d *Driver) stageMounts(id string, ns *os.File, mounts []runtime.Mount) ([]runtime.Mount, error) {
	b, err := json.Marshal(mounts)
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(d.priv(id), "mounts.json"), b, 0o600); err != nil {
		return nil, err
	}
	staged := make([]runtime.Mount, len(mounts))
	for i, m := range mounts {
		if m.Under != "" {
			if err := d.stageHostMount(id, i, ns, m); err != nil {
				return nil, err
			}
			staged[i] = m
			staged[i].Source, staged[i].Under = filepath.Join(d.dir(id), "m", fmt.Sprint(i)), ""
			continue
		}
		fi, err := os.Stat(m.Source)
		if err != nil {
			return nil, fmt.Errorf("%w: mount source: %v", ErrInvalidSpec, err)
		}
		dst := filepath.Join(d.dir(id), "m", fmt.Sprint(i))
		if _, err := os.Lstat(dst); errors.Is(err, os.ErrNotExist) {
			if fi.IsDir() {
				err = os.Mkdir(dst, 0o700)
			} else {
				err = os.WriteFile(dst, nil, 0o600)
			}
			if err != nil {
				return nil, err
			}
		}
		if err := idmapMount(m.Source, dst, ns, true); errors.Is(err, errNoIdmap) {
			// FUSE (s3fs volumes) and other filesystems without idmap
			// support: a plain bind; their files show as unmapped owners.
			err = unix.Mount(m.Source, dst, "", unix.MS_BIND|unix.MS_REC, "")
			if err != nil {
				return nil, fmt.Errorf("oci: stage mount %s: %w", m.Source, err)
			}
		} else if err != nil {
			return nil, err
		}
		staged[i] = m
		staged[i].Source = dst
	}
	return staged, nil
}

// stageHostMount mounts host mount m, idmapped, at m/<i>: from the
// directory hostmount.OpenDir reached without following a symlink, so the
// mount is the directory that was checked (a restart checks again).
func (d *Driver) stageHostMount(id string, i int, ns *os.File, m runtime.Mount) error {
	dir, err := hostmount.OpenDir(m.Under, m.Source)
	if err != nil {
		return fmt.Errorf("%w: bind mount %s -> %s: %w", ErrInvalidSpec, m.Source, m.Destination, err)
	}
	defer dir.Close()
	dst := filepath.Join(d.dir(id), "m", fmt.Sprint(i))
	if err := os.Mkdir(dst, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return err
	}
	if err := idmapMountFD(int(dir.Fd()), dst, ns); errors.Is(err, errNoIdmap) {
		// A filesystem without idmapped mounts: a plain bind of the same
		// descriptor; its files show as unmapped owners in the sandbox.
		if err := unix.Mount(fmt.Sprintf("/proc/self/fd/%d", dir.Fd()), dst, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			return fmt.Errorf("oci: bind mount %s -> %s: %w", m.Source, m.Destination, err)
		}
	} else if err != nil {
		return fmt.Errorf("oci: bind mount %s -> %s: %w", m.Source, m.Destination, err)
	}
	return nil
}

// restageMounts redoes stageMounts for a stopped user-namespaced sandbox.
func (d *Driver) restageMounts(id string) error {
	b, err := os.ReadFile(filepath.Join(d.priv(id), "mounts.json"))
	if err != nil {
		return err
	}
	var mounts []runtime.Mount
	if err := json.Unmarshal(b, &mounts); err != nil {
		return err
	}
	d.mu.Lock()
	slot, ok := d.slots[id]
	d.mu.Unlock()
	if !ok {
		return fmt.Errorf("oci: %s has no user namespace slot", id)
	}
	if err := unmountUnder(filepath.Join(d.dir(id), "m")); err != nil {
		return err
	}
	ns, err := newUserns(slotBase(slot), usernsSize)
	if err != nil {
		return err
	}
	defer ns.Close()
	_, err = d.stageMounts(id, ns, mounts)
	return err
}

// devNode is where idmappedRootfs makes the i-th device node.
func (d *Driver) devNode(id string, i int) string {
	return filepath.Join(d.dir(id), "m", fmt.Sprintf("dev%d", i))
}

// checkTraversable: runc resolves a user-namespaced sandbox's rootfs as
// the sandbox's root, an unprivileged host uid, so every directory above
// the sandbox dir must let others pass (x). A root-only ancestor would fail
// every create with a bare "permission denied".
func checkTraversable(dir string) error {
	for p := filepath.Dir(filepath.Clean(dir)); ; p = filepath.Dir(p) {
		fi, err := os.Stat(p)
		if err != nil {
			return err
		}
		if fi.Mode().Perm()&0o001 == 0 {
			return fmt.Errorf("%w: %s is mode %v: user-namespaced sandboxes need every directory above %s to be traversable (chmod o+x), or --userns off",
				ErrHostUnsupported, p, fi.Mode().Perm(), dir)
		}
		if p == "/" {
			return nil
		}
	}
}
