package storetest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/store"
)

func testVolumes(t *testing.T, s store.Store) {
	ctx := context.Background()
	v := &store.Volume{ID: "data", Name: "data", Driver: "local", State: store.VolumeCreating}
	if err := s.CreateVolume(ctx, v); err != nil {
		t.Fatal(err)
	}
	if err := s.CreateVolume(ctx, &store.Volume{ID: "data", Name: "data", Driver: "local", State: store.VolumeCreating}); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("duplicate volume: want ErrConflict, got %v", err)
	}
	if _, err := s.GetVolume(ctx, "nope"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("missing volume: want ErrNotFound, got %v", err)
	}
	// A creating volume cannot be mounted.
	sb := sample("vvvvvvvvvvvvvvvvvvv1", time.Now())
	sb.Volumes = []store.VolumeMount{{VolumeID: "data", Path: "/data"}}
	if err := s.CreateSandbox(ctx, sb); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("mount of creating volume: want ErrConflict, got %v", err)
	}
	if _, err := s.GetSandbox(ctx, sb.ID); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("failed create must leave no sandbox row, got %v", err)
	}
	v.State, v.Token, v.PrivateData = store.VolumeReady, "tok", "volumes/data/"
	if err := s.UpdateVolume(ctx, v); err != nil {
		t.Fatal(err)
	}
	got, err := s.GetVolume(ctx, "data")
	if err != nil || got.State != store.VolumeReady || got.Token != "tok" || got.PrivateData != "volumes/data/" || got.Driver != "local" {
		t.Fatalf("volume round trip: %+v %v", got, err)
	}
	sb.Volumes = []store.VolumeMount{{VolumeID: "data", Path: "/data", ReadOnly: true}}
	if err := s.CreateSandbox(ctx, sb); err != nil {
		t.Fatal(err)
	}
	back, _ := s.GetSandbox(ctx, sb.ID)
	if len(back.Volumes) != 1 || back.Volumes[0] != sb.Volumes[0] {
		t.Fatalf("sandbox volumes round trip: %+v", back.Volumes)
	}
	att, err := s.ListVolumeAttachments(ctx, "data", "")
	if err != nil || len(att) != 1 || att[0].SandboxID != sb.ID || !att[0].ReadOnly || att[0].Path != "/data" || att[0].Node != "local" {
		t.Fatalf("attachments: %+v %v", att, err)
	}
	if _, err := s.MarkVolumeDeleting(ctx, "data"); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("delete guard: want ErrConflict while attached, got %v", err)
	}
	// A sandbox that moved to another node: its rows name that node, and
	// still guard the volume.
	if err := s.MoveVolumeAttachments(ctx, sb.ID, "node-b"); err != nil {
		t.Fatal(err)
	}
	if att, _ := s.ListVolumeAttachments(ctx, "data", ""); len(att) != 1 || att[0].Node != "node-b" || att[0].SandboxID != sb.ID || att[0].Path != "/data" {
		t.Fatalf("attachments after the move: %+v", att)
	}
	if err := s.MoveVolumeAttachments(ctx, "nosuchsandbox", "node-b"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("moving the rows of a sandbox without any: %v, want ErrNotFound", err)
	}
	if _, err := s.MarkVolumeDeleting(ctx, "data"); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("delete guard after the move: want ErrConflict, got %v", err)
	}
	if err := s.DeleteVolume(ctx, "data"); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("DeleteVolume while attached: want ErrConflict, got %v", err)
	}
	// Killing the sandbox row alone keeps the reference until the node
	// confirmed the detach.
	back.State = store.StateKilled
	if err := s.UpdateSandbox(ctx, back); err != nil {
		t.Fatal(err)
	}
	if _, err := s.MarkVolumeDeleting(ctx, "data"); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("delete guard after kill, before detach: want ErrConflict, got %v", err)
	}
	if err := s.DeleteVolumeAttachments(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if att, _ := s.ListVolumeAttachments(ctx, "", sb.ID); len(att) != 0 {
		t.Fatalf("attachments left: %+v", att)
	}
	dv, err := s.MarkVolumeDeleting(ctx, "data")
	if err != nil || dv.State != store.VolumeDeleting {
		t.Fatalf("MarkVolumeDeleting: %+v %v", dv, err)
	}
	// Idempotent: a retried delete of a deleting volume passes the guard again.
	if _, err := s.MarkVolumeDeleting(ctx, "data"); err != nil {
		t.Fatalf("MarkVolumeDeleting twice: %v", err)
	}
	sb2 := sample("vvvvvvvvvvvvvvvvvvv2", time.Now())
	sb2.Volumes = []store.VolumeMount{{VolumeID: "data", Path: "/data"}}
	if err := s.CreateSandbox(ctx, sb2); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("mount of deleting volume: want ErrConflict, got %v", err)
	}
	if err := s.DeleteVolume(ctx, "data"); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteVolume(ctx, "data"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("DeleteVolume twice: want ErrNotFound, got %v", err)
	}
	if vs, _ := s.ListVolumes(ctx); len(vs) != 0 {
		t.Fatalf("volumes left: %+v", vs)
	}
	// Same volume twice in one sandbox is refused as a whole.
	for _, id := range []string{"a", "b"} {
		if err := s.CreateVolume(ctx, &store.Volume{ID: id, Name: id, Driver: "local", State: store.VolumeReady}); err != nil {
			t.Fatal(err)
		}
	}
	sb3 := sample("vvvvvvvvvvvvvvvvvvv3", time.Now())
	sb3.Volumes = []store.VolumeMount{{VolumeID: "a", Path: "/a"}, {VolumeID: "a", Path: "/b"}}
	if err := s.CreateSandbox(ctx, sb3); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("same volume twice: want ErrConflict, got %v", err)
	}
	if att, _ := s.ListVolumeAttachments(ctx, "a", ""); len(att) != 0 {
		t.Fatalf("rolled-back create left attachments: %+v", att)
	}
	vs, err := s.ListVolumes(ctx)
	if err != nil || len(vs) != 2 || vs[0].ID != "a" || vs[1].ID != "b" {
		t.Fatalf("list volumes: %+v %v", vs, err)
	}
	if err := s.AppendEvent(ctx, &store.Event{VolumeID: "a", Type: "volume.created", Message: "m"}); err != nil {
		t.Fatal(err)
	}
	evs, err := s.ListVolumeEvents(ctx, "a", 0)
	if err != nil || len(evs) != 1 || evs[0].VolumeID != "a" || evs[0].Type != "volume.created" {
		t.Fatalf("volume events: %+v %v", evs, err)
	}
}

// The delete guard and new mounts race; exactly one side may win.
func testVolumeGuardRace(t *testing.T, s store.Store) {
	ctx := context.Background()
	for i := 0; i < 20; i++ {
		id := fmt.Sprintf("race%d", i)
		if err := s.CreateVolume(ctx, &store.Volume{ID: id, Name: id, Driver: "local", State: store.VolumeReady}); err != nil {
			t.Fatal(err)
		}
		sb := sample(fmt.Sprintf("race%016d", i), time.Now())
		sb.Volumes = []store.VolumeMount{{VolumeID: id, Path: "/v"}}
		var wg sync.WaitGroup
		var cerr, derr error
		wg.Add(2)
		go func() { defer wg.Done(); cerr = s.CreateSandbox(ctx, sb) }()
		go func() { defer wg.Done(); _, derr = s.MarkVolumeDeleting(ctx, id) }()
		wg.Wait()
		if (cerr == nil) == (derr == nil) {
			t.Fatalf("round %d: mount err=%v, delete-guard err=%v; exactly one must win", i, cerr, derr)
		}
	}
}
