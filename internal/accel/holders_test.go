package accel_test

import (
	"path/filepath"
	"slices"
	"testing"

	"github.com/cubicle-dev/cubicle/internal/accel"
	"github.com/cubicle-dev/cubicle/internal/accel/acceltest"
)

// Holders finds a real process by the device numbers of an fd it has open,
// whatever path it opened, and stops finding it once it is gone.
func TestHoldersFindsRealProcess(t *testing.T) {
	acceltest.Skip(t)
	node := filepath.Join(t.TempDir(), "fake-gpu")
	mknodFull(t, node)
	nodes := []accel.DeviceNode{{Path: "/dev/nvidia0", HostPath: node, Major: 1, Minor: 7}}
	before, err := accel.Holders("/proc", nodes)
	if err != nil {
		t.Fatal(err)
	}
	stop := holdNode(t, node)
	pids, err := accel.Holders("/proc", nodes)
	if err != nil {
		t.Fatal(err)
	}
	var child []int
	for _, p := range pids {
		if !slices.Contains(before, p) {
			child = append(child, p)
		}
	}
	if len(child) != 1 {
		t.Fatalf("holders %v (before %v): want exactly the child", pids, before)
	}
	// Another major/minor is not matched.
	if other, _ := accel.Holders("/proc", []accel.DeviceNode{{Major: 195, Minor: 99}}); slices.Contains(other, child[0]) {
		t.Fatalf("matched by path, not numbers: %v", other)
	}
	stop()
	after, err := accel.Holders("/proc", nodes)
	if err != nil {
		t.Fatal(err)
	}
	if slices.Contains(after, child[0]) {
		t.Fatalf("pid %d still reported after exit: %v", child[0], after)
	}
	if got, _ := accel.Holders("/proc", nil); got != nil {
		t.Fatalf("no nodes: %v", got)
	}
}
