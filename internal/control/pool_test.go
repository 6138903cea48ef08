package control

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/accel"
	"github.com/cubicle-dev/cubicle/internal/network"
	"github.com/cubicle-dev/cubicle/internal/node"
	"github.com/cubicle-dev/cubicle/internal/runtime"
	"github.com/cubicle-dev/cubicle/internal/snapstore"
	"github.com/cubicle-dev/cubicle/internal/store"
	"github.com/cubicle-dev/cubicle/internal/store/sqlite"
	"github.com/cubicle-dev/cubicle/internal/template"
)

// fakeNode keeps sandboxes in memory; reinitErr makes Reinit fail. It has
// no accelerators.
type fakeNode struct {
	noAccelerators
	mu        sync.Mutex
	sbs       map[string]node.CreateRequest
	reinits   map[string]node.CreateRequest
	policies  map[string]network.Policy
	reinitErr error
	// pulls: the node resolves image references (Info.Abilities.PullsImages).
	pulls  bool
	pulled []node.Image // PullImage calls, in order
	// snapKind: the kind of snapshot the node takes ("" = none).
	snapKind string
	// snapDir: where its snapshots' files are ("" = it keeps none).
	snapDir string
	fetched []string // FetchSnapshot calls that fetched
	pushErr error    // PushSnapshot fails with it
	// volDrivers are the volume drivers it reports (it attaches nothing).
	volDrivers []string
	// hold, when set, keeps every Create waiting until it is closed;
	// inflight and maxInflight count the Creates waiting at once.
	hold                  chan struct{}
	inflight, maxInflight int
}

func newFakeNode() *fakeNode {
	return &fakeNode{sbs: map[string]node.CreateRequest{}, reinits: map[string]node.CreateRequest{}, policies: map[string]network.Policy{}}
}

func (f *fakeNode) Info(context.Context) (node.Info, error) {
	return node.Info{ID: "local", Version: "test", Runtime: "fake", Capacity: node.Capacity{CPUs: 1, MemoryBytes: 1 << 30},
		Abilities: node.Abilities{PullsImages: f.pulls}, VolumeDrivers: f.volDrivers}, nil
}
func (f *fakeNode) CheckUpstream(context.Context, string) error {
	return &network.FieldError{Field: "egressProxy", Kind: network.ErrUpstream, Err: errors.New("this node runs no egress proxy to tunnel through")}
}
func (f *fakeNode) Exits(context.Context) (<-chan node.Exit, error) { return nil, nil }
func (f *fakeNode) PullImage(_ context.Context, im node.Image) error {
	if !f.pulls {
		return node.ErrImagesUnsupported
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.pulled = append(f.pulled, im)
	return nil
}
func (f *fakeNode) Create(_ context.Context, req node.CreateRequest) (node.Sandbox, error) {
	f.mu.Lock()
	if hold := f.hold; hold != nil {
		f.inflight++
		f.maxInflight = max(f.maxInflight, f.inflight)
		f.mu.Unlock()
		<-hold
		f.mu.Lock()
		f.inflight--
	}
	defer f.mu.Unlock()
	f.sbs[req.ID] = req
	return node.Sandbox{ID: req.ID, Addr: netip.MustParseAddr("10.0.0.2"), State: runtime.StateRunning}, nil
}
func (f *fakeNode) Delete(_ context.Context, id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.sbs, id)
	return nil
}
func (f *fakeNode) Pause(context.Context, string) error                      { return nil }
func (f *fakeNode) Resume(context.Context, string, node.CreateRequest) error { return nil }
func (f *fakeNode) Stats(context.Context, string, string) (node.Stats, error) {
	return node.Stats{}, nil
}
func (f *fakeNode) Logs(context.Context, string) ([]byte, error)                     { return nil, nil }
func (f *fakeNode) VolumeRefs(context.Context) ([]node.VolumeRef, error)             { return nil, nil }
func (f *fakeNode) Run(context.Context, string, string, string, string) (int, error) { return 0, nil }
func (f *fakeNode) DetachVolume(context.Context, string, string) error               { return nil }
func (f *fakeNode) AttachVolume(context.Context, string, node.VolumeAttachment) (string, error) {
	return "", errors.New("no volumes")
}
func (f *fakeNode) Reinit(_ context.Context, id string, req node.CreateRequest, cur string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.reinitErr != nil {
		return f.reinitErr
	}
	if f.sbs[id].EnvdToken != cur {
		return errors.New("wrong current token")
	}
	f.reinits[id] = req
	return nil
}
func (f *fakeNode) Get(_ context.Context, id string) (node.Sandbox, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.sbs[id]; !ok {
		return node.Sandbox{}, node.ErrNotFound
	}
	return node.Sandbox{ID: id, State: runtime.StateRunning}, nil
}
func (f *fakeNode) List(context.Context) ([]node.Sandbox, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []node.Sandbox
	for id := range f.sbs {
		out = append(out, node.Sandbox{ID: id, State: runtime.StateRunning})
	}
	return out, nil
}
func (f *fakeNode) UpdatePolicy(_ context.Context, id string, p network.Policy) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.policies[id] = p
	return nil
}
func (f *fakeNode) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.sbs)
}

// storeResolver resolves catalog rows the way the catalog does, minus names.
type storeResolver struct{ st store.Store }

func (r storeResolver) Resolve(ctx context.Context, ref string) (template.Template, error) {
	t, err := r.st.GetTemplate(ctx, ref)
	if err != nil {
		return template.Template{}, fmt.Errorf("%w: %s", template.ErrNotFound, ref)
	}
	return template.Template{ID: t.ID, Alias: t.ID, Layers: []string{"/nonexistent"}, Image: "mini", CPUCount: 1, MemoryMB: 128,
		BuildID: t.ReadyBuildID, PoolSize: t.PoolSize}, nil
}

func newPoolManager(t *testing.T) (*Manager, *fakeNode, store.Store) {
	t.Helper()
	return newPoolManagerWith(t, Config{})
}

func newPoolManagerWith(t *testing.T, cfg Config) (*Manager, *fakeNode, store.Store) {
	t.Helper()
	st, err := sqlite.Open(filepath.Join(t.TempDir(), "c.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	tpl := &store.Template{ID: "tpl", PrimaryName: "tpl", Names: []string{"tpl"}, ReadyBuildID: "b1", LatestBuildID: "b1", BuildStatus: store.BuildReady}
	if err := st.CreateTemplate(context.Background(), tpl, &store.TemplateBuild{ID: "b1", TemplateID: "tpl", Status: store.BuildReady, Rootfs: "/x"}); err != nil {
		t.Fatal(err)
	}
	n := newFakeNode()
	return New(cfg, st, n, storeResolver{st}), n, st
}

func setPool(t *testing.T, st store.Store, size int, build string) {
	t.Helper()
	tpl, err := st.GetTemplate(context.Background(), "tpl")
	if err != nil {
		t.Fatal(err)
	}
	tpl.PoolSize, tpl.ReadyBuildID = size, build
	if err := st.UpdateTemplate(context.Background(), tpl); err != nil {
		t.Fatal(err)
	}
}

func standbys(t *testing.T, m *Manager, build string) []string {
	t.Helper()
	ids, err := m.Standbys(context.Background(), "tpl", build)
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

func TestPoolFillClaimRefill(t *testing.T) {
	ctx := context.Background()
	m, n, st := newPoolManager(t)
	setPool(t, st, 2, "b1")
	if err := m.reconcilePool(ctx); err != nil {
		t.Fatal(err)
	}
	ids := standbys(t, m, "b1")
	if len(ids) != 2 || n.count() != 2 {
		t.Fatalf("after fill: standbys %v, node %d", ids, n.count())
	}
	if rows, _ := m.List(ctx, store.SandboxFilter{}); len(rows) != 0 {
		t.Fatalf("List shows standbys: %d", len(rows))
	}
	if _, err := m.Get(ctx, ids[0]); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Get of a standby: %v", err)
	}
	if err := m.Kill(ctx, ids[0], "user"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Kill of a standby: %v", err)
	}
	standbyToken := n.sbs[ids[0]].EnvdToken
	sb, err := m.Create(ctx, CreateOptions{TemplateID: "tpl", Metadata: map[string]string{"k": "v"}, EnvVars: map[string]string{"A": "1"},
		Network: store.Network{AllowInternet: false}, Timeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if sb.ID != ids[0] || sb.Metadata["k"] != "v" || IsStandby(sb) || sb.EnvdToken == standbyToken || sb.State != store.StateRunning {
		t.Fatalf("claim: %+v (oldest standby %s)", sb, ids[0])
	}
	if r := n.reinits[sb.ID]; r.EnvdToken != sb.EnvdToken || r.EnvVars["A"] != "1" {
		t.Fatalf("agent re-init: %+v", r)
	}
	if p, ok := n.policies[sb.ID]; !ok || p.AllowInternet {
		t.Fatalf("policy not applied: %+v %v", p, ok)
	}
	if time.Until(sb.EndAt) > time.Minute {
		t.Fatalf("claimed expiry %v", sb.EndAt)
	}
	if got, err := m.Get(ctx, sb.ID); err != nil || got.Metadata["k"] != "v" {
		t.Fatalf("claimed Get: %+v %v", got, err)
	}
	if rows, _ := m.List(ctx, store.SandboxFilter{}); len(rows) != 1 {
		t.Fatalf("List after claim: %d", len(rows))
	}
	if err := m.reconcilePool(ctx); err != nil {
		t.Fatal(err)
	}
	if ids := standbys(t, m, "b1"); len(ids) != 2 || n.count() != 3 {
		t.Fatalf("after refill: %v, node %d", ids, n.count())
	}
	setPool(t, st, 0, "b1")
	if err := m.reconcilePool(ctx); err != nil {
		t.Fatal(err)
	}
	if ids := standbys(t, m, "b1"); len(ids) != 0 || n.count() != 1 {
		t.Fatalf("after pool 0: %v, node %d", ids, n.count())
	}
}

func TestPoolRetiresStaleBuildAndNeverClaimsIt(t *testing.T) {
	ctx := context.Background()
	m, n, st := newPoolManager(t)
	setPool(t, st, 1, "b1")
	if err := m.reconcilePool(ctx); err != nil {
		t.Fatal(err)
	}
	old := standbys(t, m, "b1")
	// A new ready build: before the reconciler runs, a create must boot.
	setPool(t, st, 1, "b2")
	sb, err := m.Create(ctx, CreateOptions{TemplateID: "tpl"})
	if err != nil {
		t.Fatal(err)
	}
	if sb.ID == old[0] {
		t.Fatal("create claimed the standby of the previous build")
	}
	if err := m.reconcilePool(ctx); err != nil {
		t.Fatal(err)
	}
	if got, _ := st.GetSandbox(ctx, old[0]); got.State != store.StateKilled {
		t.Fatalf("old standby: %s", got.State)
	}
	if ids := standbys(t, m, "b2"); len(ids) != 1 || n.count() != 2 {
		t.Fatalf("new standbys %v, node %d", ids, n.count())
	}
}

func TestPoolClaimFailureBoots(t *testing.T) {
	ctx := context.Background()
	m, n, st := newPoolManager(t)
	setPool(t, st, 1, "b1")
	if err := m.reconcilePool(ctx); err != nil {
		t.Fatal(err)
	}
	ids := standbys(t, m, "b1")
	n.reinitErr = errors.New("agent gone")
	sb, err := m.Create(ctx, CreateOptions{TemplateID: "tpl"})
	if err != nil {
		t.Fatal(err)
	}
	if sb.ID == ids[0] {
		t.Fatal("failed claim returned the standby")
	}
	if got, _ := st.GetSandbox(ctx, ids[0]); got.State != store.StateKilled {
		t.Fatalf("half-claimed standby: %s", got.State)
	}
}

func TestPoolConcurrentClaims(t *testing.T) {
	ctx := context.Background()
	m, _, st := newPoolManager(t)
	setPool(t, st, 3, "b1")
	if err := m.reconcilePool(ctx); err != nil {
		t.Fatal(err)
	}
	pooled := map[string]bool{}
	for _, id := range standbys(t, m, "b1") {
		pooled[id] = true
	}
	var mu sync.Mutex
	got := map[string]bool{}
	var wg sync.WaitGroup
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sb, err := m.Create(ctx, CreateOptions{TemplateID: "tpl"})
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			defer mu.Unlock()
			if got[sb.ID] {
				t.Errorf("sandbox %s handed out twice", sb.ID)
			}
			got[sb.ID] = true
		}()
	}
	wg.Wait()
	hits := 0
	for id := range got {
		if pooled[id] {
			hits++
		}
	}
	if len(got) != 8 || hits != 3 {
		t.Fatalf("%d sandboxes, %d from the pool; want 8 and 3", len(got), hits)
	}
}

// Snapshot takes a snapshot of kind f.snapKind into the node's own
// snapshot dir; with no kind the node has no snapshots.
func (f *fakeNode) Snapshot(_ context.Context, _, sid string) (node.Snapshot, error) {
	if f.snapKind == "" {
		return node.Snapshot{}, node.ErrSnapshotUnsupported
	}
	if f.snapDir != "" {
		// Real files, so a push and a fetch move real bytes.
		dir := filepath.Join(f.snapDir, sid, "rootfs")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return node.Snapshot{}, err
		}
		if err := os.WriteFile(filepath.Join(dir, "marker"), []byte(sid), 0o644); err != nil {
			return node.Snapshot{}, err
		}
		if f.snapKind == runtime.SnapshotMemory {
			cp := filepath.Join(f.snapDir, sid, "checkpoint")
			if err := os.MkdirAll(cp, 0o755); err != nil {
				return node.Snapshot{}, err
			}
			if err := os.WriteFile(filepath.Join(cp, "pages"), []byte("memory of "+sid), 0o644); err != nil {
				return node.Snapshot{}, err
			}
		}
	}
	sn := node.Snapshot{ID: sid, Kind: f.snapKind, Layer: "/node/snapshots/" + sid + "/rootfs", SizeBytes: 1}
	if f.snapKind == runtime.SnapshotMemory {
		sn.Checkpoint = "/node/snapshots/" + sid + "/checkpoint"
	}
	return sn, nil
}
func (f *fakeNode) DeleteSnapshot(context.Context, string) error { return nil }
func (f *fakeNode) Snapshots(context.Context) ([]string, error)  { return nil, nil }

// PushSnapshot and FetchSnapshot move the files under snapDir through the
// real snapstore transfer (the URLs reach a real S3 server).
func (f *fakeNode) PushSnapshot(ctx context.Context, sid string, targets []node.SnapshotObject) ([]node.SnapshotObject, error) {
	if f.snapDir == "" {
		return nil, node.ErrSnapshotUnsupported
	}
	if f.pushErr != nil {
		return nil, f.pushErr
	}
	return snapstore.Push(ctx, http.DefaultClient, filepath.Join(f.snapDir, sid), targets)
}
func (f *fakeNode) FetchSnapshot(ctx context.Context, sid string, sources []node.SnapshotObject) error {
	if f.snapDir == "" {
		return node.ErrSnapshotUnsupported
	}
	if _, err := os.Stat(filepath.Join(f.snapDir, sid)); err == nil {
		return nil
	}
	f.mu.Lock()
	f.fetched = append(f.fetched, sid)
	f.mu.Unlock()
	return snapstore.Fetch(ctx, http.DefaultClient, filepath.Join(f.snapDir, sid), sources)
}

// Stop (a filesystem pause) works on a node that has snapshots.
func (f *fakeNode) Stop(context.Context, string) error {
	if f.snapKind == "" {
		return node.ErrSnapshotUnsupported
	}
	return nil
}

// Rebuild records the request when the node has snapshots.
func (f *fakeNode) Rebuild(_ context.Context, id string, req node.CreateRequest) error {
	if f.snapKind == "" {
		return node.ErrSnapshotUnsupported
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.sbs[id] = req
	return nil
}

// noAccelerators is the Accelerators service of a node without any.
type noAccelerators struct{}

func (noAccelerators) AcceleratorInventory(context.Context) ([]accel.Device, error) { return nil, nil }
func (noAccelerators) Accelerator(_ context.Context, id string) (accel.Device, error) {
	return accel.Device{}, fmt.Errorf("%w: %s", accel.ErrNotFound, id)
}
func (noAccelerators) DisableAccelerator(_ context.Context, id, _ string) (accel.Device, error) {
	return accel.Device{}, fmt.Errorf("%w: %s", accel.ErrNotFound, id)
}
func (noAccelerators) EnableAccelerator(_ context.Context, id string) (accel.Device, error) {
	return accel.Device{}, fmt.Errorf("%w: %s", accel.ErrNotFound, id)
}
func (noAccelerators) RecoverAccelerator(_ context.Context, id string) (accel.Device, error) {
	return accel.Device{}, fmt.Errorf("%w: %s", accel.ErrNotFound, id)
}
func (noAccelerators) DenyAccelerators(context.Context, string, error) error { return nil }
func (noAccelerators) AcceleratorEvents(context.Context, int) ([]accel.Event, error) {
	return nil, nil
}

// A pool whose template was created faster than its size allows grows to
// that demand (the most creates within demandBucket), within the memory
// budget beyond the set sizes; without a budget it keeps its size.
func TestPoolGrowsToDemandWithinBudget(t *testing.T) {
	ctx := context.Background()
	// Set size 2 at 128 MiB each, plus room for three more.
	m, _, st := newPoolManagerWith(t, Config{PoolMemoryMB: 5 * 128})
	setPool(t, st, 2, "b1")
	if err := m.reconcilePool(ctx); err != nil {
		t.Fatal(err)
	}
	if ids := standbys(t, m, "b1"); len(ids) != 2 {
		t.Fatalf("before demand: %d standbys, want the set 2", len(ids))
	}
	// A burst of 6: two claims, four boots.
	for range 6 {
		if _, err := m.Create(ctx, CreateOptions{TemplateID: "tpl", Network: store.Network{AllowInternet: true}, Timeout: time.Minute}); err != nil {
			t.Fatal(err)
		}
	}
	if err := m.reconcilePool(ctx); err != nil {
		t.Fatal(err)
	}
	if ids := standbys(t, m, "b1"); len(ids) != 5 {
		t.Fatalf("after a burst of 6: %d standbys, want 5 (the budget holds 3 beyond the set 2)", len(ids))
	}
	if n, err := m.PoolTarget(ctx, "tpl"); err != nil || n != 5 {
		t.Fatalf("PoolTarget: %d, %v; want 5", n, err)
	}

	// No budget: the set size, whatever the demand.
	m2, _, st2 := newPoolManager(t)
	setPool(t, st2, 2, "b1")
	for range 6 {
		if _, err := m2.Create(ctx, CreateOptions{TemplateID: "tpl", Network: store.Network{AllowInternet: true}, Timeout: time.Minute}); err != nil {
			t.Fatal(err)
		}
	}
	if err := m2.reconcilePool(ctx); err != nil {
		t.Fatal(err)
	}
	if ids := standbys(t, m2, "b1"); len(ids) != 2 {
		t.Fatalf("without a budget: %d standbys, want 2", len(ids))
	}
}

// A pool boots its missing standbys PoolRefillParallel at a time.
func TestPoolRefillsInParallel(t *testing.T) {
	ctx := context.Background()
	m, n, st := newPoolManagerWith(t, Config{PoolRefillParallel: 3})
	setPool(t, st, 5, "b1")
	n.mu.Lock()
	n.hold = make(chan struct{})
	n.mu.Unlock()
	done := make(chan error, 1)
	go func() { done <- m.reconcilePool(ctx) }()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		n.mu.Lock()
		in := n.inflight
		n.mu.Unlock()
		if in == 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d standby creates at once, want 3", in)
		}
	}
	n.mu.Lock()
	close(n.hold)
	n.mu.Unlock()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if ids := standbys(t, m, "b1"); len(ids) != 5 {
		t.Fatalf("%d standbys, want 5", len(ids))
	}
	if n.maxInflight != 3 {
		t.Fatalf("at most %d creates at once, want 3", n.maxInflight)
	}
}
