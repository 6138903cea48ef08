package oci

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/cubicle-dev/cubicle/internal/runtime"
)

// Binds over /proc and /sys files (lxcfs's views) land on the sandbox's
// procfs and sysfs: prepareRootfs makes no mountpoint for them in the image.
func TestPrepareRootfsKernelFSMounts(t *testing.T) {
	rootfs, src := t.TempDir(), filepath.Join(t.TempDir(), "meminfo")
	if err := os.WriteFile(src, []byte("MemTotal: 1 kB\n"), 0o444); err != nil {
		t.Fatal(err)
	}
	err := prepareRootfs(rootfs, []runtime.Mount{
		{Source: src, Destination: "/proc/meminfo", ReadOnly: true},
		{Source: src, Destination: "/sys/devices/system/cpu/online", ReadOnly: true},
		{Source: src, Destination: "/etc/resolv.conf", ReadOnly: true},
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"proc", "sys"} {
		if _, err := os.Lstat(filepath.Join(rootfs, p)); !os.IsNotExist(err) {
			t.Errorf("prepareRootfs made %s in the image (%v)", p, err)
		}
	}
	if _, err := os.Stat(filepath.Join(rootfs, "etc/resolv.conf")); err != nil {
		t.Errorf("ordinary file mountpoint: %v", err)
	}
	// A missing source is still refused, under /proc as anywhere.
	if err := prepareRootfs(rootfs, []runtime.Mount{{Source: "/nonexistent", Destination: "/proc/meminfo"}}); err == nil {
		t.Error("missing mount source accepted")
	}
	for _, c := range []struct {
		dst  string
		want bool
	}{{"/proc/meminfo", true}, {"/sys/devices/system/cpu/online", true}, {"/proc", false}, {"/procfoo/x", false}, {"/etc/x", false}} {
		if got := inKernelFS(c.dst); got != c.want {
			t.Errorf("inKernelFS(%s) = %v", c.dst, got)
		}
	}
}
