package diskstore_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/cubicle-dev/cubicle/internal/diskimage"
	"github.com/cubicle-dev/cubicle/internal/diskstore"
	"github.com/cubicle-dev/cubicle/internal/diskstore/diskstoretest"
	"github.com/cubicle-dev/cubicle/internal/testenv"
)

func tempBase(t *testing.T) string {
	t.Helper()
	testenv.RequireRoot(t, "loop devices, mounts")
	// Outside /tmp: tmpfs has no loop-backed images worth testing.
	base, err := os.MkdirTemp("/var/tmp", "cubicle-diskstore-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	return base
}

// A reflink store on a data dir that cannot clone (ext4 here) makes its
// XFS image once, and every disk is a clone of one blank per size: a
// formatted ext4 filesystem of exactly that size, independent of the
// others, that fills up with ENOSPC.
func TestReflinkStoreClonesBlanks(t *testing.T) {
	base := tempBase(t)
	s := diskstoretest.Open(t, base)
	defer diskstoretest.Close(t, s)
	if s.Kind() != diskstore.Reflink || s.Reason() != "" {
		t.Fatalf("kind %s (%s), want reflink", s.Kind(), s.Reason())
	}
	ctx := context.Background()

	// Many at once of one size: one blank, every clone whole.
	var wg sync.WaitGroup
	errs := make([]error, 8)
	for i := range errs {
		wg.Go(func() { errs[i] = s.Create(ctx, s.Path(name(i)), 64) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("create %d: %v", i, err)
		}
	}
	blanks, _ := filepath.Glob(filepath.Join(s.Dir(), ".blank", "*"))
	if len(blanks) != 1 || filepath.Base(blanks[0]) != "64.img" {
		t.Fatalf("blanks %v, want one of 64 MiB", blanks)
	}
	if err := s.Create(ctx, s.Path(name(0)), 64); !errors.Is(err, os.ErrExist) {
		t.Fatalf("create over an existing disk: %v, want ErrExist", err)
	}

	// Two clones mounted: what one writes the other does not see, and a
	// write past the size fails with ENOSPC.
	mnts := make([]string, 2)
	for i := range mnts {
		mnts[i] = filepath.Join(base, "m"+name(i))
		if err := os.Mkdir(mnts[i], 0o700); err != nil {
			t.Fatal(err)
		}
		if err := diskimage.Mount(ctx, s.Path(name(i)), mnts[i]); err != nil {
			t.Fatal(err)
		}
		defer func() {
			if err := diskimage.Release(s.Path(name(i))); err != nil {
				t.Error(err)
			}
		}()
	}
	if err := os.WriteFile(filepath.Join(mnts[0], "mine"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(mnts[1], "mine")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a clone sees another's file: %v", err)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(mnts[1], &st); err != nil {
		t.Fatal(err)
	}
	if size := int64(st.Blocks) * st.Bsize; size < 56<<20 || size > 64<<20 {
		t.Fatalf("clone's filesystem is %d bytes, want about 64 MiB", size)
	}
	if err := fill(filepath.Join(mnts[1], "big"), 80<<20); !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("writing 80 MiB into 64: %v, want ENOSPC", err)
	}

	for i := range errs {
		if i >= len(mnts) {
			os.Remove(s.Path(name(i)))
		}
	}
	for i := range mnts {
		if err := diskimage.Release(s.Path(name(i))); err != nil {
			t.Fatal(err)
		}
		os.Remove(s.Path(name(i)))
	}

	// Opened again (a restart): the mounted store is used as it is, never
	// mounted twice, and the blank is kept.
	again := diskstoretest.Open(t, base)
	if again.Kind() != diskstore.Reflink {
		t.Fatalf("reopened store is %s", again.Kind())
	}
	if n := len(diskimage.LoopsOf(filepath.Join(base, "disk-store.img"))); n != 1 {
		t.Fatalf("store image attached %d times, want 1", n)
	}
	// Mounted before this Open: a failed start's Release leaves it to
	// the sandboxes that use it.
	if err := again.Release(); err != nil || !isXFS(again.Dir()) {
		t.Fatalf("Release of a store mounted before Open unmounted it (%v)", err)
	}
	if err := again.Create(ctx, again.Path("later"), 64); err != nil {
		t.Fatal(err)
	}
	os.Remove(again.Path("later"))
}

// Blanks are one per size, and sizes come from templates tenants build:
// the store keeps MaxBlanks of them, dropping the least recently used, and
// a disk cloned from a dropped blank keeps its data.
func TestBlanksBounded(t *testing.T) {
	base := tempBase(t)
	s := diskstoretest.Open(t, base)
	defer diskstoretest.Close(t, s)
	ctx := context.Background()
	first := s.Path("first")
	if err := s.Create(ctx, first, 16); err != nil {
		t.Fatal(err)
	}
	defer os.Remove(first)
	for i := range diskstore.MaxBlanks + 4 {
		p := s.Path(fmt.Sprint("d", i))
		if err := s.Create(ctx, p, 17+i); err != nil {
			t.Fatal(err)
		}
		os.Remove(p)
	}
	blanks, _ := filepath.Glob(filepath.Join(s.Dir(), ".blank", "*"))
	if len(blanks) != diskstore.MaxBlanks {
		t.Fatalf("%d blanks kept, want %d: %v", len(blanks), diskstore.MaxBlanks, blanks)
	}
	if _, err := os.Stat(filepath.Join(s.Dir(), ".blank", "16.img")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the least recently used blank was kept: %v", err)
	}
	if out, err := run(ctx, "dumpe2fs", "-h", first); err != nil || !strings.Contains(out, "Block count:") {
		t.Fatalf("a clone of a dropped blank: %v %s", err, out)
	}
}

// Auto falls back to formatting each image where the kernel has no xfs,
// or mkfs.xfs is missing, and says why; ModeReflink refuses there, and
// ModeImages never tries. The fallback's images are real ext4 images.
func TestFallbackToImages(t *testing.T) {
	base := tempBase(t)
	noXFS := filepath.Join(base, "filesystems")
	// /proc/filesystems' layout, without xfs or btrfs.
	if err := os.WriteFile(noXFS, []byte("nodev\tsysfs\nnodev\ttmpfs\n\text4\nnodev\toverlay\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, c := range []struct {
		name string
		cfg  diskstore.Config
		want string
	}{
		{"no xfs in the kernel", diskstore.Config{Filesystems: noXFS}, "no xfs"},
		{"no mkfs.xfs", diskstore.Config{MkfsXFS: filepath.Join(base, "missing", "mkfs.xfs")}, "xfsprogs"},
		{"no image configured", diskstore.Config{}, "no store image"},
	} {
		img := filepath.Join(base, strings.ReplaceAll(c.name, " ", "-")+"-disk.img")
		t.Run(c.name, func(t *testing.T) {
			cfg := c.cfg
			cfg.Dir = filepath.Join(base, strings.ReplaceAll(c.name, " ", "-"))
			if c.want != "no store image" {
				cfg.Image = cfg.Dir + ".img"
			}
			s, err := diskstore.Open(ctx, cfg)
			if err != nil {
				t.Fatal(err)
			}
			if s.Kind() != diskstore.Images || !strings.Contains(s.Reason(), c.want) {
				t.Fatalf("kind %s, reason %q; want images because %q", s.Kind(), s.Reason(), c.want)
			}
			if s.Path("sb") != "" || s.DisksDir() != "" {
				t.Fatalf("an images store names paths: %q %q", s.Path("sb"), s.DisksDir())
			}
			if _, err := os.Stat(cfg.Image); cfg.Image != "" && !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("a failed store left its image: %v", err)
			}
			if err := s.Create(ctx, img, 16); err != nil {
				t.Fatal(err)
			}
			if out, err := run(ctx, "dumpe2fs", "-h", img); err != nil || !strings.Contains(out, "Block count:") {
				t.Fatalf("fallback image is not ext4: %v %s", err, out)
			}

			cfg.Mode = diskstore.ModeReflink
			if _, err := diskstore.Open(ctx, cfg); !errors.Is(err, diskstore.ErrUnsupported) {
				t.Fatalf("reflink mode on a host without it: %v, want ErrUnsupported", err)
			}
		})
	}
	s, err := diskstore.Open(ctx, diskstore.Config{Dir: filepath.Join(base, "img"), Image: filepath.Join(base, "img.img"), Mode: diskstore.ModeImages})
	if err != nil || s.Kind() != diskstore.Images {
		t.Fatalf("images mode: %v %v", s, err)
	}
	if _, err := os.Stat(filepath.Join(base, "img.img")); !errors.Is(err, os.ErrNotExist) {
		t.Fatal("images mode made a store image")
	}
	if _, err := diskstore.ParseMode("zfs"); err == nil {
		t.Fatal("ParseMode took zfs")
	}
}

func run(ctx context.Context, name string, args ...string) (string, error) {
	out, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
	return string(out), err
}

func isXFS(dir string) bool {
	var st unix.Statfs_t
	return unix.Statfs(dir, &st) == nil && st.Type == unix.XFS_SUPER_MAGIC
}

// A start that fails after Open releases the store image it mounted.
func TestReleaseUndoesOwnMount(t *testing.T) {
	base := tempBase(t)
	s := diskstoretest.Open(t, base)
	if !isXFS(s.Dir()) {
		t.Fatal("store not mounted")
	}
	if err := s.Release(); err != nil {
		t.Fatal(err)
	}
	if isXFS(s.Dir()) {
		t.Fatal("Release left the store image mounted")
	}
	diskstoretest.Close(t, s)
}

func name(i int) string { return "sb" + string(rune('a'+i)) }

// fill writes n bytes of zeros to p, returning the first error.
func fill(p string, n int) error {
	f, err := os.Create(p)
	if err != nil {
		return err
	}
	defer f.Close()
	buf := make([]byte, 1<<20)
	for n > 0 {
		if _, err := f.Write(buf); err != nil {
			return err
		}
		n -= len(buf)
	}
	return f.Sync()
}
