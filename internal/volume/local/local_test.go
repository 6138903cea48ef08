package local_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/cubicle-dev/cubicle/internal/diskimage"
	"github.com/cubicle-dev/cubicle/internal/testenv"
	"github.com/cubicle-dev/cubicle/internal/volume"
	"github.com/cubicle-dev/cubicle/internal/volume/internal/mountinfo"
	"github.com/cubicle-dev/cubicle/internal/volume/local"
	"github.com/cubicle-dev/cubicle/internal/volume/plugintest"
)

// dirs returns a data root and a base dir, and unmounts anything left under
// the base dir before t.TempDir's removal runs (cleanups run last-first).
func dirs(t *testing.T) (root, base string) {
	t.Helper()
	testenv.RequireRoot(t, "bind mounts")
	root, base = t.TempDir(), t.TempDir()
	t.Cleanup(func() {
		mps, err := mountinfo.Under(base)
		if err != nil {
			t.Error(err)
		}
		for _, mp := range mps {
			t.Errorf("left mounted: %s", mp)
			_ = unix.Unmount(mp, unix.MNT_DETACH)
		}
	})
	return root, base
}

func TestConformance(t *testing.T) {
	root, base := dirs(t)
	plugintest.Run(t, local.New(filepath.Join(root, "volumes")), plugintest.Options{BaseDir: base, ProbeFiles: true})
}

func TestLifecycle(t *testing.T) {
	root, base := dirs(t)
	ctx := context.Background()
	p := local.New(root)
	if _, err := p.Create(ctx, volume.CreateRequest{VolumeID: "v1", Name: "v1"}); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(filepath.Join(root, "v1"))
	if err != nil || fi.Mode().Perm() != 0o777 {
		t.Fatalf("data dir: %v %v", fi, err)
	}
	// Create is idempotent and keeps data.
	if err := os.WriteFile(filepath.Join(root, "v1", "f"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Create(ctx, volume.CreateRequest{VolumeID: "v1", Name: "v1"}); err != nil {
		t.Fatal(err)
	}

	att := volume.AttachRequest{SandboxID: "s1", Namespace: volume.Namespace, VolumeID: "v1", VolumeBaseDir: base}
	res, err := p.Attach(ctx, att)
	if err != nil {
		t.Fatal(err)
	}
	if res.HostPath != filepath.Join(base, "local-v1") || res.Metadata["mount_dir"] != res.HostPath {
		t.Fatalf("attach result %+v", res)
	}
	if b, err := os.ReadFile(filepath.Join(res.HostPath, "f")); err != nil || string(b) != "x" {
		t.Fatalf("data not visible through host_path: %q %v", b, err)
	}
	// A second refCount=0 attach (node restarted and lost its count) must
	// reuse the mount, not stack another.
	if _, err := p.Attach(ctx, att); err != nil {
		t.Fatal(err)
	}
	if n := countMounts(t, res.HostPath); n != 1 {
		t.Fatalf("%d mounts on %s, want 1", n, res.HostPath)
	}
	det := volume.DetachRequest{SandboxID: "s1", Namespace: volume.Namespace, VolumeID: "v1", Metadata: res.Metadata}
	// refCount>0: others still hold it, nothing changes.
	det.RefCount = 1
	if err := p.Detach(ctx, det); err != nil {
		t.Fatal(err)
	}
	if n := countMounts(t, res.HostPath); n != 1 {
		t.Fatalf("detach(refCount=1) unmounted")
	}
	det.RefCount = 0
	if err := p.Detach(ctx, det); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(res.HostPath); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("host_path still there after last detach: %v", err)
	}
	// Detach is idempotent.
	if err := p.Detach(ctx, det); err != nil {
		t.Fatal(err)
	}
	// Data survives detach; destroy removes it, twice.
	if _, err := os.Stat(filepath.Join(root, "v1", "f")); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := p.Destroy(ctx, volume.DestroyRequest{VolumeID: "v1"}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := os.Stat(filepath.Join(root, "v1")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("data dir survives destroy: %v", err)
	}
}

func TestAttachRemountsIfNotMounted(t *testing.T) {
	root, base := dirs(t)
	ctx := context.Background()
	p := local.New(root)
	if _, err := p.Create(ctx, volume.CreateRequest{VolumeID: "v"}); err != nil {
		t.Fatal(err)
	}
	// refCount>0 but the mount is gone (someone unmounted it): mount again.
	res, err := p.Attach(ctx, volume.AttachRequest{SandboxID: "s", VolumeID: "v", RefCount: 3, VolumeBaseDir: base})
	if err != nil {
		t.Fatal(err)
	}
	if n := countMounts(t, res.HostPath); n != 1 {
		t.Fatalf("%d mounts", n)
	}
	if err := p.Detach(ctx, volume.DetachRequest{SandboxID: "s", VolumeID: "v", Metadata: res.Metadata}); err != nil {
		t.Fatal(err)
	}
}

func TestRejects(t *testing.T) {
	root, base := dirs(t)
	ctx := context.Background()
	p := local.New(root)
	for _, id := range []string{"", "..", "../x", "a/b", "."} {
		if _, err := p.Create(ctx, volume.CreateRequest{VolumeID: id}); !errors.Is(err, volume.ErrPlugin) {
			t.Errorf("create %q: %v", id, err)
		}
		if err := p.Destroy(ctx, volume.DestroyRequest{VolumeID: id}); !errors.Is(err, volume.ErrPlugin) {
			t.Errorf("destroy %q: %v", id, err)
		}
		if _, err := p.Attach(ctx, volume.AttachRequest{VolumeID: id, VolumeBaseDir: base}); !errors.Is(err, volume.ErrPlugin) {
			t.Errorf("attach %q: %v", id, err)
		}
	}
	// Attach of a volume never created.
	if _, err := p.Attach(ctx, volume.AttachRequest{VolumeID: "nope", VolumeBaseDir: base}); !errors.Is(err, volume.ErrPlugin) {
		t.Errorf("attach of missing volume: %v", err)
	}
	// Detach must not unmount a path that is not this volume's attach dir.
	for _, md := range []map[string]string{{"mount_dir": "/"}, {"mount_dir": filepath.Join(base, "local-other")}, {"mount_dir": "local-v"}} {
		if err := p.Detach(ctx, volume.DetachRequest{VolumeID: "v", Metadata: md}); !errors.Is(err, volume.ErrPlugin) {
			t.Errorf("detach with metadata %v: %v", md, err)
		}
	}
	// Without metadata (a crash before the attach was recorded) Detach finds
	// the volume's mount by name, and is a no-op when there is none.
	if _, err := p.Create(ctx, volume.CreateRequest{VolumeID: "v"}); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Attach(ctx, volume.AttachRequest{VolumeID: "v", VolumeBaseDir: base}); err != nil {
		t.Fatal(err)
	}
	if err := p.Detach(ctx, volume.DetachRequest{VolumeID: "v"}); err != nil {
		t.Fatalf("detach without metadata: %v", err)
	}
	if _, err := os.Lstat(filepath.Join(base, "local-v")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("detach without metadata left the mount dir: %v", err)
	}
	if err := p.Detach(ctx, volume.DetachRequest{VolumeID: "v"}); err != nil {
		t.Fatalf("second detach without metadata: %v", err)
	}
}

func countMounts(t *testing.T, path string) int {
	t.Helper()
	mps, err := mountinfo.Mountpoints()
	if err != nil {
		t.Fatal(err)
	}
	p, err := filepath.EvalSymlinks(path)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, mp := range mps {
		if mp == p {
			n++
		}
	}
	return n
}

// A sized volume left mounted (a node process that crashed before its
// detach) is unmounted and its loop device detached by Destroy, so the
// image's blocks are really freed; Images lists only sized volumes.
func TestSizedDestroyReleasesMount(t *testing.T) {
	root, base := dirs(t)
	ctx := context.Background()
	p := local.New(root)
	if _, err := p.Create(ctx, volume.CreateRequest{VolumeID: "big", Name: "big", SizeMB: 8}); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Create(ctx, volume.CreateRequest{VolumeID: "plain", Name: "plain"}); err != nil {
		t.Fatal(err)
	}
	imgs, err := local.Images(root)
	if err != nil || len(imgs) != 1 || imgs[0].VolumeID != "big" || imgs[0].Path != filepath.Join(root, "big.img") {
		t.Fatalf("Images = %+v, %v; want only big", imgs, err)
	}
	res, err := p.Attach(ctx, volume.AttachRequest{SandboxID: "s", Namespace: volume.Namespace, VolumeID: "big", VolumeBaseDir: base})
	if err != nil {
		t.Fatal(err)
	}
	ents, err := os.ReadDir(res.HostPath)
	if err != nil || len(ents) != 0 {
		t.Fatalf("a new sized volume lists %v (%v); want it empty (no lost+found)", ents, err)
	}
	if fi, err := os.Stat(res.HostPath); err != nil || fi.Mode().Perm() != 0o777 {
		t.Fatalf("sized volume root: %v %v; want 0777", fi, err)
	}
	if err := p.Destroy(ctx, volume.DestroyRequest{VolumeID: "big"}); err != nil {
		t.Fatal(err)
	}
	if m, _ := mountinfo.IsMountpoint(res.HostPath); m {
		t.Fatalf("%s still mounted after destroy", res.HostPath)
	}
	if loops := diskimage.LoopsUnder(root); len(loops) > 0 {
		t.Fatalf("loop devices left: %v", loops)
	}
	if _, err := os.Stat(filepath.Join(root, "big.img")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("image left: %v", err)
	}
	if err := p.Destroy(ctx, volume.DestroyRequest{VolumeID: "plain"}); err != nil {
		t.Fatal(err)
	}
	_ = os.Remove(res.HostPath)
}
