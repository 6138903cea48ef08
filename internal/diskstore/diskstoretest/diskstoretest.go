// Package diskstoretest opens reflink disk stores for tests, on an XFS
// image in the test's own dir, and takes them down again.
package diskstoretest

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cubicle-dev/cubicle/internal/diskimage"
	"github.com/cubicle-dev/cubicle/internal/diskstore"
)

// ImageBytes is a test store's size: room for the suites' sparse disks.
const ImageBytes = 64 << 30

// Open makes a reflink store under base (dir disk-store, image
// disk-store.img). CI's hosts have xfs and mkfs.xfs (scripts/install), so
// a host without them fails the test rather than skipping it. Close takes
// it down; callers call it once nothing uses the store.
func Open(tb testing.TB, base string) *diskstore.Store {
	tb.Helper()
	s, err := diskstore.Open(context.Background(), diskstore.Config{
		Dir: filepath.Join(base, "disk-store"), Image: filepath.Join(base, "disk-store.img"),
		ImageBytes: ImageBytes, Mode: diskstore.ModeReflink,
	})
	if err != nil {
		tb.Fatal(err)
	}
	return s
}

// Close unmounts s's image (when Open mounted one) and checks that its
// loop device went with it and no disk image was left.
func Close(tb testing.TB, s *diskstore.Store) {
	tb.Helper()
	for _, dir := range []string{s.DisksDir(), filepath.Dir(s.Scratch("x")), filepath.Dir(s.Layer("x"))} {
		if ents, err := os.ReadDir(dir); err == nil && len(ents) > 0 {
			tb.Errorf("diskstore: %d images left in %s", len(ents), dir)
		}
	}
	if err := unix.Unmount(s.Dir(), 0); err != nil && !errors.Is(err, unix.EINVAL) {
		tb.Errorf("diskstore: unmount %s: %v", s.Dir(), err)
		return
	}
	img := filepath.Join(filepath.Dir(s.Dir()), "disk-store.img")
	// The loop device clears itself on its last close, which may trail
	// the unmount (seconds on a loaded host: the release of the loop
	// devices of clones inside the store comes first).
	devs := diskimage.LoopsOf(img)
	for i := 0; i < 1000 && len(devs) > 0; i++ {
		time.Sleep(10 * time.Millisecond)
		devs = diskimage.LoopsOf(img)
	}
	if len(devs) > 0 {
		tb.Errorf("diskstore: loop devices left for %s: %v", img, devs)
	}
}
