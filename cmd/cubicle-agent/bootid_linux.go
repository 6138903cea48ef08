package main

import (
	"crypto/rand"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// bindBootID runs as a createContainer hook: in the container's mount
// namespace, after runc mounted its /proc and /dev and before pivot_root,
// as the container's root. The UUID is written to a file on the
// container's fresh /dev tmpfs (a path on the host would need permissions
// the user namespace's root lacks), bound read-only over boot_id, and
// unlinked: the bind keeps the inode, and nothing is left in /dev.
func bindBootID(rootfs string) error {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return err
	}
	b[6] = b[6]&0x0f | 0x40 // version 4
	b[8] = b[8]&0x3f | 0x80 // RFC 4122 variant
	id := fmt.Sprintf("%x-%x-%x-%x-%x\n", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
	src := filepath.Join(rootfs, "dev", ".cubicle-boot-id")
	dst := filepath.Join(rootfs, "proc", "sys", "kernel", "random", "boot_id")
	// O_EXCL|O_NOFOLLOW: the tmpfs is runc's own, just made; anything at
	// that name is not ours to write through.
	f, err := os.OpenFile(src, os.O_WRONLY|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW, 0o444)
	if err != nil {
		return err
	}
	defer os.Remove(src)
	if _, err := f.WriteString(id); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := unix.Mount(src, dst, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind over %s: %w", dst, err)
	}
	if err := unix.Mount("", dst, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("read-only %s: %w", dst, err)
	}
	return nil
}
