package oci

import (
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	goruntime "runtime"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Each boot of a sandbox has a /proc/sys/kernel/random/boot_id of its own:
// e2b's SDK tells a reboot by it (a filesystem-only pause resumes with a new
// one), and the host's would let code in two sandboxes learn that they
// share a machine. runc and crun refuse a mount inside /proc beyond
// lxcfs's files, so the node binds it itself once runc has started the
// container: a fresh UUID in a file of the sandbox's private dir, cloned as
// a detached read-only mount (open_tree) on the host, then attached over
// boot_id from a thread that joined the container's mount namespace. That
// costs no process (a hook would be an exec on every create), and only the
// agent runs in the container at that point. gVisor's sentry makes its own.

// bootIDPath is where the bind lands, resolved in the container's mount
// namespace, under its root.
const bootIDPath = "/proc/sys/kernel/random/boot_id"

func newBootID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40 // version 4
	b[8] = b[8]&0x3f | 0x80 // RFC 4122 variant
	return fmt.Sprintf("%x-%x-%x-%x-%x\n", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

// bindBootID gives the container whose init is pid a new boot_id. The file
// is replaced by rename at each boot, so a boot never sees another's.
func (d *Driver) bindBootID(id string, pid int) error {
	src := filepath.Join(d.priv(id), "boot_id")
	tmp := src + ".tmp"
	if err := os.WriteFile(tmp, []byte(newBootID()), 0o444); err != nil {
		return err
	}
	if err := os.Rename(tmp, src); err != nil {
		return err
	}
	tree, err := unix.OpenTree(unix.AT_FDCWD, src, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
	if errors.Is(err, unix.ENOSYS) {
		return nil // a kernel before 5.2: the host's boot_id shows, as under runc alone
	}
	if err != nil {
		return fmt.Errorf("boot_id: open_tree: %w", err)
	}
	defer unix.Close(tree)
	attr := unix.MountAttr{Attr_set: unix.MOUNT_ATTR_RDONLY | unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV | unix.MOUNT_ATTR_NOEXEC}
	if err := unix.MountSetattr(tree, "", unix.AT_EMPTY_PATH, &attr); err != nil && !errors.Is(err, unix.ENOSYS) {
		return fmt.Errorf("boot_id: mount_setattr: %w", err)
	}
	ns, err := os.Open("/proc/" + strconv.Itoa(pid) + "/ns/mnt")
	if err != nil {
		return fmt.Errorf("boot_id: %w", err)
	}
	defer ns.Close()
	home, err := os.Open("/proc/self/ns/mnt")
	if err != nil {
		return fmt.Errorf("boot_id: %w", err)
	}
	defer home.Close()
	errc := make(chan error, 1)
	go func() {
		// The thread is never unlocked: it ends with this goroutine.
		// unshare(CLONE_FS) first: setns into a mount namespace needs an
		// fs_struct of its own, and that one's root becomes the
		// container's, which would keep its rootfs busy until the thread
		// is gone; so the thread goes home before it reports.
		goruntime.LockOSThread()
		if err := unix.Unshare(unix.CLONE_FS); err != nil {
			errc <- fmt.Errorf("boot_id: unshare: %w", err)
			return
		}
		if err := unix.Setns(int(ns.Fd()), unix.CLONE_NEWNS); err != nil {
			errc <- fmt.Errorf("boot_id: setns: %w", err)
			return
		}
		err := unix.MoveMount(tree, "", unix.AT_FDCWD, bootIDPath, unix.MOVE_MOUNT_F_EMPTY_PATH)
		if herr := unix.Setns(int(home.Fd()), unix.CLONE_NEWNS); herr != nil && err == nil {
			err = herr
		}
		if err != nil {
			err = fmt.Errorf("boot_id: %w", err)
		}
		errc <- err
	}()
	return <-errc
}

// bootIDAfterRun binds the boot_id of a container runc or crun just
// started (its init's pid is in the bundle's pid file).
func (d *Driver) bootIDAfterRun(id string) error {
	if d.cfg.Runtime == "runsc" {
		return nil
	}
	b, err := os.ReadFile(filepath.Join(d.bundle(id), "pid"))
	if err != nil {
		return fmt.Errorf("boot_id: %w", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 {
		return fmt.Errorf("boot_id: pid file %q", b)
	}
	if err := d.bindBootID(id, pid); err != nil && pidAlive(pid) {
		return err
	}
	// An init that exited at once has no namespace left to bind into:
	// the container is over, as Inspect will say.
	return nil
}
