package control

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/scheduler"
	"github.com/cubicle-dev/cubicle/internal/store"
)

// The in-process node registers from its Info, and a heartbeat renews the
// row; registering again (a restart) keeps the operator's cordon.
func TestRegisterNodeAndHeartbeat(t *testing.T) {
	ctx := context.Background()
	m, _, st := newPoolManager(t)
	if err := m.RegisterNode(ctx); err != nil {
		t.Fatal(err)
	}
	row, err := st.GetNode(ctx, "local")
	if err != nil {
		t.Fatal(err)
	}
	if row.Runtime != "fake" || row.Version != "test" || row.Capacity != (store.Capacity{MilliCPU: 1000, MemoryMiB: 1024}) || row.Cordoned {
		t.Fatalf("registered row: %+v", row)
	}
	if _, err := st.SetNodeFlags(ctx, "local", true, false); err != nil {
		t.Fatal(err)
	}
	if err := m.heartbeat(ctx); err != nil {
		t.Fatal(err)
	}
	again, _ := st.GetNode(ctx, "local")
	if again.HeartbeatAt.Before(row.HeartbeatAt) || !again.Cordoned {
		t.Fatalf("after heartbeat: %+v", again)
	}
	if err := m.RegisterNode(ctx); err != nil {
		t.Fatal(err)
	}
	if again, _ = st.GetNode(ctx, "local"); !again.Cordoned || !again.RegisteredAt.Equal(row.RegisteredAt) {
		t.Fatalf("a restart lost the cordon or the registration time: %+v", again)
	}
	// Forgotten while alive: the next heartbeat registers it again.
	if err := st.ForgetNode(ctx, "local"); err != nil {
		t.Fatal(err)
	}
	if err := m.heartbeat(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := st.GetNode(ctx, "local"); err != nil {
		t.Fatalf("heartbeat after forget: %v", err)
	}
}

// Cordoning (or draining) the only node makes creates fail with the
// scheduler's no-fit error naming it; uncordoning lets them through.
func TestCordonedNodeRefusesCreates(t *testing.T) {
	ctx := context.Background()
	m, n, st := newPoolManager(t)
	if err := m.RegisterNode(ctx); err != nil {
		t.Fatal(err)
	}
	for _, f := range []struct{ cordoned, draining bool }{{true, false}, {true, true}, {false, true}} {
		if _, err := st.SetNodeFlags(ctx, "local", f.cordoned, f.draining); err != nil {
			t.Fatal(err)
		}
		_, err := m.Create(ctx, CreateOptions{TemplateID: "tpl", Timeout: time.Minute})
		if !errors.Is(err, scheduler.ErrNoFit) || !strings.Contains(err.Error(), "cordoned") {
			t.Fatalf("create on a node with %+v: %v, want ErrNoFit naming cordoned", f, err)
		}
		if n.count() != 0 {
			t.Fatalf("%d sandboxes on a cordoned node", n.count())
		}
	}
	if _, err := st.SetNodeFlags(ctx, "local", false, false); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Create(ctx, CreateOptions{TemplateID: "tpl", Timeout: time.Minute}); err != nil {
		t.Fatalf("create after uncordon: %v", err)
	}
}

// A node ID that a remote node joined under (a join token redeemed for
// it, after the in-process node's row was forgotten) is that node's: the
// in-process node neither registers nor heartbeats under it, so the two
// never share one row (a pure replica would send the in-process node's
// sandboxes' calls to the remote node).
func TestInProcessNodeRefusesAJoinedID(t *testing.T) {
	ctx := context.Background()
	m, _, st := newPoolManager(t)
	if err := m.RegisterNode(ctx); err != nil {
		t.Fatal(err)
	}
	if err := st.ForgetNode(ctx, "local"); err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	if err := st.CreateJoinToken(ctx, &store.JoinToken{ID: "jt", SecretHash: "h", CreatedAt: now, ExpiresAt: now.Add(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	if _, err := st.RedeemJoinToken(ctx, "jt", "h", "local", now); err != nil {
		t.Fatalf("a join under the forgotten ID: %v", err)
	}
	if err := m.heartbeat(ctx); !errors.Is(err, ErrConflict) || !strings.Contains(err.Error(), "joined") {
		t.Fatalf("heartbeat under a joined ID: %v, want ErrConflict", err)
	}
	if _, err := st.GetNode(ctx, "local"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("the in-process node registered under a joined ID: %v", err)
	}
	if err := m.RegisterNode(ctx); !errors.Is(err, ErrConflict) {
		t.Fatalf("register (a restart) under a joined ID: %v, want ErrConflict", err)
	}
	// Forgotten again (the operator's call), the ID is free.
	if err := st.ForgetNode(ctx, "local"); err != nil {
		t.Fatal(err)
	}
	if err := m.RegisterNode(ctx); err != nil {
		t.Fatalf("register after the joined node was forgotten: %v", err)
	}
}
