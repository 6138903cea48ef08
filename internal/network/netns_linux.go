//go:build linux

package network

import (
	"errors"
	"fmt"
	"os"
	"runtime"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// RunInNetns runs fn on an OS thread switched into the network namespace
// at path (a bind-mounted netns file or /proc/<pid>/ns/net). The calling
// goroutine's namespace is never changed: fn runs on a dedicated goroutine
// whose thread is restored afterwards, or discarded if restoring fails.
// Goroutines started by fn do NOT inherit the namespace, but sockets opened
// by fn stay in it (a listener created in fn can be served from anywhere).
func RunInNetns(path string, fn func() error) error {
	target, err := netns.GetFromPath(path)
	if err != nil {
		return fmt.Errorf("network: open netns %s: %w", path, err)
	}
	defer target.Close()
	return runOnNetnsThread(func() error {
		if err := netns.Set(target); err != nil {
			return fmt.Errorf("network: setns %s: %w", path, err)
		}
		return fn()
	})
}

// runOnNetnsThread runs fn on a locked thread and puts that thread back into
// the original netns afterwards. If that fails the thread stays locked so
// the Go runtime terminates it when the goroutine exits, rather than reusing
// a thread that sits in the wrong namespace.
func runOnNetnsThread(fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("network: get current netns: %w", err)
			return
		}
		defer orig.Close()
		ferr := fn()
		if err := netns.Set(orig); err != nil {
			errc <- errors.Join(ferr, fmt.Errorf("network: restore netns: %w", err))
			return // thread stays locked and dies with this goroutine
		}
		runtime.UnlockOSThread()
		errc <- ferr
	}()
	return <-errc
}

// createNetns makes a new network namespace and bind-mounts it at path.
func createNetns(path string) error {
	f, err := os.OpenFile(path, os.O_RDONLY|os.O_CREATE|os.O_EXCL, 0o444)
	if err != nil {
		if errors.Is(err, os.ErrExist) {
			return ErrExists
		}
		return fmt.Errorf("network: create netns file: %w", err)
	}
	f.Close()
	err = runOnNetnsThread(func() error {
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			return fmt.Errorf("network: unshare netns: %w", err)
		}
		src := fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid())
		if err := unix.Mount(src, path, "none", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("network: bind netns: %w", err)
		}
		// Sandboxes get IPv4 only; disabling IPv6 removes link-local paths
		// that the IPv4 nftables policy would not cover.
		for _, k := range []string{"all", "default", "lo"} {
			_ = os.WriteFile("/proc/sys/net/ipv6/conf/"+k+"/disable_ipv6", []byte("1"), 0o644)
		}
		// Sandboxes have no CAP_NET_RAW; ping works through unprivileged
		// ICMP datagram sockets, which this per-netns sysctl opens to every gid.
		if err := os.WriteFile("/proc/sys/net/ipv4/ping_group_range", []byte("0 2147483647"), 0o644); err != nil {
			return fmt.Errorf("network: ping_group_range: %w", err)
		}
		return nil
	})
	if err != nil {
		_ = deleteNetns(path)
		return err
	}
	return nil
}

// deleteNetns unmounts and removes a netns file; missing is fine.
func deleteNetns(path string) error {
	if err := unix.Unmount(path, unix.MNT_DETACH); err != nil &&
		!errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("network: unmount netns %s: %w", path, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("network: remove netns %s: %w", path, err)
	}
	return nil
}

// isNetnsMount reports whether path is a mounted network namespace.
func isNetnsMount(path string) bool {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return false
	}
	return uint32(st.Type) == uint32(unix.NSFS_MAGIC)
}
