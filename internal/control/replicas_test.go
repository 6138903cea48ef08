package control

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/idlock"
	clusterlease "github.com/cubicle-dev/cubicle/internal/lease"
	"github.com/cubicle-dev/cubicle/internal/store"
	"github.com/cubicle-dev/cubicle/internal/store/postgres"
	"github.com/cubicle-dev/cubicle/internal/store/postgres/pgtest"
	"github.com/cubicle-dev/cubicle/internal/volume"
	volumeregistry "github.com/cubicle-dev/cubicle/internal/volume/registry"
)

// journalNode is the fake node two replicas share, recording the calls
// that change a sandbox; its Pause blocks until release is closed (when
// set), so a test can hold a pause open.
type journalNode struct {
	*fakeNode
	mu      sync.Mutex
	calls   []string
	paused  chan struct{}
	release chan struct{}
}

func (j *journalNode) log(s string) {
	j.mu.Lock()
	j.calls = append(j.calls, s)
	j.mu.Unlock()
}

func (j *journalNode) journal() []string {
	j.mu.Lock()
	defer j.mu.Unlock()
	return append([]string(nil), j.calls...)
}

func (j *journalNode) Delete(ctx context.Context, id string) error {
	j.log("delete " + id)
	return j.fakeNode.Delete(ctx, id)
}

func (j *journalNode) Pause(ctx context.Context, id string) error {
	j.log("pause-start " + id)
	if j.paused != nil {
		close(j.paused)
		<-j.release
	}
	j.log("pause-end " + id)
	return nil
}

// replicas returns two Managers over one PostgreSQL database, each with
// its own store handle, lease and lock connections, as two `cubicle serve`
// replicas, sharing one (fake) node.
func replicas(t *testing.T, n *journalNode) (a, b *Manager, st store.Store) {
	t.Helper()
	ctx := context.Background()
	dsn := pgtest.DSN(t)
	var ms [2]*Manager
	for i := range ms {
		s, err := postgres.Open(ctx, dsn)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		if i == 0 {
			addTemplate(t, s)
			st = s
		}
		l, err := clusterlease.NewPostgres(dsn, 100*time.Millisecond, nil)
		if err != nil {
			t.Fatal(err)
		}
		locks, err := idlock.NewPostgres(ctx, dsn, "sandbox", 0)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(locks.Close)
		ms[i] = New(Config{Leaser: l, Locks: locks}, s, n, storeResolver{s})
	}
	if err := ms[0].RegisterNode(ctx); err != nil {
		t.Fatal(err)
	}
	return ms[0], ms[1], st
}

// Both replicas run their loops; a sandbox past its timeout is killed
// exactly once: one node delete, one kill event.
func TestReplicasReapOnce(t *testing.T) {
	ctx := context.Background()
	n := &journalNode{fakeNode: newFakeNode()}
	a, b, st := replicas(t, n)
	var ids []string
	for range 5 {
		sb, err := a.Create(ctx, CreateOptions{TemplateID: "tpl", Timeout: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, sb.ID)
	}
	// Expire them all now.
	for _, id := range ids {
		sb := state(t, st, id)
		sb.EndAt = time.Now().Add(-time.Second)
		if err := st.UpdateSandbox(ctx, sb); err != nil {
			t.Fatal(err)
		}
	}
	rctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for _, m := range []*Manager{a, b} {
		wg.Add(1)
		go func() { defer wg.Done(); m.Run(rctx) }()
	}
	defer func() { cancel(); wg.Wait() }()
	waitFor(t, 30*time.Second, "the reaper", func() bool {
		for _, id := range ids {
			if state(t, st, id).State != store.StateKilled {
				return false
			}
		}
		return true
	})
	time.Sleep(4 * reapInterval) // further passes of either replica must do nothing
	count := map[string]int{}
	for _, c := range n.journal() {
		count[c]++
	}
	for _, id := range ids {
		if c := count["delete "+id]; c != 1 {
			t.Fatalf("sandbox %s deleted %d times on its node: %v", id, c, n.journal())
		}
		evs, err := st.ListEvents(ctx, id, time.Time{}, 100)
		if err != nil {
			t.Fatal(err)
		}
		kills := 0
		for _, e := range evs {
			if e.Type == "killed" {
				kills++
			}
		}
		if kills != 1 {
			t.Fatalf("sandbox %s has %d kill events", id, kills)
		}
	}
}

// A kill on one replica waits for a pause of the same sandbox on the
// other: the node sees the pause end before the delete.
func TestReplicasSerialiseKillAndPause(t *testing.T) {
	ctx := context.Background()
	n := &journalNode{fakeNode: newFakeNode(), paused: make(chan struct{}), release: make(chan struct{})}
	a, b, st := replicas(t, n)
	sb, err := a.Create(ctx, CreateOptions{TemplateID: "tpl", Timeout: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	pauseErr := make(chan error, 1)
	go func() { pauseErr <- b.Pause(ctx, sb.ID, true) }()
	<-n.paused
	killErr := make(chan error, 1)
	go func() { killErr <- a.Kill(ctx, sb.ID, "user") }()
	select {
	case err := <-killErr:
		t.Fatalf("kill on replica a returned (%v) while replica b was pausing", err)
	case <-time.After(300 * time.Millisecond):
	}
	close(n.release)
	if err := <-pauseErr; err != nil {
		t.Fatal(err)
	}
	if err := <-killErr; err != nil {
		t.Fatal(err)
	}
	want := []string{"pause-start " + sb.ID, "pause-end " + sb.ID, "delete " + sb.ID}
	if got := n.journal(); len(got) != 3 || got[0] != want[0] || got[1] != want[1] || got[2] != want[2] {
		t.Fatalf("node calls %v, want %v", got, want)
	}
	if s := state(t, st, sb.ID).State; s != store.StateKilled {
		t.Fatalf("state %s", s)
	}
}

// waitFor polls cond every 20 ms for up to d.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatalf("timed out after %s waiting for %s", d, what)
}

// A replica starting beside others on one database (its sandbox locks are
// shared: idlock.Postgres) does not take a volume row another replica is
// creating right now for one whose create was interrupted; a lone control
// plane (in-process locks) still finishes any at its start.
func TestRecoverLeavesOtherReplicasVolumeCreates(t *testing.T) {
	ctx := context.Background()
	reg, err := volumeregistry.Open([]volume.PluginConfig{{Name: "local", Type: volume.TypeLocal, Root: t.TempDir()}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { reg.Close() })
	creating := func(st store.Store) {
		t.Helper()
		if err := st.CreateVolume(ctx, &store.Volume{ID: "vol1", TeamID: store.DefaultTeamID, Name: "v", Driver: "local", State: store.VolumeCreating}); err != nil {
			t.Fatal(err)
		}
	}

	dsn := pgtest.DSN(t)
	st, err := postgres.Open(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	locks, err := idlock.NewPostgres(ctx, dsn, "sandbox", 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(locks.Close)
	creating(st)
	m := New(Config{Locks: locks, Volumes: reg}, st, newFakeNode(), storeResolver{st})
	if err := m.Recover(ctx); err != nil {
		t.Fatal(err)
	}
	if v, err := st.GetVolume(ctx, "vol1"); err != nil || v.State != store.VolumeCreating {
		t.Fatalf("a volume another replica is creating: %+v %v, want it left creating", v, err)
	}

	lone := openSQLite(t)
	creating(lone)
	if err := New(Config{Volumes: reg}, lone, newFakeNode(), storeResolver{lone}).Recover(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := lone.GetVolume(ctx, "vol1"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("a lone control plane's interrupted volume create: %v, want it removed", err)
	}
}
