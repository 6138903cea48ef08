package oci

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// newUserns returns a user namespace mapping uids and gids 0..size-1 to
// base..base+size-1, as an open /proc/<pid>/ns/user of a short-lived helper
// (a multithreaded Go process cannot unshare a user namespace itself).
func newUserns(base, size uint32) (*os.File, error) {
	return newUsernsMap([]syscall.SysProcIDMap{{ContainerID: 0, HostID: int(base), Size: int(size)}})
}

// newUsernsMap is newUserns with any uid (and the same gid) mapping.
func newUsernsMap(m []syscall.SysProcIDMap) (*os.File, error) {
	cat, err := exec.LookPath("cat")
	if err != nil {
		return nil, fmt.Errorf("oci: user namespace helper: %w", err)
	}
	cmd := exec.Command(cat)
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: unix.CLONE_NEWUSER, UidMappings: m, GidMappings: m, Pdeathsig: unix.SIGKILL}
	if err := cmd.Start(); err != nil {
		in.Close()
		return nil, fmt.Errorf("oci: user namespace helper: %w", err)
	}
	f, err := os.Open("/proc/" + strconv.Itoa(cmd.Process.Pid) + "/ns/user")
	in.Close() // cat sees EOF and exits
	werr := cmd.Wait()
	if err != nil {
		return nil, fmt.Errorf("oci: user namespace: %w", err)
	}
	if werr != nil {
		f.Close()
		return nil, fmt.Errorf("oci: user namespace helper: %w", werr)
	}
	return f, nil
}

// errNoIdmap: the filesystem under a mount cannot be idmapped.
var errNoIdmap = errors.New("filesystem does not support idmapped mounts")

// idmapMount mounts an idmapped clone of the mount tree at src on dst: a
// file owned by uid u on disk appears owned by base+u, so root in a
// sandbox whose user namespace maps 0 to base sees the image's root-owned
// files as its own, and what it writes is stored as uid 0 again: no chown
// pass over images or volumes, and every sandbox gets its own range.
func idmapMount(src, dst string, userns *os.File, recursive bool) error {
	return idmapTree(unix.AT_FDCWD, src, dst, userns, recursive)
}

// idmapMountFD is idmapMount of the tree at the directory descriptor dirfd
// (recursive), so the mount is exactly what dirfd was opened on.
func idmapMountFD(dirfd int, dst string, userns *os.File) error {
	return idmapTree(dirfd, "", dst, userns, true)
}

// idmapTree clones the tree at src relative to dirfd ("" = dirfd itself),
// idmaps the clone and moves it onto dst.
func idmapTree(dirfd int, src, dst string, userns *os.File, recursive bool) error {
	flags := unix.OPEN_TREE_CLONE | unix.OPEN_TREE_CLOEXEC
	setFlags := unix.AT_EMPTY_PATH
	if src == "" {
		flags |= unix.AT_EMPTY_PATH
	}
	if recursive {
		flags |= unix.AT_RECURSIVE
		setFlags |= unix.AT_RECURSIVE
	}
	fd, err := unix.OpenTree(dirfd, src, uint(flags))
	if err != nil {
		return fmt.Errorf("oci: open_tree %s: %w", src, err)
	}
	defer unix.Close(fd)
	attr := unix.MountAttr{Attr_set: unix.MOUNT_ATTR_IDMAP, Userns_fd: uint64(userns.Fd())}
	if err := unix.MountSetattr(fd, "", uint(setFlags), &attr); err != nil {
		if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.EPERM) || errors.Is(err, unix.EOPNOTSUPP) {
			return fmt.Errorf("oci: idmap %s: %w (%v)", src, errNoIdmap, err)
		}
		return fmt.Errorf("oci: idmap %s: %w", src, err)
	}
	if err := unix.MoveMount(fd, "", unix.AT_FDCWD, dst, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return fmt.Errorf("oci: move_mount %s: %w", dst, err)
	}
	return nil
}

// checkIdmap probes that dir's filesystem can be idmapped (Linux 5.12+,
// ext4/xfs/btrfs...), so a host that cannot run user-namespaced sandboxes
// fails at start rather than at the first create.
func checkIdmap(dir string) error {
	ns, err := newUserns(usernsBase, usernsSize)
	if err != nil {
		return err
	}
	defer ns.Close()
	tmp, err := os.MkdirTemp(dir, ".idmap-probe-")
	if err != nil {
		return err
	}
	defer os.Remove(tmp)
	src := filepath.Join(tmp, "src")
	dst := filepath.Join(tmp, "dst")
	for _, p := range []string{src, dst} {
		if err := os.Mkdir(p, 0o700); err != nil {
			return err
		}
		defer os.Remove(p)
	}
	if err := idmapMount(src, dst, ns, false); err != nil {
		return err
	}
	return unix.Unmount(dst, unix.MNT_DETACH)
}

// bindOwnedUserns makes the user namespace a sandbox's container joins and
// bind-mounts it at path: uids and gids 0..size-1 map to base.., and its
// owner is host uid base, not root. The kernel charges what a user
// namespace's processes hold against per-user budgets (inotify instances
// and watches, queued signals, POSIX message-queue bytes, processes) at
// every level up, the top one keyed by the namespace's owner: a namespace
// runc makes as root would have every sandbox draw on host root's budgets.
// Owned by the slot's own uid, each sandbox draws on a budget of its own.
//
// The helper runs unshare(1) as base (the owner is the creator's euid, and
// Go's clone would create the namespace as root); host root writes the
// maps, which only a privileged parent may do for a 65536-id range.
func bindOwnedUserns(base, size uint32, path string) (err error) {
	unshare, err := exec.LookPath("unshare")
	if err != nil {
		return fmt.Errorf("%w: user namespace helper: %v", ErrHostUnsupported, err)
	}
	cat, err := exec.LookPath("cat")
	if err != nil {
		return fmt.Errorf("%w: user namespace helper: %v", ErrHostUnsupported, err)
	}
	// path is in the sandbox's dir, which its host uid owns: whatever is
	// there is removed, never followed, and the namespace is mounted onto
	// the file made here by descriptor.
	if err := unix.Unmount(path, unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("oci: unmount stale %s: %w", path, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	target, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return err
	}
	defer target.Close()
	cmd := exec.Command(unshare, "--user", "--", cat)
	in, err := cmd.StdinPipe()
	if err != nil {
		return err
	}
	defer in.Close()
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Credential: &syscall.Credential{Uid: base, Gid: base, Groups: []uint32{}},
		Pdeathsig:  unix.SIGKILL,
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("oci: user namespace helper: %w", err)
	}
	defer func() {
		if err != nil {
			cmd.Process.Kill()
		}
		in.Close() // cat sees EOF and exits
		if werr := cmd.Wait(); werr != nil && err == nil {
			err = fmt.Errorf("oci: user namespace helper: %w", werr)
		}
	}()
	proc := "/proc/" + strconv.Itoa(cmd.Process.Pid)
	// Until unshare(2) has run, the helper is still in our namespace.
	deadline := time.Now().Add(10 * time.Second)
	for {
		owner, err := nsOwner(proc + "/ns/user")
		if err != nil {
			return fmt.Errorf("oci: user namespace helper: %w", err)
		}
		if owner == base {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("oci: user namespace helper did not unshare within 10s")
		}
		time.Sleep(time.Millisecond)
	}
	m := fmt.Sprintf("0 %d %d\n", base, size)
	for _, f := range []string{"uid_map", "gid_map"} {
		if err := os.WriteFile(proc+"/"+f, []byte(m), 0); err != nil {
			return fmt.Errorf("oci: user namespace %s: %w", f, err)
		}
	}
	tree, err := unix.OpenTree(unix.AT_FDCWD, proc+"/ns/user", unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
	if err != nil {
		return fmt.Errorf("oci: bind user namespace: %w", err)
	}
	defer unix.Close(tree)
	if err := unix.MoveMount(tree, "", int(target.Fd()), "", unix.MOVE_MOUNT_F_EMPTY_PATH|unix.MOVE_MOUNT_T_EMPTY_PATH); err != nil {
		return fmt.Errorf("oci: bind user namespace: %w", err)
	}
	return nil
}

// unbindUserns undoes bindOwnedUserns's mount (not following a link).
func unbindUserns(path string) error {
	return unix.Unmount(path, unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW)
}

// checkOwnedUserns probes, at start, that an unprivileged uid may make a
// user namespace here (user.max_user_namespaces above 0; on older Debian
// kernels kernel.unprivileged_userns_clone=1), so a host that forbids it
// fails at start rather than at the first create.
func checkOwnedUserns(dir string) error {
	p := filepath.Join(dir, fmt.Sprintf(".userns-probe-%d", os.Getpid()))
	if err := bindOwnedUserns(usernsBase, usernsSize, p); err != nil {
		os.Remove(p)
		return err
	}
	if err := unbindUserns(p); err != nil {
		return err
	}
	return os.Remove(p)
}

// nsOwner is the host uid owning the user namespace at path.
func nsOwner(path string) (uint32, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	return unix.IoctlGetUint32(int(f.Fd()), unix.NS_GET_OWNER_UID)
}
