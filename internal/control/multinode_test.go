package control

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/diskbudget"
	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/network"
	"github.com/cubicle-dev/cubicle/internal/node"
	"github.com/cubicle-dev/cubicle/internal/nodeset"
	"github.com/cubicle-dev/cubicle/internal/scheduler"
	"github.com/cubicle-dev/cubicle/internal/scheduler/storeledger"
	"github.com/cubicle-dev/cubicle/internal/store"
	"github.com/cubicle-dev/cubicle/internal/store/postgres"
	"github.com/cubicle-dev/cubicle/internal/store/postgres/pgtest"
	"github.com/cubicle-dev/cubicle/internal/store/sqlite"
	"github.com/cubicle-dev/cubicle/internal/template"
)

// errNodeDown is how a node that cannot be reached fails (gRPC's
// Unavailable after the wire).
var errNodeDown = errdefs.New(errdefs.ErrUnavailable, "connection refused")

// remoteNode is the control package's fake node standing in for a remote
// one: down makes every call fail as an unreachable node does, and
// createErr makes only creates fail.
type remoteNode struct {
	*fakeNode
	down      atomic.Bool
	createErr error
	creates   atomic.Int64
}

func newRemoteNode() *remoteNode { return &remoteNode{fakeNode: newFakeNode()} }

func (r *remoteNode) Create(ctx context.Context, req node.CreateRequest) (node.Sandbox, error) {
	r.creates.Add(1)
	if r.down.Load() {
		return node.Sandbox{}, errNodeDown
	}
	if r.createErr != nil {
		return node.Sandbox{}, r.createErr
	}
	return r.fakeNode.Create(ctx, req)
}

func (r *remoteNode) Delete(ctx context.Context, id string) error {
	if r.down.Load() {
		return errNodeDown
	}
	return r.fakeNode.Delete(ctx, id)
}

func (r *remoteNode) Resume(ctx context.Context, id string, req node.CreateRequest) error {
	if r.down.Load() {
		return errNodeDown
	}
	if !r.has(id) {
		return errdefs.New(errdefs.ErrNotFound, "runtime: sandbox not found") // as node.Local answers
	}
	return r.fakeNode.Resume(ctx, id, req)
}

func (r *remoteNode) List(ctx context.Context) ([]node.Sandbox, error) {
	if r.down.Load() {
		return nil, errNodeDown
	}
	return r.fakeNode.List(ctx)
}

func (r *remoteNode) Get(ctx context.Context, id string) (node.Sandbox, error) {
	if r.down.Load() {
		return node.Sandbox{}, errNodeDown
	}
	return r.fakeNode.Get(ctx, id)
}

func (r *remoteNode) has(id string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	_, ok := r.sbs[id]
	return ok
}

func (r *remoteNode) policy(id string) (network.Policy, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	p, ok := r.policies[id]
	return p, ok
}

// cluster is a control plane with no in-process node over registered
// remote nodes, each answered in-process by a remoteNode (nodeset's Dial).
type cluster struct {
	m     *Manager
	st    store.Store
	nodes map[string]*remoteNode
}

// newCluster registers one node per entry of cpus (its CPUs; memory is
// ample) and builds the manager over them.
func newCluster(t *testing.T, st store.Store, cpus map[string]int) *cluster {
	t.Helper()
	ctx := context.Background()
	tpl := &store.Template{ID: "tpl", PrimaryName: "tpl", Names: []string{"tpl"}, ReadyBuildID: "b1", LatestBuildID: "b1", BuildStatus: store.BuildReady}
	if err := st.CreateTemplate(ctx, tpl, &store.TemplateBuild{ID: "b1", TemplateID: "tpl", Status: store.BuildReady, Rootfs: "/x"}); err != nil {
		t.Fatal(err)
	}
	c := &cluster{st: st, nodes: map[string]*remoteNode{}}
	for id, n := range cpus {
		c.nodes[id] = newRemoteNode()
		if err := st.RegisterNode(ctx, &store.Node{ID: id, Address: id + ":7443", Runtime: "fake",
			Capacity: store.Capacity{MilliCPU: int64(n) * 1000, MemoryMiB: 1 << 20}}); err != nil {
			t.Fatal(err)
		}
	}
	set := nodeset.New(nodeset.Config{Registry: st, Dial: func(row *store.Node) (node.Node, io.Closer, error) {
		n, ok := c.nodes[row.ID]
		if !ok {
			return nil, nil, fmt.Errorf("no fake for %s", row.ID)
		}
		return n, io.NopCloser(nil), nil
	}})
	c.m = New(Config{Nodes: set}, st, nil, storeResolver{st})
	return c
}

func openSQLite(t *testing.T) store.Store {
	t.Helper()
	st, err := sqlite.Open(filepath.Join(t.TempDir(), "c.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

func openPostgres(t *testing.T) store.Store {
	t.Helper()
	srv := pgtest.StartT(t)
	dsn, err := srv.NewDatabase(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	st, err := postgres.Open(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

func (c *cluster) create(t *testing.T) *store.Sandbox {
	t.Helper()
	sb, err := c.m.Create(context.Background(), CreateOptions{TemplateID: "tpl", Timeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	return sb
}

// Creates spread over the registered nodes, and every later call on a
// sandbox (network update, kill) reaches the node its row names.
func TestCallsRouteToTheSandboxNode(t *testing.T) {
	ctx := context.Background()
	c := newCluster(t, openSQLite(t), map[string]int{"node-a": 4, "node-b": 4})
	var sbs []*store.Sandbox
	on := map[string]int{}
	for range 4 {
		sb := c.create(t)
		if !c.nodes[sb.Node].has(sb.ID) {
			t.Fatalf("sandbox %s: row names %s, which does not hold it", sb.ID, sb.Node)
		}
		on[sb.Node]++
		sbs = append(sbs, sb)
	}
	if on["node-a"] != 2 || on["node-b"] != 2 {
		t.Fatalf("spread placed %v, want 2 and 2", on)
	}
	for _, sb := range sbs {
		if err := c.m.UpdateNetwork(ctx, sb.ID, store.Network{AllowInternet: true, DenyOut: []string{"10.1.2.3"}}); err != nil {
			t.Fatal(err)
		}
		for id, n := range c.nodes {
			p, ok := n.policy(sb.ID)
			if got := ok && len(p.DenyOut) == 1; got != (id == sb.Node) {
				t.Fatalf("network update of %s (on %s) reached node %s: %v", sb.ID, sb.Node, id, got)
			}
		}
	}
	for _, sb := range sbs {
		if err := c.m.Kill(ctx, sb.ID, "test"); err != nil {
			t.Fatal(err)
		}
		if c.nodes[sb.Node].has(sb.ID) {
			t.Fatalf("kill of %s did not reach %s", sb.ID, sb.Node)
		}
	}
	// A cordoned node gets nothing new.
	if _, err := c.st.SetNodeFlags(ctx, "node-a", true, false); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if sb := c.create(t); sb.Node != "node-b" {
			t.Fatalf("create landed on cordoned %s", sb.Node)
		}
	}
}

// A node whose heartbeat is older than the scheduler's lease TTL gets no
// new sandboxes, and a reconcile while it cannot be reached leaves its
// sandboxes as they are (never "all gone"), while still repairing the
// nodes it can reach.
func TestUnreachableNodeIsSkippedNotEmptied(t *testing.T) {
	ctx := context.Background()
	c := newCluster(t, openSQLite(t), map[string]int{"node-a": 4, "node-b": 4})
	a, b := c.create(t), c.create(t)
	if a.Node == b.Node {
		t.Fatalf("both on %s", a.Node)
	}
	down, up := c.nodes[a.Node], c.nodes[b.Node]
	down.down.Store(true)
	// The reachable node lost its sandbox (its agent crashed).
	if err := up.fakeNode.Delete(ctx, b.ID); err != nil {
		t.Fatal(err)
	}
	if err := c.m.reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	if got, _ := c.st.GetSandbox(ctx, a.ID); got.State != store.StateRunning {
		t.Fatalf("sandbox on the unreachable node: %s (%s)", got.State, got.KillReason)
	}
	if got, _ := c.st.GetSandbox(ctx, b.ID); got.State != store.StateKilled {
		t.Fatalf("sandbox gone from a reachable node: %s", got.State)
	}
	if err := c.m.Recover(ctx); err != nil {
		t.Fatal(err)
	}
	if got, _ := c.st.GetSandbox(ctx, a.ID); got.State != store.StateRunning {
		t.Fatalf("recover judged the unreachable node's sandbox: %s", got.State)
	}
	// Lost lease: a stale heartbeat keeps the node out of placement.
	if err := c.st.HeartbeatNode(ctx, a.Node, store.NodeHeartbeat{Capacity: store.Capacity{MilliCPU: 4000, MemoryMiB: 1 << 20},
		Time: time.Now().Add(-time.Hour)}); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if sb := c.create(t); sb.Node != b.Node {
			t.Fatalf("create placed on the node with a stale heartbeat")
		}
	}
}

// A create whose node fails with an unavailable-class error is retried
// once on another node: the row ends on the second node, the first node's
// reservation is released, and the event says why.
func TestCreateRetriesOnceElsewhere(t *testing.T) {
	ctx := context.Background()
	// node-a is emptier (spread picks it first).
	c := newCluster(t, openSQLite(t), map[string]int{"node-a": 8, "node-b": 4})
	c.nodes["node-a"].down.Store(true)
	sb := c.create(t)
	if sb.Node != "node-b" || !c.nodes["node-b"].has(sb.ID) || c.nodes["node-a"].creates.Load() != 1 {
		t.Fatalf("retry: row on %s, node-a tried %d times", sb.Node, c.nodes["node-a"].creates.Load())
	}
	committed, err := storeledger.New(c.st).Committed(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if committed["node-a"].MilliCPU != 0 || committed["node-b"].MilliCPU != 1000 {
		t.Fatalf("ledger after the retry: %+v", committed)
	}
	evs, err := c.st.ListEvents(ctx, sb.ID, time.Time{}, 100)
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, e := range evs {
		found = found || (e.Type == "create-retried" && strings.Contains(e.Message, "node-a"))
	}
	if !found {
		t.Fatalf("no create-retried event: %+v", evs)
	}
}

// When the second node fails too, the create fails with both reasons, and
// nothing stays reserved.
func TestCreateRetryFailsWithBothReasons(t *testing.T) {
	ctx := context.Background()
	c := newCluster(t, openSQLite(t), map[string]int{"node-a": 8, "node-b": 4})
	c.nodes["node-a"].down.Store(true)
	c.nodes["node-b"].createErr = errdefs.New(errdefs.ErrResourceExhausted, "address pool exhausted")
	_, err := c.m.Create(ctx, CreateOptions{TemplateID: "tpl", Timeout: time.Minute})
	var re *RetryError
	if !errors.As(err, &re) || re.FirstNode != "node-a" || re.SecondNode != "node-b" ||
		!strings.Contains(err.Error(), "connection refused") || !strings.Contains(err.Error(), "address pool exhausted") {
		t.Fatalf("want both reasons, got %v", err)
	}
	if !errors.Is(err, errdefs.ErrResourceExhausted) || !errors.Is(err, errNodeDown) {
		t.Fatalf("the error does not match both failures: %v", err)
	}
	if c.nodes["node-a"].creates.Load()+c.nodes["node-b"].creates.Load() != 2 {
		t.Fatalf("more than one retry: %d + %d", c.nodes["node-a"].creates.Load(), c.nodes["node-b"].creates.Load())
	}
	committed, err := storeledger.New(c.st).Committed(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for id, r := range committed {
		if r.MilliCPU != 0 {
			t.Fatalf("node %s still has %+v reserved", id, r)
		}
	}
}

// A node's refusal of the request itself is not retried elsewhere.
func TestCreateRefusalIsNotRetried(t *testing.T) {
	c := newCluster(t, openSQLite(t), map[string]int{"node-a": 8, "node-b": 4})
	c.nodes["node-a"].createErr = errdefs.New(errdefs.ErrInvalidArgument, "bad layer")
	_, err := c.m.Create(context.Background(), CreateOptions{TemplateID: "tpl", Timeout: time.Minute})
	if !errors.Is(err, errdefs.ErrInvalidArgument) || c.nodes["node-b"].creates.Load() != 0 {
		t.Fatalf("refusal: %v; node-b tried %d", err, c.nodes["node-b"].creates.Load())
	}
}

// With one node left and it failing, the first failure is the answer (no
// node to retry on).
func TestCreateRetryWithNoOtherNode(t *testing.T) {
	c := newCluster(t, openSQLite(t), map[string]int{"node-a": 8})
	c.nodes["node-a"].down.Store(true)
	_, err := c.m.Create(context.Background(), CreateOptions{TemplateID: "tpl", Timeout: time.Minute})
	var re *RetryError
	if !errors.Is(err, errNodeDown) || errors.As(err, &re) {
		t.Fatalf("want the node's own failure, got %v", err)
	}
}

// CubeSandbox #695: 50 concurrent creates against nodes with room for 30
// (one CPU each; 20 + 10 CPUs): exactly 30 succeed, the rest are refused
// with the scheduler's no-fit error (429), no node holds more than its
// CPUs, and the ledger agrees with the nodes.
func TestConcurrentCreatesNeverOversell(t *testing.T) {
	for _, tc := range []struct {
		name string
		open func(*testing.T) store.Store
	}{{"sqlite", openSQLite}, {"postgres", openPostgres}} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			c := newCluster(t, tc.open(t), map[string]int{"node-a": 20, "node-b": 10})
			var wg sync.WaitGroup
			var ok, nofit atomic.Int64
			errs := make(chan error, 50)
			for range 50 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					_, err := c.m.Create(ctx, CreateOptions{TemplateID: "tpl", Timeout: time.Minute})
					switch {
					case err == nil:
						ok.Add(1)
					case errors.Is(err, scheduler.ErrNoFit):
						nofit.Add(1)
					default:
						errs <- err
					}
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Errorf("unexpected create error: %v", err)
			}
			if ok.Load() != 30 || nofit.Load() != 20 {
				t.Fatalf("%d created, %d refused; want 30 and 20", ok.Load(), nofit.Load())
			}
			a, b := c.nodes["node-a"].count(), c.nodes["node-b"].count()
			if a != 20 || b != 10 {
				t.Fatalf("nodes hold %d and %d sandboxes, room for 20 and 10", a, b)
			}
			committed, err := storeledger.New(c.st).Committed(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if committed["node-a"].MilliCPU != 20000 || committed["node-b"].MilliCPU != 10000 {
				t.Fatalf("ledger: %+v", committed)
			}
		})
	}
}

// volumeNode is a remoteNode with a volume driver every node reaches
// ("shared"; the local driver pins a volume to one node).
type volumeNode struct{ *remoteNode }

func (v volumeNode) Info(ctx context.Context) (node.Info, error) {
	i, err := v.remoteNode.Info(ctx)
	i.VolumeDrivers = []string{"shared"}
	return i, err
}

// A volume shared by sandboxes on two nodes: each attachment row names
// its sandbox's node, the delete guard holds while any node holds the
// volume, and a node that cannot be reached keeps its reference until it
// confirms the detach (the volume seed).
func TestVolumeReferencesFollowNodes(t *testing.T) {
	ctx := context.Background()
	st := openSQLite(t)
	c := newCluster(t, st, map[string]int{"node-a": 4, "node-b": 4})
	for id := range c.nodes {
		if err := st.RegisterNode(ctx, &store.Node{ID: id, Address: id + ":7443", Runtime: "fake", VolumeDrivers: []string{"shared"},
			Capacity: store.Capacity{MilliCPU: 4000, MemoryMiB: 1 << 20}}); err != nil {
			t.Fatal(err)
		}
	}
	set := nodeset.New(nodeset.Config{Registry: st, Dial: func(row *store.Node) (node.Node, io.Closer, error) {
		return volumeNode{c.nodes[row.ID]}, io.NopCloser(nil), nil
	}})
	c.m = New(Config{Nodes: set}, st, nil, storeResolver{st})
	if err := st.CreateVolume(ctx, &store.Volume{ID: "vol1", TeamID: store.DefaultTeamID, Name: "shared", Driver: "shared", State: store.VolumeReady}); err != nil {
		t.Fatal(err)
	}
	on := map[string]*store.Sandbox{}
	for range 2 {
		sb, err := c.m.Create(ctx, CreateOptions{TemplateID: "tpl", TeamID: store.DefaultTeamID, Timeout: time.Minute,
			VolumeMounts: []VolumeMount{{Name: "shared", Path: "/data"}}})
		if err != nil {
			t.Fatal(err)
		}
		on[sb.Node] = sb
	}
	if len(on) != 2 {
		t.Fatalf("both sandboxes on one node: %v", on)
	}
	atts, err := st.ListVolumeAttachments(ctx, "vol1", "")
	if err != nil {
		t.Fatal(err)
	}
	nodes := map[string]bool{}
	for _, a := range atts {
		nodes[a.Node] = true
	}
	if len(atts) != 2 || !nodes["node-a"] || !nodes["node-b"] {
		t.Fatalf("attachment rows: %+v", atts)
	}
	c.nodes["node-b"].down.Store(true)
	for _, sb := range on {
		if err := c.m.Kill(ctx, sb.ID, "test"); err != nil {
			t.Fatal(err)
		}
	}
	held := func() bool {
		t.Helper()
		atts, err := st.ListVolumeAttachments(ctx, "vol1", "")
		if err != nil {
			t.Fatal(err)
		}
		return len(atts) == 1 && atts[0].Node == "node-b"
	}
	if !held() {
		t.Fatal("after the kills, only unreachable node-b's reference should remain")
	}
	if _, err := st.MarkVolumeDeleting(ctx, "vol1"); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("delete while node-b holds the volume: %v", err)
	}
	// The reconcile reports that node-b could not be reached, and keeps its row.
	if err := c.m.reconcileVolumes(ctx, false); !errors.Is(err, errNodeDown) {
		t.Fatalf("reconcile with node-b down: %v", err)
	}
	if !held() {
		t.Fatal("the reconcile dropped the reference of a node that did not confirm")
	}
	c.nodes["node-b"].down.Store(false)
	if err := c.m.reconcileVolumes(ctx, false); err != nil {
		t.Fatal(err)
	}
	if atts, _ := st.ListVolumeAttachments(ctx, "vol1", ""); len(atts) != 0 {
		t.Fatalf("node-b confirmed, references left: %+v", atts)
	}
	if _, err := st.MarkVolumeDeleting(ctx, "vol1"); err != nil {
		t.Fatalf("delete once no node holds it: %v", err)
	}
}

// A registered node without an address (another replica's in-process
// node) is neither offered to the scheduler nor reconciled here.
func TestNodeWithoutAddressIsNotDriven(t *testing.T) {
	ctx := context.Background()
	c := newCluster(t, openSQLite(t), map[string]int{"node-a": 2})
	if err := c.st.RegisterNode(ctx, &store.Node{ID: "other-replica", Runtime: "fake",
		Capacity: store.Capacity{MilliCPU: 64000, MemoryMiB: 1 << 20}}); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if sb := c.create(t); sb.Node != "node-a" {
			t.Fatalf("placed on %s", sb.Node)
		}
	}
	if _, err := c.m.Create(ctx, CreateOptions{TemplateID: "tpl", Timeout: time.Minute}); !errors.Is(err, scheduler.ErrNoFit) {
		t.Fatalf("node-a is full: %v", err)
	}
	if err := c.m.reconcile(ctx); err != nil {
		t.Fatal(err)
	}
}

// An exit report is taken only from the node the sandbox's row names: a
// node (hostile by assumption) reporting another node's sandbox as exited
// kills nothing, while the owner's report still does.
func TestExitReportOnlyFromOwningNode(t *testing.T) {
	ctx := context.Background()
	c := newCluster(t, openSQLite(t), map[string]int{"node-a": 4, "node-b": 4})
	a, b := c.create(t), c.create(t)
	if a.Node == b.Node {
		t.Fatalf("both on %s", a.Node)
	}
	report := func(from string, id string) {
		exits := make(chan node.Exit, 1)
		exits <- node.Exit{ID: id}
		close(exits)
		c.m.watchExits(ctx, from, exits)
	}
	report(b.Node, a.ID)
	if got, _ := c.st.GetSandbox(ctx, a.ID); got.State != store.StateRunning || !c.nodes[a.Node].has(a.ID) {
		t.Fatalf("node %s's report of %s (on %s) was believed: row %s (%s)", b.Node, a.ID, a.Node, got.State, got.KillReason)
	}
	report(a.Node, a.ID)
	if got, _ := c.st.GetSandbox(ctx, a.ID); got.State != store.StateKilled || got.KillReason != reasonExited {
		t.Fatalf("the owner's report: row %s (%s), want killed (%s)", got.State, got.KillReason, reasonExited)
	}
}

// diskResolver gives storeResolver's templates a 1 GiB disk.
type diskResolver struct{ storeResolver }

func (r diskResolver) Resolve(ctx context.Context, ref string) (template.Template, error) {
	t, err := r.storeResolver.Resolve(ctx, ref)
	t.DiskSizeMB = 1024
	return t, err
}

// The disk budget is the in-process node's data filesystem: a create
// placed on a remote node (which has its own disk) is not refused because
// the control plane's filesystem is full, while one on the in-process
// node still is.
func TestDiskBudgetOnlyForLocalNode(t *testing.T) {
	ctx := context.Background()
	full := diskbudget.New(diskbudget.Config{Dir: t.TempDir(), Reserve: func(total int64) int64 { return total }})
	c := newCluster(t, openSQLite(t), map[string]int{"node-a": 4})
	m := New(Config{Nodes: c.m.nodes, Disk: full}, c.st, nil, diskResolver{storeResolver{c.st}})
	sb, err := m.Create(ctx, CreateOptions{TemplateID: "tpl", Timeout: time.Minute})
	if err != nil {
		t.Fatalf("create on a remote node with the control plane's disk full: %v", err)
	}
	if sb.Node != "node-a" {
		t.Fatalf("placed on %s", sb.Node)
	}
	_, _, st := newPoolManager(t)
	m = New(Config{Disk: full}, st, newFakeNode(), diskResolver{storeResolver{st}})
	if _, err := m.Create(ctx, CreateOptions{TemplateID: "tpl", Timeout: time.Minute}); !errors.Is(err, diskbudget.ErrInsufficientStorage) {
		t.Fatalf("create on the in-process node with its disk full: %v, want insufficient storage", err)
	}
}

// A replica starting (Recover) while another replica creates a sandbox on
// a remote node leaves that create alone: its row is still creating and
// was just written, so it belongs to an operation in flight elsewhere, and
// the node's copy is not an orphan. A creating row nobody touched for
// longer than any create lasts is still reaped.
func TestRecoverLeavesOtherReplicasOperations(t *testing.T) {
	ctx := context.Background()
	c := newCluster(t, openSQLite(t), map[string]int{"node-a": 4})
	now := time.Now().UTC()
	creating := func(updated time.Time) *store.Sandbox {
		sb := &store.Sandbox{ID: NewID(), TemplateID: "tpl", State: store.StateCreating, Node: "node-a", StartedAt: updated,
			EndAt: now.Add(time.Hour), UpdatedAt: updated}
		if err := c.st.CreateSandbox(ctx, sb); err != nil {
			t.Fatal(err)
		}
		if _, err := c.nodes["node-a"].fakeNode.Create(ctx, node.CreateRequest{ID: sb.ID}); err != nil {
			t.Fatal(err)
		}
		return sb
	}
	inFlight, abandoned := creating(now), creating(now.Add(-staleOperation-time.Minute))
	if err := c.m.Recover(ctx); err != nil {
		t.Fatal(err)
	}
	if got, _ := c.st.GetSandbox(ctx, inFlight.ID); got.State != store.StateCreating {
		t.Fatalf("another replica's create in flight: row %s (%s), want creating", got.State, got.KillReason)
	}
	if !c.nodes["node-a"].has(inFlight.ID) {
		t.Fatal("another replica's create in flight was deleted from its node as an orphan")
	}
	// Long past any create: the replica that wrote it is gone.
	if got, _ := c.st.GetSandbox(ctx, abandoned.ID); got.State != store.StateKilled || c.nodes["node-a"].has(abandoned.ID) {
		t.Fatalf("a create abandoned long ago: row %s, on the node %v; want killed and deleted", got.State, c.nodes["node-a"].has(abandoned.ID))
	}
}

// The ledger's allocatable follows the node's capacity whichever replica
// last wrote it: a node whose capacity goes 8, 4, 8 CPUs, placed on by
// replica a, then b, then a again, ends with 8 in the ledger (a replica
// that remembered only its own last write kept b's 4, or with the values
// the other way round, oversold).
func TestAllocatableFollowsOtherReplicasWrites(t *testing.T) {
	ctx := context.Background()
	c := newCluster(t, openSQLite(t), map[string]int{"node-a": 8})
	a := c.m
	b := New(Config{Nodes: a.nodes}, c.st, nil, storeResolver{c.st})
	setCPUs := func(n int64) {
		t.Helper()
		if err := c.st.HeartbeatNode(ctx, "node-a", store.NodeHeartbeat{Address: "node-a:7443", Capacity: store.Capacity{MilliCPU: n * 1000, MemoryMiB: 1 << 20}}); err != nil {
			t.Fatal(err)
		}
	}
	for _, step := range []struct {
		m    *Manager
		cpus int64
	}{{a, 8}, {b, 4}, {a, 8}} {
		setCPUs(step.cpus)
		if _, err := step.m.Create(ctx, CreateOptions{TemplateID: "tpl", Timeout: time.Minute}); err != nil {
			t.Fatal(err)
		}
		alloc, err := c.st.AllocatableCapacity(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if got := alloc["node-a"].MilliCPU; got != step.cpus*1000 {
			t.Fatalf("after a create with the node at %d CPUs: ledger allocatable %d milliCPU", step.cpus, got)
		}
	}
}

// localVolumeNode is a remoteNode with the local volume driver.
type localVolumeNode struct{ *remoteNode }

func (v localVolumeNode) Info(ctx context.Context) (node.Info, error) {
	i, err := v.remoteNode.Info(ctx)
	i.VolumeDrivers = []string{"local"}
	return i, err
}

// A volume of the local driver is a directory of one node: creates that
// mount it are placed on the node that holds it (a scheduler pin whose
// reason the no-fit error names), never on another node, whose plugin
// would mount a different directory of the same name. Without a node
// holding it and without an in-process node (where the control plane's
// plugin made it), no node can mount it.
func TestLocalVolumePinsCreates(t *testing.T) {
	ctx := context.Background()
	st := openSQLite(t)
	c := newCluster(t, st, map[string]int{"node-a": 4, "node-b": 4})
	for id := range c.nodes {
		if err := st.RegisterNode(ctx, &store.Node{ID: id, Address: id + ":7443", Runtime: "fake", VolumeDrivers: []string{"local"},
			Capacity: store.Capacity{MilliCPU: 4000, MemoryMiB: 1 << 20}}); err != nil {
			t.Fatal(err)
		}
	}
	set := nodeset.New(nodeset.Config{Registry: st, Dial: func(row *store.Node) (node.Node, io.Closer, error) {
		return localVolumeNode{c.nodes[row.ID]}, io.NopCloser(nil), nil
	}})
	c.m = New(Config{Nodes: set}, st, nil, storeResolver{st})
	if err := st.CreateVolume(ctx, &store.Volume{ID: "vol1", TeamID: store.DefaultTeamID, Name: "data", Driver: "local", State: store.VolumeReady}); err != nil {
		t.Fatal(err)
	}
	mount := CreateOptions{TemplateID: "tpl", TeamID: store.DefaultTeamID, Timeout: time.Minute, VolumeMounts: []VolumeMount{{Name: "data", Path: "/data"}}}
	_, err := c.m.Create(ctx, mount)
	if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "--embedded-node=false") {
		t.Fatalf("a local volume no node holds, without an in-process node: %v", err)
	}
	// node-b holds it (a sandbox of it runs there).
	if err := st.CreateSandbox(ctx, &store.Sandbox{ID: "holder00000000000000", TeamID: store.DefaultTeamID, TemplateID: "tpl", State: store.StateRunning,
		Node: "node-b", StartedAt: time.Now(), EndAt: time.Now().Add(time.Hour), Volumes: []store.VolumeMount{{VolumeID: "vol1", Path: "/data"}}}); err != nil {
		t.Fatal(err)
	}
	for range 4 {
		sb, err := c.m.Create(ctx, mount)
		if err != nil {
			t.Fatal(err)
		}
		if sb.Node != "node-b" {
			t.Fatalf("a sandbox of node-b's local volume was placed on %s", sb.Node)
		}
	}
	if _, err := st.SetNodeFlags(ctx, "node-b", true, false); err != nil {
		t.Fatal(err)
	}
	_, err = c.m.Create(ctx, mount)
	var nf *scheduler.NoFitError
	if !errors.As(err, &nf) || !strings.Contains(err.Error(), "volume 'data' of the local driver is a directory of node node-b") {
		t.Fatalf("node-b cordoned: %v, want a no-fit naming the volume's node", err)
	}
	// Without the volume, node-a takes creates.
	if sb := c.create(t); sb.Node != "node-a" {
		t.Fatalf("a create without the volume went to %s", sb.Node)
	}
}
