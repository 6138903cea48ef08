package oci

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cubicle-dev/cubicle/internal/runtime"
	"github.com/cubicle-dev/cubicle/internal/runtime/runtimetest"
	"github.com/cubicle-dev/cubicle/internal/testenv"
)

// TestLayerClean: a clone's upper is cleaned in place as copyLayer would
// copy it: sockets and device nodes go, whiteouts, fifos, symlinks and
// files stay, the overlay's upper bookkeeping xattrs go while opaque
// markers and other xattrs stay; nothing is followed out of the tree.
func TestLayerClean(t *testing.T) {
	testenv.RequireRoot(t, "mknod and trusted xattrs")
	base, err := os.MkdirTemp("/var/tmp", "cubicle-layerclean-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	up := filepath.Join(base, "upper")
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(up, "d", "opaque"), 0o755))
	must(os.WriteFile(filepath.Join(up, "d", "file"), []byte(strings.Repeat("x", 8192)), 0o644))
	must(unix.Setxattr(filepath.Join(up, "d", "file"), "trusted.overlay.origin", []byte("o"), 0))
	must(unix.Setxattr(filepath.Join(up, "d", "file"), "user.keep", []byte("k"), 0))
	must(unix.Setxattr(filepath.Join(up, "d"), "trusted.overlay.impure", []byte("y"), 0))
	must(unix.Setxattr(filepath.Join(up, "d", "opaque"), "trusted.overlay.opaque", []byte("y"), 0))
	must(unix.Mknod(filepath.Join(up, "d", "whiteout"), unix.S_IFCHR, 0))
	must(unix.Mknod(filepath.Join(up, "d", "null"), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))))
	must(unix.Mknod(filepath.Join(up, "d", "blk"), unix.S_IFBLK|0o600, int(unix.Mkdev(7, 0))))
	must(unix.Mkfifo(filepath.Join(up, "d", "fifo"), 0o644))
	must(os.Symlink("/etc/passwd", filepath.Join(up, "d", "link")))
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM, 0)
	must(err)
	must(unix.Bind(fd, &unix.SockaddrUnix{Name: filepath.Join(up, "d", "sock")}))
	unix.Close(fd)
	hostBefore, _ := listXattrs("/etc/passwd")

	n, err := layerClean(up)
	if err != nil {
		t.Fatal(err)
	}
	if n < 8192 {
		t.Errorf("charged %d bytes, want at least the file's 8192", n)
	}
	for _, gone := range []string{"null", "blk", "sock"} {
		if _, err := os.Lstat(filepath.Join(up, "d", gone)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s kept: %v", gone, err)
		}
	}
	for _, kept := range []string{"whiteout", "fifo", "link", "file", "opaque"} {
		if _, err := os.Lstat(filepath.Join(up, "d", kept)); err != nil {
			t.Errorf("%s: %v", kept, err)
		}
	}
	has := func(p, x string) bool {
		_, err := getXattr(p, x)
		return err == nil
	}
	if has(filepath.Join(up, "d", "file"), "trusted.overlay.origin") || has(filepath.Join(up, "d"), "trusted.overlay.impure") {
		t.Error("the overlay's upper bookkeeping stayed")
	}
	if !has(filepath.Join(up, "d", "file"), "user.keep") || !has(filepath.Join(up, "d", "opaque"), "trusted.overlay.opaque") {
		t.Error("an xattr a lower layer needs went")
	}
	if hostAfter, _ := listXattrs("/etc/passwd"); len(hostAfter) != len(hostBefore) {
		t.Error("the symlink's target was touched")
	}

	// Deeper than the walk goes: refused, for the snapshot to copy.
	deep := filepath.Join(base, "deep")
	p := deep
	for range maxCleanDepth + 2 {
		p = filepath.Join(p, "a")
	}
	must(os.MkdirAll(p, 0o755))
	if _, err := layerClean(deep); !errors.Is(err, errLayerTooDeep) {
		t.Fatalf("layerClean of %d levels = %v, want errLayerTooDeep", maxCleanDepth+2, err)
	}
}

// TestSnapshotIsDiskClone: on the reflink store, a snapshot of a
// user-namespaced sandbox is a clone of its disk, mounted read-only as
// its layer, with the sandbox's data; a sandbox stacked on it keeps it
// after DeleteSnapshot, which leaves no mount, image or dir.
func TestSnapshotIsDiskClone(t *testing.T) {
	env := newTestEnvOpts(t, "runc", envOpts{userns: true, reflink: true})
	d, ctx := env.d, context.Background()
	out := filepath.Join(env.base, "out")
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.Mkdir(out, 0o777))
	must(os.Chmod(out, 0o777))
	a := runtimetest.NewID(t)
	t.Cleanup(func() { d.Delete(context.Background(), a) })
	_, err := d.Create(ctx, runtime.Spec{ID: a, Layers: env.layers,
		Args: []string{"/bin/sh", "-c", "dd if=/dev/urandom of=/big bs=1M count=48 2>/dev/null && md5sum /big > /out/sum && " +
			"while [ ! -e /out/deep ]; do sleep 0.05; done; p=/d; i=0; while [ $i -lt 300 ]; do p=$p/a; i=$((i+1)); done; mkdir -p $p && echo deep > $p/f && sync && echo ok > /out/deepdone; exec sleep 3600"},
		Mounts:    []runtime.Mount{{Source: out, Destination: "/out"}},
		Resources: runtime.Resources{CPUCount: 1, MemoryMB: 64, PIDs: 16, DiskMB: 128}})
	must(err)
	sum := strings.Fields(string(runtimetest.WaitFile(t, filepath.Join(out, "sum"), 60*time.Second)))[0]

	snap := filepath.Join(env.base, "snap")
	info, err := d.Snapshot(ctx, a, snap, false)
	must(err)
	t.Cleanup(func() { d.DeleteSnapshot(context.Background(), snap) })
	if mounted, err := isMountPoint(info.Layer); err != nil || !mounted {
		t.Fatalf("layer %s is a mount: %v, %v; want a clone of the disk", info.Layer, mounted, err)
	}
	if _, err := os.Stat(d.layerImage(snap)); err != nil {
		t.Fatal(err)
	}
	if info.SizeBytes < 48<<20 || info.SizeBytes > 128<<20 {
		t.Errorf("SizeBytes %d, want the 48 MiB written", info.SizeBytes)
	}
	if err := os.WriteFile(filepath.Join(info.Layer, "x"), nil, 0o644); !errors.Is(err, unix.EROFS) {
		t.Errorf("write into the layer: %v, want EROFS", err)
	}

	out2 := filepath.Join(env.base, "out2")
	must(os.Mkdir(out2, 0o777))
	must(os.Chmod(out2, 0o777))
	b := runtimetest.NewID(t)
	t.Cleanup(func() { d.Delete(context.Background(), b) })
	_, err = d.Create(ctx, runtime.Spec{ID: b, Layers: append([]string{info.Layer}, env.layers...),
		Args:      []string{"/bin/sh", "-c", "md5sum /big > /out/sum; while [ ! -e /out/go ]; do sleep 0.05; done; md5sum /big > /out/sum2; exec sleep 3600"},
		Mounts:    []runtime.Mount{{Source: out2, Destination: "/out"}},
		Resources: runtime.Resources{CPUCount: 1, MemoryMB: 64, PIDs: 16, DiskMB: 64}})
	must(err)
	if got := strings.Fields(string(runtimetest.WaitFile(t, filepath.Join(out2, "sum"), 30*time.Second))); len(got) == 0 || got[0] != sum {
		t.Fatalf("from the snapshot: %q, want %s", got, sum)
	}

	// A tree too deep to clean in place is copied, from a clone that
	// goes once the copy is done.
	must(os.WriteFile(filepath.Join(out, "deep"), nil, 0o644))
	deepSnap := filepath.Join(env.base, "snap-deep")
	runtimetest.WaitFile(t, filepath.Join(out, "deepdone"), 30*time.Second)
	dinfo, err := d.Snapshot(ctx, a, deepSnap, false)
	must(err)
	t.Cleanup(func() { d.DeleteSnapshot(context.Background(), deepSnap) })
	if mounted, _ := isMountPoint(dinfo.Layer); mounted {
		t.Error("a layer too deep to clean is a mount, want a copy")
	}
	if _, err := os.Stat(d.layerImage(deepSnap)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the deep snapshot's clone: %v, want removed after the copy", err)
	}
	if b, err := os.ReadFile(filepath.Join(dinfo.Layer, "d", strings.Repeat("a/", 300)+"f")); err != nil || string(b) != "deep\n" {
		t.Errorf("deep file in the copied layer: %q, %v", b, err)
	}
	if mps, _ := MountsUnder(deepSnap); len(mps) > 0 {
		t.Errorf("mounts left under the deep snapshot: %v", mps)
	}

	must(d.DeleteSnapshot(ctx, snap))
	if _, err := os.Lstat(snap); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("snapshot dir after DeleteSnapshot: %v", err)
	}
	if _, err := os.Lstat(d.layerImage(snap)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("layer image after DeleteSnapshot: %v", err)
	}
	must(os.WriteFile(filepath.Join(out2, "go"), nil, 0o644))
	if got := strings.Fields(string(runtimetest.WaitFile(t, filepath.Join(out2, "sum2"), 30*time.Second))); len(got) == 0 || got[0] != sum {
		t.Fatalf("after the snapshot's delete: %q, want %s", got, sum)
	}
}
