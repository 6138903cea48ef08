package control

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/node"
	"github.com/cubicle-dev/cubicle/internal/store"
	"github.com/cubicle-dev/cubicle/internal/store/postgres"
	"github.com/cubicle-dev/cubicle/internal/store/postgres/pgtest"
	"github.com/cubicle-dev/cubicle/internal/store/sqlite"
)

// openStores runs f over a real SQLite store and a real PostgreSQL one.
func eachStore(t *testing.T, f func(t *testing.T, open func(t *testing.T) store.Store)) {
	t.Run("sqlite", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "c.db")
		f(t, func(t *testing.T) store.Store {
			st, err := sqlite.Open(path)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { st.Close() })
			return st
		})
	})
	t.Run("postgres", func(t *testing.T) {
		dsn := pgtest.DSN(t)
		f(t, func(t *testing.T) store.Store {
			st, err := postgres.Open(context.Background(), dsn)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { st.Close() })
			return st
		})
	})
}

func addTemplate(t *testing.T, st store.Store) {
	t.Helper()
	tpl := &store.Template{ID: "tpl", PrimaryName: "tpl", Names: []string{"tpl"}, ReadyBuildID: "b1", LatestBuildID: "b1", BuildStatus: store.BuildReady}
	if err := st.CreateTemplate(context.Background(), tpl, &store.TemplateBuild{ID: "b1", TemplateID: "tpl", Status: store.BuildReady, Rootfs: "/x"}); err != nil {
		t.Fatal(err)
	}
}

// beatAt records node id's heartbeat as taken at at (keeping its facts),
// as a node that stopped (at in the past) or came back (now).
func beatAt(t *testing.T, st store.Store, id string, at time.Time) {
	t.Helper()
	ctx := context.Background()
	n, err := st.GetNode(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.HeartbeatNode(ctx, id, store.NodeHeartbeat{Address: n.Address, Labels: n.Labels, Capacity: n.Capacity,
		VolumeDrivers: n.VolumeDrivers, Accelerators: n.Accelerators, Time: at}); err != nil {
		t.Fatal(err)
	}
}

func state(t *testing.T, st store.Store, id string) *store.Sandbox {
	t.Helper()
	sb, err := st.GetSandbox(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	return sb
}

func hasEvent(t *testing.T, st store.Store, id, typ, text string) bool {
	t.Helper()
	evs, err := st.ListEvents(context.Background(), id, time.Time{}, 100)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range evs {
		if e.Type == typ && strings.Contains(e.Message, text) {
			return true
		}
	}
	return false
}

// A node that stops heartbeating: its sandboxes are lost (with the reason
// in the event log) and new creates avoid it; when it heartbeats again
// the sandboxes it still has run again and one it lost is killed; when it
// stays silent past the grace they are killed with a reason, their
// reservations end, and a later reconcile removes them from the node.
func TestNodeLoss(t *testing.T) {
	eachStore(t, func(t *testing.T, open func(t *testing.T) store.Store) {
		ctx := context.Background()
		st := open(t)
		addTemplate(t, st)
		n := newFakeNode()
		m := New(Config{NodeLostAfter: 15 * time.Second, NodeLostGrace: 10 * time.Minute}, st, n, storeResolver{st})
		if err := m.RegisterNode(ctx); err != nil {
			t.Fatal(err)
		}
		var ids []string
		for range 3 {
			sb, err := m.Create(ctx, CreateOptions{TemplateID: "tpl", Timeout: time.Hour})
			if err != nil {
				t.Fatal(err)
			}
			if sb.Node != "local" {
				t.Fatalf("sandbox on node %q", sb.Node)
			}
			ids = append(ids, sb.ID)
		}
		// A sandbox with a volume (row and node sandbox made directly:
		// the fake manager has no volume plugins).
		vol := &store.Volume{ID: "vol1", TeamID: store.SystemTeamID, Name: "v", Driver: "local", State: store.VolumeReady, Token: "t"}
		if err := st.CreateVolume(ctx, vol); err != nil {
			t.Fatal(err)
		}
		vsb := &store.Sandbox{ID: "volsandbox0000000000", TeamID: store.SystemTeamID, TemplateID: "tpl", State: store.StateRunning, Node: "local",
			StartedAt: time.Now(), EndAt: time.Now().Add(time.Hour), Volumes: []store.VolumeMount{{VolumeID: vol.ID, Path: "/data"}}}
		if err := st.CreateSandbox(ctx, vsb); err != nil {
			t.Fatal(err)
		}
		if _, err := n.Create(ctx, node.CreateRequest{ID: vsb.ID}); err != nil {
			t.Fatal(err)
		}
		attached := func() int {
			atts, err := st.ListVolumeAttachments(ctx, vol.ID, vsb.ID)
			if err != nil {
				t.Fatal(err)
			}
			return len(atts)
		}
		// Heartbeats are fresh: nothing happens.
		if err := m.detectNodeLoss(ctx); err != nil {
			t.Fatal(err)
		}
		if s := state(t, st, ids[0]).State; s != store.StateRunning {
			t.Fatalf("state %s with a live node", s)
		}

		silentSince := time.Now().Add(-20 * time.Second)
		beatAt(t, st, "local", silentSince)
		if err := m.detectNodeLoss(ctx); err != nil {
			t.Fatal(err)
		}
		for _, id := range append(ids[:3:3], vsb.ID) {
			if s := state(t, st, id).State; s != store.StateLost {
				t.Fatalf("sandbox %s is %s on a silent node, want lost", id, s)
			}
			if !hasEvent(t, st, id, "lost", "node local lost: no heartbeat since") {
				t.Fatalf("no lost event on %s", id)
			}
		}
		// Still visible to the API's get, and in the default list.
		if sb, err := m.Get(ctx, ids[0]); err != nil || sb.State != store.StateLost {
			t.Fatalf("get of a lost sandbox: %v", err)
		}
		// New creates avoid the lost node (here the only one).
		if _, err := m.Create(ctx, CreateOptions{TemplateID: "tpl", Timeout: time.Hour}); err == nil || !strings.Contains(err.Error(), "lost") {
			t.Fatalf("create on a lost node: %v, want a refusal naming the loss", err)
		}

		// The node returns, without ids[2].
		n.Delete(ctx, ids[2])
		beatAt(t, st, "local", time.Now())
		if err := m.detectNodeLoss(ctx); err != nil {
			t.Fatal(err)
		}
		for _, id := range append(ids[:2:2], vsb.ID) {
			if s := state(t, st, id).State; s != store.StateRunning {
				t.Fatalf("sandbox %s is %s after its node returned, want running", id, s)
			}
		}
		if sb := state(t, st, ids[2]); sb.State != store.StateKilled || !strings.Contains(sb.KillReason, "returned without the sandbox") {
			t.Fatalf("sandbox the node lost: %s %q", sb.State, sb.KillReason)
		}

		// Silent past the grace: lost, then killed with a reason.
		beatAt(t, st, "local", time.Now().Add(-(15*time.Second + 10*time.Minute + time.Second)))
		if err := m.detectNodeLoss(ctx); err != nil {
			t.Fatal(err)
		}
		for _, id := range append(ids[:2:2], vsb.ID) {
			sb := state(t, st, id)
			if sb.State != store.StateKilled || !strings.Contains(sb.KillReason, "node local lost for 10m16s") {
				t.Fatalf("sandbox %s past the grace: %s %q", id, sb.State, sb.KillReason)
			}
		}
		// The node never confirmed it let go of the volume.
		if attached() != 1 {
			t.Fatal("a lost node's volume attachment was released at the kill")
		}
		committed, err := st.CommittedCapacity(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if c := committed["local"]; c.MilliCPU != 0 || c.MemoryMiB != 0 {
			t.Fatalf("killed sandboxes still hold %+v", c)
		}
		// The node comes back still running them: its reconcile deletes them.
		if _, err := n.Get(ctx, ids[0]); err != nil {
			t.Fatal("the fake node dropped a sandbox the control plane never deleted")
		}
		beatAt(t, st, "local", time.Now())
		if err := m.reconcile(ctx); err != nil {
			t.Fatal(err)
		}
		for _, id := range append(ids[:2:2], vsb.ID) {
			if _, err := n.Get(ctx, id); err == nil {
				t.Fatalf("sandbox %s killed while its node was lost is still on the node", id)
			}
		}
		// The node confirmed the delete: now the attachment goes.
		if attached() != 0 {
			t.Fatal("the attachment outlived the returned node's delete")
		}
	})
}

// A heartbeating node's sandboxes are never lost, whatever the grace.
func TestLiveNodeNeverLost(t *testing.T) {
	ctx := context.Background()
	m, _, st := newPoolManager(t)
	if err := m.RegisterNode(ctx); err != nil {
		t.Fatal(err)
	}
	sb, err := m.Create(ctx, CreateOptions{TemplateID: "tpl", Timeout: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.heartbeat(ctx); err != nil {
		t.Fatal(err)
	}
	if err := m.detectNodeLoss(ctx); err != nil {
		t.Fatal(err)
	}
	if s := state(t, st, sb.ID).State; s != store.StateRunning {
		t.Fatalf("state %s", s)
	}
}
