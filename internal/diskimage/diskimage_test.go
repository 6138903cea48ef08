package diskimage_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cubicle-dev/cubicle/internal/diskimage"
	"github.com/cubicle-dev/cubicle/internal/diskstore/diskstoretest"
	"github.com/cubicle-dev/cubicle/internal/testenv"
)

// Images are attached with direct I/O (Create's on the reflink store's
// XFS), and an image made with 1 KiB blocks, as Create made small ones
// before, still mounts: the loop device takes the filesystem's block size.
func TestMountDirectIO(t *testing.T) {
	testenv.RequireRoot(t, "loop devices, mounts")
	base, err := os.MkdirTemp("/var/tmp", "cubicle-diskimage-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(base)
	s := diskstoretest.Open(t, base)
	defer diskstoretest.Close(t, s)
	ctx := context.Background()

	fresh := filepath.Join(s.DisksDir(), "fresh.img")
	if err := diskimage.Create(ctx, fresh, 32); err != nil {
		t.Fatal(err)
	}
	old := filepath.Join(s.DisksDir(), "old.img")
	if err := os.WriteFile(old, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(old, 32<<20); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mkfs.ext4", "-q", "-F", "-b", "1024", "-O", "^has_journal", old).CombinedOutput(); err != nil {
		t.Fatalf("mkfs: %v %s", err, out)
	}
	for _, img := range []string{fresh, old} {
		mnt := img + ".mnt"
		if err := os.Mkdir(mnt, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := diskimage.Mount(ctx, img, mnt); err != nil {
			t.Fatalf("mount %s: %v", filepath.Base(img), err)
		}
		if err := os.WriteFile(filepath.Join(mnt, "f"), []byte("x"), 0o600); err != nil {
			t.Error(err)
		}
		devs := diskimage.LoopsOf(img)
		if len(devs) != 1 {
			t.Fatalf("%s attached to %v", filepath.Base(img), devs)
		}
		dio, _ := os.ReadFile(filepath.Join("/sys/block", devs[0], "loop", "dio"))
		if got := strings.TrimSpace(string(dio)); img == fresh && got != "1" {
			t.Errorf("%s: loop dio = %q, want 1", filepath.Base(img), got)
		}
		if err := diskimage.Release(img); err != nil {
			t.Fatal(err)
		}
		os.Remove(mnt)
		os.Remove(img)
	}
}
