package storetest

import (
	"context"
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/store"
)

func runNodes(t *testing.T, open func(t *testing.T) store.Store) {
	t.Run("NodeRegistry", func(t *testing.T) { testNodeRegistry(t, open(t)) })
	t.Run("NodeForgetGuard", func(t *testing.T) { testNodeForget(t, open(t)) })
	t.Run("NodeForgetLeavesMovablePaused", func(t *testing.T) { testNodeForgetMovable(t, open(t)) })
	t.Run("CapacityLedgerFollowsKills", func(t *testing.T) { testCapacityKills(t, open(t)) })
}

func testNodeRegistry(t *testing.T, s store.Store) {
	ctx := context.Background()
	t0 := time.Now().Truncate(time.Microsecond).UTC()
	n := &store.Node{
		ID: "n1", Address: "10.1.0.5:7443", DataAddress: "10.1.0.5:7444", Templates: []string{"base"}, Labels: map[string]string{"zone": "a"},
		Capacity: store.Capacity{MilliCPU: 8000, MemoryMiB: 16384, DiskMiB: 100000},
		Runtime:  "runsc", Version: "v1", VolumeDrivers: []string{"local", "s3"},
		Accelerators: `[{"id":"gpu0"}]`, HeartbeatAt: t0,
	}
	if err := s.RegisterNode(ctx, n); err != nil {
		t.Fatal(err)
	}
	got, err := s.GetNode(ctx, "n1")
	if err != nil {
		t.Fatal(err)
	}
	if got.Address != n.Address || got.DataAddress != n.DataAddress || !reflect.DeepEqual(got.Templates, n.Templates) || got.Labels["zone"] != "a" || got.Capacity != n.Capacity || got.Runtime != "runsc" ||
		got.Version != "v1" || !reflect.DeepEqual(got.VolumeDrivers, n.VolumeDrivers) || got.Accelerators != n.Accelerators ||
		got.Cordoned || got.Draining || !got.RegisteredAt.Equal(t0) || !got.HeartbeatAt.Equal(t0) {
		t.Fatalf("registered node reads back as %+v", got)
	}
	if _, err := s.SetNodeFlags(ctx, "n1", true, false); err != nil {
		t.Fatal(err)
	}
	// Registering again (a restarted node) updates its facts but keeps
	// the operator's cordon and its first registration time.
	t1 := t0.Add(time.Minute)
	again := &store.Node{ID: "n1", Address: "10.1.0.6:7443", Runtime: "runc", Version: "v2", HeartbeatAt: t1}
	if err := s.RegisterNode(ctx, again); err != nil {
		t.Fatal(err)
	}
	got, _ = s.GetNode(ctx, "n1")
	if !got.Cordoned || got.Runtime != "runc" || got.Address != "10.1.0.6:7443" || !got.RegisteredAt.Equal(t0) ||
		!got.HeartbeatAt.Equal(t1) || len(got.Labels) != 0 || len(got.VolumeDrivers) != 0 || got.Accelerators != "" ||
		got.DataAddress != "" || len(got.Templates) != 0 {
		t.Fatalf("re-registered node: %+v", got)
	}
	t2 := t1.Add(time.Second)
	hb := store.NodeHeartbeat{Address: "10.1.0.6:7443", DataAddress: "10.1.0.6:7444", Templates: []string{"base", "py"}, Labels: map[string]string{"zone": "b"},
		Capacity: store.Capacity{MilliCPU: 4000, MemoryMiB: 8192}, VolumeDrivers: []string{"local"}, Accelerators: "[]", Time: t2}
	if err := s.HeartbeatNode(ctx, "n1", hb); err != nil {
		t.Fatal(err)
	}
	got, _ = s.GetNode(ctx, "n1")
	if !got.HeartbeatAt.Equal(t2) || got.Labels["zone"] != "b" || got.Capacity != hb.Capacity ||
		!reflect.DeepEqual(got.VolumeDrivers, []string{"local"}) || got.Accelerators != "[]" || !got.Cordoned || got.Version != "v2" ||
		got.DataAddress != hb.DataAddress || !reflect.DeepEqual(got.Templates, hb.Templates) {
		t.Fatalf("after heartbeat: %+v", got)
	}
	if err := s.HeartbeatNode(ctx, "ghost", hb); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("heartbeat of an unregistered node: %v, want ErrNotFound", err)
	}
	if _, err := s.GetNode(ctx, "ghost"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("get unknown node: %v", err)
	}
	if _, err := s.SetNodeFlags(ctx, "ghost", true, true); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("cordon unknown node: %v", err)
	}
	if err := s.RegisterNode(ctx, &store.Node{ID: "a0"}); err != nil {
		t.Fatal(err)
	}
	got, err = s.SetNodeFlags(ctx, "n1", true, true)
	if err != nil || !got.Cordoned || !got.Draining {
		t.Fatalf("drain: %+v, %v", got, err)
	}
	list, err := s.ListNodes(ctx)
	if err != nil || len(list) != 2 || list[0].ID != "a0" || list[1].ID != "n1" || !list[1].Draining {
		t.Fatalf("list: %v, %v", list, err)
	}
	if got, err = s.SetNodeFlags(ctx, "n1", false, false); err != nil || got.Cordoned || got.Draining {
		t.Fatalf("uncordon: %+v, %v", got, err)
	}
}

func testNodeForget(t *testing.T, s store.Store) {
	ctx := context.Background()
	if err := s.ForgetNode(ctx, "ghost"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("forget unknown node: %v", err)
	}
	if err := s.RegisterNode(ctx, &store.Node{ID: "local"}); err != nil {
		t.Fatal(err)
	}
	if err := s.SetAllocatable(ctx, "local", store.Capacity{MilliCPU: 4000}); err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	a, b := sample("aaaaaaaaaaaaaaaaaaaa", now), sample("bbbbbbbbbbbbbbbbbbbb", now)
	// a holds a volume on the node: its reference outlives its kill until
	// the node confirms, or the operator forgets the node.
	if err := s.CreateVolume(ctx, &store.Volume{ID: "fv", Name: "fv", Driver: "local", State: store.VolumeReady}); err != nil {
		t.Fatal(err)
	}
	a.Volumes = []store.VolumeMount{{VolumeID: "fv", Path: "/data"}}
	for _, sb := range []*store.Sandbox{a, b} {
		if err := s.CreateSandbox(ctx, sb); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.ReserveCapacity(ctx, a.ID, "local", store.Capacity{MilliCPU: 1000}, func(_, _ store.Capacity) error { return nil }); err != nil {
		t.Fatal(err)
	}
	err := s.ForgetNode(ctx, "local")
	var inUse *store.NodeInUseError
	if !errors.As(err, &inUse) || !errors.Is(err, store.ErrNodeInUse) || inUse.Sandboxes != 2 || inUse.Node != "local" {
		t.Fatalf("forget a node with 2 live sandboxes: %v", err)
	}
	if _, err := s.GetNode(ctx, "local"); err != nil {
		t.Fatalf("a refused forget removed the node: %v", err)
	}
	for _, id := range []string{a.ID, b.ID} {
		if _, err := s.CompareAndSetState(ctx, id, []store.SandboxState{store.StateRunning}, store.StateKilled); err != nil {
			t.Fatal(err)
		}
	}
	if atts, err := s.ListVolumeAttachments(ctx, "fv", ""); err != nil || len(atts) != 1 {
		t.Fatalf("a killed sandbox's reference before the forget: %v %v", atts, err)
	}
	if err := s.ForgetNode(ctx, "local"); err != nil {
		t.Fatalf("forget a node with only killed sandboxes: %v", err)
	}
	if atts, err := s.ListVolumeAttachments(ctx, "fv", ""); err != nil || len(atts) != 0 {
		t.Fatalf("a forgotten node's volume references remain: %v %v", atts, err)
	}
	if _, err := s.GetNode(ctx, "local"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("forgotten node still reads: %v", err)
	}
	c, err := s.CommittedCapacity(ctx)
	if err != nil || len(c) != 0 {
		t.Fatalf("a forgotten node keeps its ledger: %v, %v", c, err)
	}
	// Its reservations went with it: the sandbox may reserve elsewhere.
	if err := s.SetAllocatable(ctx, "n2", store.Capacity{MilliCPU: 4000}); err != nil {
		t.Fatal(err)
	}
	if err := s.ReserveCapacity(ctx, a.ID, "n2", store.Capacity{MilliCPU: 500}, func(_, _ store.Capacity) error { return nil }); err != nil {
		t.Fatalf("reserve after the old node was forgotten: %v", err)
	}
}

// testNodeForgetMovable: a sandbox lost while paused whose pause has a
// package and which mounts no volume resumes on another node at its next
// connect, so it does not keep its lost node from being forgotten; its row
// stays (lost, naming the node) and its reservation goes with the node's.
// One lost with a volume still holds the node (the seed: its attachments
// wait for the node or the forget of a node it no longer names).
func testNodeForgetMovable(t *testing.T, s store.Store) {
	ctx := context.Background()
	if err := s.RegisterNode(ctx, &store.Node{ID: "gone"}); err != nil {
		t.Fatal(err)
	}
	if err := s.SetAllocatable(ctx, "gone", store.Capacity{MilliCPU: 4000}); err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	mv, vol, bare := sample("mmmmmmmmmmmmmmmmmmmm", now), sample("vvvvvvvvvvvvvvvvvvvv", now), sample("llllllllllllllllllll", now)
	if err := s.CreateVolume(ctx, &store.Volume{ID: "pv", Name: "pv", Driver: "s3", State: store.VolumeReady}); err != nil {
		t.Fatal(err)
	}
	vol.Volumes = []store.VolumeMount{{VolumeID: "pv", Path: "/data"}}
	for _, sb := range []*store.Sandbox{mv, vol, bare} {
		sb.Node, sb.State = "gone", store.StateLost
	}
	mv.PausePackage = &store.PausePackage{SnapshotID: "pkg-mv"}
	vol.PausePackage = &store.PausePackage{SnapshotID: "pkg-vol"}
	for _, sb := range []*store.Sandbox{mv, vol, bare} {
		if err := s.CreateSandbox(ctx, sb); err != nil {
			t.Fatal(err)
		}
		if err := s.ReserveCapacity(ctx, sb.ID, "gone", store.Capacity{MilliCPU: 1000}, func(_, _ store.Capacity) error { return nil }); err != nil {
			t.Fatal(err)
		}
	}
	var inUse *store.NodeInUseError
	if err := s.ForgetNode(ctx, "gone"); !errors.As(err, &inUse) || inUse.Sandboxes != 2 {
		t.Fatalf("forget a node holding a lost sandbox with a volume and one without a package: %v, want 2 in use", err)
	}
	for _, id := range []string{vol.ID, bare.ID} {
		if _, err := s.CompareAndSetState(ctx, id, []store.SandboxState{store.StateLost}, store.StateKilled); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.ForgetNode(ctx, "gone"); err != nil {
		t.Fatalf("forget a node whose only live sandbox moves at its next connect: %v", err)
	}
	got, err := s.GetSandbox(ctx, mv.ID)
	if err != nil || got.State != store.StateLost || got.Node != "gone" || got.PausePackage == nil || got.PausePackage.SnapshotID != "pkg-mv" {
		t.Fatalf("the movable sandbox after the forget: %+v %v", got, err)
	}
	if c, err := s.CommittedCapacity(ctx); err != nil || len(c) != 0 {
		t.Fatalf("the forgotten node's reservations remain: %v %v", c, err)
	}
}

// testCapacityKills: a sandbox's reservation stops counting when its row
// is killed, with no release call (a crashed control plane leaks nothing).
func testCapacityKills(t *testing.T, s store.Store) {
	ctx := context.Background()
	if err := s.SetAllocatable(ctx, "local", store.Capacity{MilliCPU: 4000, MemoryMiB: 4096, DiskMiB: 100}); err != nil {
		t.Fatal(err)
	}
	if a, err := s.AllocatableCapacity(ctx); err != nil || len(a) != 1 || a["local"] != (store.Capacity{MilliCPU: 4000, MemoryMiB: 4096, DiskMiB: 100}) {
		t.Fatalf("allocatable as set: %+v %v", a, err)
	}
	one := store.Capacity{MilliCPU: 1000, MemoryMiB: 1024, DiskMiB: 10}
	var seen []store.Capacity
	record := func(alloc, committed store.Capacity) error {
		seen = append(seen, committed)
		if alloc != (store.Capacity{MilliCPU: 4000, MemoryMiB: 4096, DiskMiB: 100}) {
			t.Errorf("check saw allocatable %+v", alloc)
		}
		return nil
	}
	sb := sample("aaaaaaaaaaaaaaaaaaaa", time.Now())
	// Reserved before its row exists (placement comes first): it counts.
	if err := s.ReserveCapacity(ctx, sb.ID, "local", one, record); err != nil {
		t.Fatal(err)
	}
	if err := s.ReserveCapacity(ctx, "pending", "local", one, record); err != nil {
		t.Fatal(err)
	}
	if c, _ := s.CommittedCapacity(ctx); c["local"] != (store.Capacity{MilliCPU: 2000, MemoryMiB: 2048, DiskMiB: 20}) {
		t.Fatalf("committed before any row: %+v", c)
	}
	if err := s.CreateSandbox(ctx, sb); err != nil {
		t.Fatal(err)
	}
	if _, err := s.CompareAndSetState(ctx, sb.ID, []store.SandboxState{store.StateRunning}, store.StateKilled); err != nil {
		t.Fatal(err)
	}
	if c, _ := s.CommittedCapacity(ctx); c["local"] != one {
		t.Fatalf("committed after the kill: %+v, want only the pending reservation", c)
	}
	refuse := errors.New("refused by check")
	if err := s.ReserveCapacity(ctx, "x", "local", one, func(_, _ store.Capacity) error { return refuse }); !errors.Is(err, refuse) {
		t.Fatalf("check's error: %v", err)
	}
	if err := s.ReserveCapacity(ctx, "y", "local", one, record); err != nil {
		t.Fatal(err)
	}
	if last := seen[len(seen)-1]; last != one {
		t.Fatalf("check saw committed %+v, want the pending reservation only", last)
	}
	if err := s.ReserveCapacity(ctx, "z", "ghost", one, record); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("reserve on a node without allocatable: %v", err)
	}
	if c, _ := s.CommittedCapacity(ctx); c["local"] != (store.Capacity{MilliCPU: 2000, MemoryMiB: 2048, DiskMiB: 20}) {
		t.Fatalf("committed: %+v", c)
	}
}
