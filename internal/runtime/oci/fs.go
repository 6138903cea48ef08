package oci

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cubicle-dev/cubicle/internal/runtime"
)

func mountOverlay(layers []string, upper, work, target string) error {
	for _, l := range layers {
		if strings.ContainsAny(l, ":,") {
			// overlayfs option syntax cannot carry these unescaped.
			return fmt.Errorf("%w: layer path %q contains ':' or ','", ErrInvalidSpec, l)
		}
		if fi, err := os.Stat(l); err != nil || !fi.IsDir() {
			return fmt.Errorf("%w: layer %q is not a directory", ErrInvalidSpec, l)
		}
	}
	opts := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s", strings.Join(layers, ":"), upper, work)
	if err := unix.Mount("overlay", target, "overlay", 0, opts); err != nil {
		return fmt.Errorf("oci: mount overlay on %s: %w", target, err)
	}
	return nil
}

// prepareRootfs makes /tmp (a plain dir in the overlay, so files persist
// across pause/resume) and the mountpoints of the extra mounts, refusing to
// follow symlinks inside the image so nothing is created outside rootfs.
func prepareRootfs(rootfs string, mounts []runtime.Mount) error {
	if err := mkdirInRoot(rootfs, "/tmp", 0o1777); err != nil {
		return err
	}
	for _, m := range mounts {
		fi, err := os.Stat(m.Source)
		if err != nil {
			return fmt.Errorf("%w: mount source: %v", ErrInvalidSpec, err)
		}
		dst := filepath.Clean(m.Destination)
		if inKernelFS(dst) {
			// Over a file of the sandbox's own procfs or sysfs (lxcfs's
			// views), which the runtime mounts before the extra mounts: the
			// mountpoint exists there, and nothing goes into the image.
			continue
		}
		if fi.IsDir() {
			if err := mkdirInRoot(rootfs, dst, 0o755); err != nil {
				return err
			}
			continue
		}
		if err := mkdirInRoot(rootfs, filepath.Dir(dst), 0o755); err != nil {
			return err
		}
		p := filepath.Join(rootfs, dst)
		if li, err := os.Lstat(p); err == nil {
			if li.Mode()&os.ModeSymlink != 0 {
				return fmt.Errorf("%w: mountpoint %s is a symlink in the image", ErrInvalidSpec, dst)
			}
			continue
		}
		f, err := os.OpenFile(p, os.O_CREATE|os.O_WRONLY|unix.O_NOFOLLOW, 0o644)
		if err != nil {
			return err
		}
		f.Close()
	}
	return nil
}

// inKernelFS: dst is below /proc or /sys, which are the sandbox's procfs
// and sysfs, not directories of the image.
func inKernelFS(dst string) bool {
	return strings.HasPrefix(dst, "/proc/") || strings.HasPrefix(dst, "/sys/")
}

func mkdirInRoot(rootfs, rel string, mode os.FileMode) error {
	cur := rootfs
	for _, part := range strings.Split(strings.Trim(filepath.Clean(rel), "/"), "/") {
		if part == "" {
			continue
		}
		cur = filepath.Join(cur, part)
		fi, err := os.Lstat(cur)
		switch {
		case err == nil && fi.Mode()&os.ModeSymlink != 0:
			return fmt.Errorf("%w: %s crosses a symlink in the image", ErrInvalidSpec, rel)
		case err == nil && !fi.IsDir():
			return fmt.Errorf("%w: %s is not a directory in the image", ErrInvalidSpec, rel)
		case err == nil:
		case errors.Is(err, os.ErrNotExist):
			if err := os.Mkdir(cur, mode); err != nil {
				return err
			}
			// Mkdir is subject to umask; sticky /tmp must be exact.
			if err := os.Chmod(cur, mode); err != nil {
				return err
			}
		default:
			return err
		}
	}
	return nil
}

// mountsUnder lists mount points at or below dir, most recent first:
// mountinfo lists a namespace's mounts in the order they were made, so the
// reverse unmounts a mount on top of another (or one that uses another, as
// an overlay uses its idmapped layers) before what is under it.
func mountsUnder(dir string) ([]string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	dir = filepath.Clean(dir)
	var out []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		mp := unescapeMountinfo(fields[4])
		if mp == dir || strings.HasPrefix(mp, dir+"/") {
			out = append(out, mp)
		}
	}
	slices.Reverse(out)
	return out, sc.Err()
}

// unescapeMountinfo undoes the kernel's octal escaping (\040 etc.).
func unescapeMountinfo(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// MountsUnder is exported for leak checks in tests and recovery tooling.
func MountsUnder(dir string) ([]string, error) { return mountsUnder(dir) }

func unmountUnder(dir string) error {
	mps, err := mountsUnder(dir)
	if err != nil {
		return err
	}
	var errs []error
	for _, mp := range mps {
		errs = append(errs, unmount(mp))
	}
	return errors.Join(errs...)
}

// unmount takes mp down now when nothing holds it, so its filesystem (and
// a loop device under it) is gone when it returns. When something (a dying
// runtime helper, a sandbox stacked on a layer) still holds it, it is
// detached, and the kernel frees it when the last user goes. One that is
// not mounted is fine.
func unmount(mp string) error {
	err := unix.Unmount(mp, unix.UMOUNT_NOFOLLOW)
	if errors.Is(err, unix.EBUSY) {
		err = unix.Unmount(mp, unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW)
	}
	if err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("oci: unmount %s: %w", mp, err)
	}
	return nil
}

const cgroupRoot = "/sys/fs/cgroup"

func isCgroup2Unified() bool {
	_, err := os.Stat(filepath.Join(cgroupRoot, "cgroup.controllers"))
	return err == nil
}

// hybridWithV2Controllers: v1 controllers plus a unified hierarchy that
// also has controllers available.
func hybridWithV2Controllers() bool {
	if isCgroup2Unified() {
		return false
	}
	b, err := os.ReadFile(filepath.Join(cgroupRoot, "unified", "cgroup.controllers"))
	return err == nil && len(strings.TrimSpace(string(b))) > 0
}

// cgroupDir is the sandbox cgroup for a v1 controller (or the v2 dir on a
// pure-v2 host).
func cgroupDir(controller, parent, id string) string {
	if isCgroup2Unified() {
		return filepath.Join(cgroupRoot, parent, id)
	}
	return filepath.Join(cgroupRoot, controller, parent, id)
}

// CgroupHierarchies returns every mounted cgroup hierarchy root (v1
// controllers, named hierarchies and the unified one).
func CgroupHierarchies() []string {
	if isCgroup2Unified() {
		return []string{cgroupRoot}
	}
	ents, err := os.ReadDir(cgroupRoot)
	if err != nil {
		return nil
	}
	var out []string
	for _, e := range ents {
		p := filepath.Join(cgroupRoot, e.Name())
		if _, err := os.Stat(filepath.Join(p, "cgroup.procs")); err == nil && e.IsDir() {
			out = append(out, p)
		}
	}
	return out
}

// removeCgroups removes <hier>/<parent>/<id> (and any children) in every
// hierarchy; the runtime normally does this, but not after a crash.
func removeCgroups(parent, id string) error {
	var errs []error
	for _, h := range CgroupHierarchies() {
		if err := rmdirTree(filepath.Join(h, parent, id)); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// rmdirTree removes a cgroup dir bottom-up. cgroup dirs cannot be
// RemoveAll'ed (their files cannot be unlinked); rmdir may briefly fail with
// EBUSY while killed tasks exit, so retry a bounded number of times.
func rmdirTree(p string) error {
	ents, err := os.ReadDir(p)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	for _, e := range ents {
		if e.IsDir() {
			if err := rmdirTree(filepath.Join(p, e.Name())); err != nil {
				return err
			}
		}
	}
	for i := 0; ; i++ {
		err := unix.Rmdir(p)
		if err == nil || errors.Is(err, unix.ENOENT) {
			return nil
		}
		if i >= 100 || !errors.Is(err, unix.EBUSY) {
			return fmt.Errorf("oci: rmdir cgroup %s: %w", p, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// RemoveCgroupParent removes the (empty) parent cgroup in every hierarchy;
// for test cleanup and uninstall.
func RemoveCgroupParent(parent string) error {
	var errs []error
	for _, h := range CgroupHierarchies() {
		if err := rmdirTree(filepath.Join(h, strings.Trim(parent, "/"))); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func readUint(path string) (uint64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	s := strings.TrimSpace(string(b))
	if s == "max" {
		return 0, nil
	}
	return strconv.ParseUint(s, 10, 64)
}

func readKV(path, key string) (uint64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), " ")
		if ok && k == key {
			return strconv.ParseUint(strings.TrimSpace(v), 10, 64)
		}
	}
	return 0, sc.Err()
}

func readStats(parent, id string) (runtime.Stats, error) {
	var s runtime.Stats
	var err error
	notRunning := func(e error) (runtime.Stats, error) {
		if errors.Is(e, os.ErrNotExist) {
			return runtime.Stats{}, fmt.Errorf("%w: %s has no cgroup", runtime.ErrNotRunning, id)
		}
		return runtime.Stats{}, e
	}
	if isCgroup2Unified() {
		dir := filepath.Join(cgroupRoot, parent, id)
		if s.MemoryBytes, err = readUint(filepath.Join(dir, "memory.current")); err != nil {
			return notRunning(err)
		}
		if s.MemoryLimit, err = readUint(filepath.Join(dir, "memory.max")); err != nil {
			return notRunning(err)
		}
		if s.MemoryCache, err = readKV(filepath.Join(dir, "memory.stat"), "file"); err != nil {
			return notRunning(err)
		}
		usec, err := readKV(filepath.Join(dir, "cpu.stat"), "usage_usec")
		if err != nil {
			return notRunning(err)
		}
		s.CPUUsageNanos = usec * 1000
		if s.PIDs, err = readUint(filepath.Join(dir, "pids.current")); err != nil {
			return notRunning(err)
		}
		return s, nil
	}
	mem := filepath.Join(cgroupRoot, "memory", parent, id)
	if s.MemoryBytes, err = readUint(filepath.Join(mem, "memory.usage_in_bytes")); err != nil {
		return notRunning(err)
	}
	if s.MemoryLimit, err = readUint(filepath.Join(mem, "memory.limit_in_bytes")); err != nil {
		return notRunning(err)
	}
	if s.MemoryCache, err = readKV(filepath.Join(mem, "memory.stat"), "cache"); err != nil {
		return notRunning(err)
	}
	if s.CPUUsageNanos, err = readUint(filepath.Join(cgroupRoot, "cpuacct", parent, id, "cpuacct.usage")); err != nil {
		return notRunning(err)
	}
	if s.PIDs, err = readUint(filepath.Join(cgroupRoot, "pids", parent, id, "pids.current")); err != nil {
		return notRunning(err)
	}
	return s, nil
}

// seedFiles writes files into a fresh, empty upper dir, owned by the
// sandbox's root (owner: 0, or the first ID of its user-namespace range). The
// directories it creates are 0755 and shadow the image's attributes for
// those directories, which for /etc, /usr and the like are the same.
func seedFiles(upper string, files []runtime.File, owner int) error {
	for _, f := range files {
		rel := f.Path
		if !filepath.IsAbs(rel) || rel == "/" || rel != filepath.Clean(rel) {
			return fmt.Errorf("oci: seed file path %q is not absolute and clean", f.Path)
		}
		dst := filepath.Join(upper, rel)
		dir := filepath.Dir(dst)
		var made []string
		for p := dir; p != upper; p = filepath.Dir(p) {
			if _, err := os.Lstat(p); err == nil {
				break
			}
			made = append(made, p)
		}
		for i := len(made) - 1; i >= 0; i-- {
			if err := os.Mkdir(made[i], 0o755); err != nil {
				return err
			}
			if err := os.Lchown(made[i], owner, owner); err != nil {
				return err
			}
		}
		mode := os.FileMode(f.Mode).Perm()
		if mode == 0 {
			mode = 0o644
		}
		// upper is new and written only here, so nothing in it is a symlink.
		if err := os.WriteFile(dst, f.Data, mode); err != nil {
			return err
		}
		if err := os.Chmod(dst, mode); err != nil {
			return err
		}
		if err := os.Lchown(dst, owner, owner); err != nil {
			return err
		}
	}
	return nil
}
