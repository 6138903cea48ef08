package buildkit

import (
	"fmt"
	"os"
	"path/filepath"
	"syscall"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// sysProcAttr puts buildkitd in a new user and mount namespace, as root
// inside and UserNSBase.. outside. Credential makes it uid 0 inside (an
// unmapped uid would read as nobody and BuildKit would refuse rootless
// mode). setgroups is allowed, as in a sandbox's namespace: the whole
// 65536 range is the builder's, so dropping groups gains nothing, and RUN
// steps need it (apt drops to _apt with setgroups).
func (d *Daemon) sysProcAttr() *syscall.SysProcAttr {
	m := []syscall.SysProcIDMap{{ContainerID: 0, HostID: int(d.cfg.UserNSBase), Size: UserNSSize}}
	return &syscall.SysProcAttr{
		Cloneflags:  unix.CLONE_NEWUSER | unix.CLONE_NEWNS,
		UidMappings: m, GidMappings: m, GidMappingsEnableSetgroups: true,
		Credential: &syscall.Credential{Uid: 0, Gid: 0, NoSetGroups: true},
		Setpgid:    true,
		Pdeathsig:  syscall.SIGKILL,
	}
}

// env is buildkitd's environment: serve's, with HOME and XDG_RUNTIME_DIR
// under Root (the host root's are not the mapped root's to write) and
// runc's directory first on PATH.
func (d *Daemon) env() []string {
	var out []string
	for _, kv := range os.Environ() {
		switch {
		case hasKey(kv, "HOME"), hasKey(kv, "XDG_RUNTIME_DIR"), hasKey(kv, "PATH"), hasKey(kv, "TMPDIR"):
			continue
		}
		out = append(out, kv)
	}
	return append(out,
		"HOME="+d.cfg.Root,
		"XDG_RUNTIME_DIR="+filepath.Join(d.cfg.Root, "run"),
		// Its own temp dir: the mapped root may not write the host's /tmp
		// (a host whose /tmp is not 1777), and it should not share it.
		"TMPDIR="+filepath.Join(d.cfg.Root, "tmp"),
		"PATH="+filepath.Dir(d.cfg.OCIBinary)+":"+os.Getenv("PATH"))
}

func hasKey(kv, k string) bool { return len(kv) > len(k) && kv[:len(k)] == k && kv[len(k)] == '=' }

// prepareRoot makes root a directory the mapped root owns. A state dir
// owned by anyone else (a buildkitd that ran as host root before) is
// only a build cache: it is unmounted and removed rather than chowned,
// since its snapshots hold files of every uid.
func prepareRoot(root string, uid int) error {
	fi, err := os.Stat(root)
	switch {
	case err == nil:
		if st, ok := fi.Sys().(*syscall.Stat_t); ok && int(st.Uid) != uid {
			if err := UnmountUnder(root); err != nil {
				return err
			}
			if err := os.RemoveAll(root); err != nil {
				return fmt.Errorf("buildkit: drop state dir of a root buildkitd: %w", err)
			}
		}
	case !os.IsNotExist(err):
		return err
	}
	for _, dir := range []string{root, filepath.Join(root, "run")} {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return err
		}
		if err := os.Chown(dir, uid, uid); err != nil {
			return err
		}
	}
	// The mapped root must be able to walk to root: every parent needs
	// search permission for others.
	for dir := filepath.Dir(root); ; dir = filepath.Dir(dir) {
		fi, err := os.Stat(dir)
		if err != nil {
			return err
		}
		if fi.Mode().Perm()&0o001 == 0 {
			return fmt.Errorf("buildkit: %s (mode %v) is not searchable by the builder's unprivileged uid %d; make it o+x or move --data-dir", dir, fi.Mode().Perm(), uid)
		}
		if dir == "/" {
			return nil
		}
	}
}

// checkNetNS: path names a network namespace (an nsfs file).
func checkNetNS(path string) error {
	if path == "" {
		return ErrNoNetNS
	}
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return fmt.Errorf("%w: %s: %v", ErrNoNetNS, path, err)
	}
	if st.Type != unix.NSFS_MAGIC {
		return fmt.Errorf("%w: %s is not a namespace file", ErrNoNetNS, path)
	}
	return nil
}

// enterNetNS switches the calling (locked) thread into the netns at path.
func enterNetNS(path string) error {
	h, err := netns.GetFromPath(path)
	if err != nil {
		return fmt.Errorf("%w: %s: %v", ErrNoNetNS, path, err)
	}
	defer h.Close()
	if err := netns.Set(h); err != nil {
		return fmt.Errorf("buildkit: enter %s: %w", path, err)
	}
	return nil
}
