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
)

// A snapshot whose real data does not fit where it would go is refused
// with ErrSnapshotTooLarge and the reason, before the store fills, and
// leaves nothing behind: no snapshot dir, no bytes taken. The sandbox is
// left as it was and a snapshot with room still works. Here the store is
// a 16 MiB tmpfs and the sandbox wrote 24 MiB into its 64 MiB disk (the
// sandbox's own disk size is the other bound, which its ext4 image already
// keeps a live sandbox under; TestCopyLayerLimit covers the copy's side).
// runsc's sandbox is stopped first so that its snapshot is its files
// alone: a memory image is written by runsc itself before the copy.
func TestSnapshotRefusedLeavesNothing(t *testing.T) {
	for _, rt := range []string{"runc", "runsc"} {
		t.Run(rt, func(t *testing.T) {
			env := newTestEnv(t, rt)
			d, ctx := env.d, context.Background()
			out := filepath.Join(env.base, "out-"+rt)
			if err := os.Mkdir(out, 0o777); err != nil {
				t.Fatal(err)
			}
			id := runtimetest.NewID(t)
			t.Cleanup(func() { d.Delete(context.Background(), id) })
			if _, err := d.Create(ctx, runtime.Spec{ID: id, Layers: env.layers,
				Args:      []string{"/bin/sh", "-c", "dd if=/dev/urandom of=/blob bs=1M count=24 2>/dev/null && sync && touch /out/done; sleep 3600"},
				Mounts:    []runtime.Mount{{Source: out, Destination: "/out"}},
				Resources: runtime.Resources{CPUCount: 1, MemoryMB: 128, PIDs: 64, DiskMB: 64}}); err != nil {
				t.Fatal(err)
			}
			deadline := time.Now().Add(60 * time.Second)
			for _, err := os.Stat(filepath.Join(out, "done")); err != nil; _, err = os.Stat(filepath.Join(out, "done")) {
				if time.Now().After(deadline) {
					t.Fatal("the sandbox did not write its data")
				}
				time.Sleep(50 * time.Millisecond)
			}
			want := runtime.StateRunning
			if rt == "runsc" {
				if err := d.Stop(ctx, id); err != nil {
					t.Fatal(err)
				}
				want = runtime.StatePaused
			}

			small := filepath.Join(env.base, "small-"+rt)
			if err := os.Mkdir(small, 0o700); err != nil {
				t.Fatal(err)
			}
			if err := unix.Mount("tmpfs", small, "tmpfs", 0, "size=16m"); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { unix.Unmount(small, unix.MNT_DETACH) })
			var before unix.Statfs_t
			unix.Statfs(small, &before)

			_, err := d.Snapshot(ctx, id, filepath.Join(small, "snap"), true)
			if !errors.Is(err, runtime.ErrSnapshotTooLarge) || !strings.Contains(err.Error(), "free") || strings.Contains(err.Error(), env.base) {
				t.Fatalf("snapshot of 24 MiB into 16 MiB = %v; want ErrSnapshotTooLarge naming the free space", err)
			}
			if ents, _ := os.ReadDir(small); len(ents) != 0 {
				t.Errorf("left behind: %v", ents)
			}
			var after unix.Statfs_t
			unix.Statfs(small, &after)
			if after.Bfree != before.Bfree {
				t.Errorf("the store lost %d blocks", before.Bfree-after.Bfree)
			}
			if info, err := d.Inspect(ctx, id); err != nil || info.State != want {
				t.Errorf("after the refused snapshot: %+v, %v; want %s", info, err, want)
			}

			info, err := d.Snapshot(ctx, id, filepath.Join(env.base, "snap-"+rt), true)
			if err != nil || info.SizeBytes < 24<<20 || info.SizeBytes > 64<<20 {
				t.Fatalf("snapshot with room: %+v, %v", info, err)
			}
		})
	}
}

// A memory snapshot (runsc checkpoint) that its store cannot hold is refused
// with ErrSnapshotTooLarge and the reason before runsc writes it, leaves
// nothing behind, and the sandbox keeps running; with room it works.
func TestMemorySnapshotRefusedLeavesNothing(t *testing.T) {
	env := newTestEnv(t, "runsc")
	d, ctx := env.d, context.Background()
	out := filepath.Join(env.base, "out-mem")
	if err := os.Mkdir(out, 0o777); err != nil {
		t.Fatal(err)
	}
	id := runtimetest.NewID(t)
	t.Cleanup(func() { d.Delete(context.Background(), id) })
	// 40 MiB in the sentry's tmpfs: memory the checkpoint must write.
	if _, err := d.Create(ctx, runtime.Spec{ID: id, Layers: env.layers,
		Args:      []string{"/bin/sh", "-c", "dd if=/dev/urandom of=/dev/shm/blob bs=1M count=40 2>/dev/null && touch /out/done; sleep 3600"},
		Mounts:    []runtime.Mount{{Source: out, Destination: "/out"}},
		Resources: runtime.Resources{CPUCount: 1, MemoryMB: 256, PIDs: 64, DiskMB: 64}}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(60 * time.Second)
	for _, err := os.Stat(filepath.Join(out, "done")); err != nil; _, err = os.Stat(filepath.Join(out, "done")) {
		if time.Now().After(deadline) {
			t.Fatal("the sandbox did not fill its memory")
		}
		time.Sleep(50 * time.Millisecond)
	}
	small := filepath.Join(env.base, "small-mem")
	if err := os.Mkdir(small, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", small, "tmpfs", 0, "size=16m"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Unmount(small, unix.MNT_DETACH) })

	_, err := d.Snapshot(ctx, id, filepath.Join(small, "snap"), true)
	if !errors.Is(err, runtime.ErrSnapshotTooLarge) || !strings.Contains(err.Error(), "memory") || !strings.Contains(err.Error(), "free") || strings.Contains(err.Error(), env.base) {
		t.Fatalf("memory snapshot of 40+ MiB into 16 MiB = %v; want ErrSnapshotTooLarge naming the memory and the free space", err)
	}
	if ents, _ := os.ReadDir(small); len(ents) != 0 {
		t.Errorf("left behind: %v", ents)
	}
	if info, err := d.Inspect(ctx, id); err != nil || info.State != runtime.StateRunning {
		t.Fatalf("after the refused snapshot: %+v, %v; want running", info, err)
	}
	info, err := d.Snapshot(ctx, id, filepath.Join(env.base, "snap-mem"), true)
	if err != nil || info.Kind != runtime.SnapshotMemory {
		t.Fatalf("memory snapshot with room: %+v, %v", info, err)
	}
}
