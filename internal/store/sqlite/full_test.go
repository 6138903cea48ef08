package sqlite

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cubicle-dev/cubicle/internal/diskimage"
	"github.com/cubicle-dev/cubicle/internal/store"

	"github.com/cubicle-dev/cubicle/internal/testenv"
)

// A full filesystem fails the store's writes but never corrupts it: once
// space is back, the database passes integrity_check and holds every row
// whose write succeeded, and none of the failed ones. The store lives on a
// real 8 MiB ext4 image filled to the last block, as the data filesystem
// would be if sandboxes and the reserve were all used up.
func TestFullDiskKeepsStore(t *testing.T) {
	testenv.RequireRoot(t, "to mount an image")
	ctx := context.Background()
	dir := t.TempDir()
	img, mnt := filepath.Join(dir, "fs.img"), filepath.Join(dir, "mnt")
	if err := os.Mkdir(mnt, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := diskimage.Create(ctx, img, 8); err != nil {
		t.Fatal(err)
	}
	if err := diskimage.Mount(ctx, img, mnt); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := diskimage.Release(img); err != nil {
			t.Error(err)
		}
	})
	path := filepath.Join(mnt, "cubicle.db")
	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	// Fill what is left, as runaway sandbox images would.
	filler, err := os.Create(filepath.Join(mnt, "filler"))
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64<<10)
	for {
		if _, err := filler.Write(buf); err != nil {
			break
		}
	}
	filler.Close()
	written, failed := 0, 0
	blob := strings.Repeat("x", 1000)
	for i := 0; i < 20000 && failed < 20; i++ {
		err := s.CreateVolume(ctx, &store.Volume{ID: fmt.Sprint("v", i), TeamID: store.DefaultTeamID, Name: fmt.Sprint("v", i),
			Driver: "local", State: store.VolumeReady, PrivateData: blob})
		if err != nil {
			failed++
			continue
		}
		written++
	}
	if failed == 0 {
		t.Fatal("the store never ran out of space")
	}
	s.Close()
	if err := os.Remove(filepath.Join(mnt, "filler")); err != nil {
		t.Fatal(err)
	}
	s, err = Open(path)
	if err != nil {
		t.Fatalf("reopen after the disk filled: %v", err)
	}
	defer s.Close()
	var check string
	if err := s.db.QueryRowContext(ctx, `PRAGMA integrity_check`).Scan(&check); err != nil || check != "ok" {
		t.Fatalf("integrity_check: %q %v", check, err)
	}
	vs, err := s.ListVolumes(ctx)
	if err != nil || len(vs) != written {
		t.Fatalf("after the disk filled: %d volumes (%v), want the %d whose writes succeeded", len(vs), err, written)
	}
	if err := s.CreateVolume(ctx, &store.Volume{ID: "after", TeamID: store.DefaultTeamID, Name: "after", Driver: "local", State: store.VolumeReady}); err != nil {
		t.Fatalf("write with space back: %v", err)
	}
}
