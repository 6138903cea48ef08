package control

import (
	"context"
	"errors"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/node"
	"github.com/cubicle-dev/cubicle/internal/nodeset"
	"github.com/cubicle-dev/cubicle/internal/store"
	"github.com/cubicle-dev/cubicle/internal/volume"
	volumeregistry "github.com/cubicle-dev/cubicle/internal/volume/registry"
)

// contentNode is a remote node that keeps volume references as a node
// does (one per holder; re-attaching an attached holder rewrites it) and
// counts its plugin attaches and detaches.
type contentNode struct {
	*remoteNode
	drivers []string

	vmu      sync.Mutex
	refs     map[string]node.VolumeRef // volume/holder
	attaches int
	detaches int
}

func (c *contentNode) Info(ctx context.Context) (node.Info, error) {
	i, err := c.remoteNode.Info(ctx)
	i.VolumeDrivers = c.drivers
	return i, err
}

func (c *contentNode) AttachVolume(_ context.Context, holder string, a node.VolumeAttachment) (string, error) {
	c.vmu.Lock()
	defer c.vmu.Unlock()
	k := a.VolumeID + "/" + holder
	if _, ok := c.refs[k]; !ok {
		c.attaches++
	}
	c.refs[k] = node.VolumeRef{VolumeID: a.VolumeID, Holder: holder, Kind: node.HolderContent, Driver: a.Driver,
		State: node.RefAttached, HostPath: "/mnt/" + a.VolumeID, UpdatedAt: time.Now()}
	return "/mnt/" + a.VolumeID, nil
}

func (c *contentNode) DetachVolume(_ context.Context, holder, volID string) error {
	c.vmu.Lock()
	defer c.vmu.Unlock()
	if _, ok := c.refs[volID+"/"+holder]; ok {
		c.detaches++
		delete(c.refs, volID+"/"+holder)
	}
	return nil
}

func (c *contentNode) VolumeRefs(context.Context) ([]node.VolumeRef, error) {
	c.vmu.Lock()
	defer c.vmu.Unlock()
	var out []node.VolumeRef
	for _, r := range c.refs {
		out = append(out, r)
	}
	return out, nil
}

func (c *contentNode) counts() (refs, attaches, detaches int) {
	c.vmu.Lock()
	defer c.vmu.Unlock()
	return len(c.refs), c.attaches, c.detaches
}

// contentCluster is a pure control plane over node-a and node-b (s3),
// node-c (s3, cordoned) and node-d (s3, its heartbeat lost).
func contentCluster(t *testing.T) (*Manager, store.Store, map[string]*contentNode) {
	t.Helper()
	ctx := context.Background()
	st := openSQLite(t)
	c := newCluster(t, st, map[string]int{"node-a": 4, "node-b": 4, "node-c": 4, "node-d": 4})
	nodes := map[string]*contentNode{}
	for id := range c.nodes {
		nodes[id] = &contentNode{remoteNode: c.nodes[id], drivers: []string{"s3", "local"}, refs: map[string]node.VolumeRef{}}
		row := &store.Node{ID: id, Address: id + ":7443", Runtime: "fake", VolumeDrivers: []string{"s3", "local"},
			Capacity: store.Capacity{MilliCPU: 4000, MemoryMiB: 1 << 20}}
		if id == "node-d" {
			row.HeartbeatAt = time.Now().Add(-time.Hour)
		}
		if err := st.RegisterNode(ctx, row); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := st.SetNodeFlags(ctx, "node-c", true, false); err != nil {
		t.Fatal(err)
	}
	set := nodeset.New(nodeset.Config{Registry: st, Dial: func(row *store.Node) (node.Node, io.Closer, error) {
		return nodes[row.ID], io.NopCloser(nil), nil
	}})
	reg, err := volumeregistry.Open([]volume.PluginConfig{{Name: "local", Type: volume.TypeLocal, Root: t.TempDir()}})
	if err != nil {
		t.Fatal(err)
	}
	m := New(Config{Nodes: set, Volumes: reg, ContentIdle: 20 * time.Millisecond}, st, nil, storeResolver{st})
	return m, st, nodes
}

func waitUntil(t *testing.T, what string, ok func() bool) {
	t.Helper()
	for range 500 {
		if ok() {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("still not so after 5s: %s", what)
}

// On a pure control plane the volume-content API leases the volume on a
// ready, uncordoned node that has its driver: a wrong token attaches
// nothing, concurrent requests share one attachment, and the lease is
// detached on that node after the idle period.
func TestVolumeContentLeaseOnARemoteNode(t *testing.T) {
	ctx := context.Background()
	m, st, nodes := contentCluster(t)
	if err := st.CreateVolume(ctx, &store.Volume{ID: "vol1", TeamID: store.DefaultTeamID, Name: "vol1", Driver: "s3", State: store.VolumeReady, Token: "tok"}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := m.OpenVolume(ctx, "vol1", "wrong"); !errors.Is(err, ErrUnauthorized) {
		t.Fatalf("wrong token: %v", err)
	}
	for id, n := range nodes {
		if _, a, _ := n.counts(); a != 0 {
			t.Fatalf("a wrong token attached the volume on %s", id)
		}
	}
	var releases []func()
	for range 3 {
		tgt, release, err := m.OpenVolume(ctx, "vol1", "tok")
		if err != nil {
			t.Fatal(err)
		}
		if tgt.Node != "node-a" || tgt.Dir != "" {
			t.Fatalf("target %+v, want remote node-a (the first ready node with the driver)", tgt)
		}
		releases = append(releases, release)
	}
	if refs, a, _ := nodes["node-a"].counts(); refs != 1 || a != 1 {
		t.Fatalf("node-a: %d refs after %d attaches, want one attachment for the lease", refs, a)
	}
	refs, _ := nodes["node-a"].VolumeRefs(ctx)
	for _, r := range refs {
		if !strings.HasPrefix(r.Holder, ContentHolder+"-") {
			t.Fatalf("holder %q: want this replica's own content holder", r.Holder)
		}
	}
	for _, r := range releases {
		r()
	}
	waitUntil(t, "node-a's content attachment is detached after the idle period", func() bool {
		refs, _, d := nodes["node-a"].counts()
		return refs == 0 && d == 1
	})
}

// Requests that keep coming do not keep a lease on a node that is lost:
// the next request after its heartbeat lapses leases the volume elsewhere.
func TestVolumeContentLeaseLeavesALostNode(t *testing.T) {
	ctx := context.Background()
	m, st, nodes := contentCluster(t)
	m.leases.idle, m.leases.recheck = time.Hour, 0
	if err := st.CreateVolume(ctx, &store.Volume{ID: "vol1", TeamID: store.DefaultTeamID, Name: "vol1", Driver: "s3", State: store.VolumeReady, Token: "tok"}); err != nil {
		t.Fatal(err)
	}
	tgt, release, err := m.OpenVolume(ctx, "vol1", "tok")
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	if tgt.Node != "node-a" {
		t.Fatalf("first lease on %q", tgt.Node)
	}
	if err := st.RegisterNode(ctx, &store.Node{ID: "node-a", Address: "node-a:7443", Runtime: "fake", VolumeDrivers: []string{"s3", "local"},
		Capacity: store.Capacity{MilliCPU: 4000, MemoryMiB: 1 << 20}, HeartbeatAt: time.Now().Add(-time.Hour)}); err != nil {
		t.Fatal(err)
	}
	tgt, release2, err := m.OpenVolume(ctx, "vol1", "tok")
	if err != nil {
		t.Fatal(err)
	}
	defer release2()
	if tgt.Node != "node-b" {
		t.Fatalf("after node-a was lost the lease is on %q, want node-b", tgt.Node)
	}
	if refs, _, _ := nodes["node-b"].counts(); refs != 1 {
		t.Fatalf("node-b: %d refs", refs)
	}
	// node-a's ref is no lease's any more: the reconcile releases it.
	if err := m.reconcileVolumes(ctx, false); err != nil {
		t.Fatal(err)
	}
	if refs, _, _ := nodes["node-a"].counts(); refs != 0 {
		t.Fatalf("node-a kept %d refs after the reconcile", refs)
	}
}

// The node choice: a live node where a live sandbox already holds the
// volume (no second mount), not one whose heartbeat lapsed; a host-bound
// (local) volume is 409 on a pure control plane (its files are the control
// plane's host's); 503 when no ready node has the driver.
func TestVolumeContentNodeChoice(t *testing.T) {
	ctx := context.Background()
	m, st, _ := contentCluster(t)
	for _, v := range []*store.Volume{
		{ID: "shared", Driver: "s3"}, {ID: "stale", Driver: "s3"}, {ID: "here", Driver: "local"}, {ID: "odd", Driver: "nfs"},
	} {
		v.TeamID, v.Name, v.State, v.Token = store.DefaultTeamID, v.ID, store.VolumeReady, "tok"
		if err := st.CreateVolume(ctx, v); err != nil {
			t.Fatal(err)
		}
	}
	hold := func(vol, nodeID string) {
		t.Helper()
		sb := &store.Sandbox{ID: "sb" + strings.ReplaceAll(vol+nodeID, "-", ""), TeamID: store.DefaultTeamID, TemplateID: "tpl", State: store.StateRunning, Node: nodeID,
			Volumes: []store.VolumeMount{{VolumeID: vol, Path: "/data"}}, StartedAt: time.Now(), EndAt: time.Now().Add(time.Hour)}
		if err := st.CreateSandbox(ctx, sb); err != nil {
			t.Fatal(err)
		}
	}
	hold("shared", "node-b")
	hold("stale", "node-d") // node-d's heartbeat is an hour old
	for vol, want := range map[string]string{"shared": "node-b", "stale": "node-a"} {
		tgt, release, err := m.OpenVolume(ctx, vol, "tok")
		if err != nil {
			t.Fatal(err)
		}
		release()
		if tgt.Node != want {
			t.Fatalf("%s served on %q, want %s", vol, tgt.Node, want)
		}
	}
	if _, _, err := m.OpenVolume(ctx, "here", "tok"); !errors.Is(err, ErrConflict) || !strings.Contains(err.Error(), "control plane's host") {
		t.Fatalf("a local volume without an in-process node: %v", err)
	}
	if _, _, err := m.OpenVolume(ctx, "odd", "tok"); !errors.Is(err, ErrVolumeUnavailable) || !strings.Contains(err.Error(), "nfs") {
		t.Fatalf("no node has the driver: %v", err)
	}
}

// The reconciler leaves another replica's recent content lease on a
// remote node alone and this replica's held one, and releases one that has
// not been touched for a long time (its replica is gone).
func TestReconcileKeepsOtherReplicasContentLeases(t *testing.T) {
	ctx := context.Background()
	m, st, nodes := contentCluster(t)
	if err := st.CreateVolume(ctx, &store.Volume{ID: "vol1", TeamID: store.DefaultTeamID, Name: "vol1", Driver: "s3", State: store.VolumeReady, Token: "tok"}); err != nil {
		t.Fatal(err)
	}
	m.leases.idle = time.Hour // this replica's lease stays while the test runs
	_, release, err := m.OpenVolume(ctx, "vol1", "tok")
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	a := nodes["node-a"]
	a.vmu.Lock()
	a.refs["vol1/volume-content-other"] = node.VolumeRef{VolumeID: "vol1", Holder: "volume-content-other", Kind: node.HolderContent, State: node.RefAttached, UpdatedAt: time.Now()}
	a.refs["vol1/volume-content-dead"] = node.VolumeRef{VolumeID: "vol1", Holder: "volume-content-dead", Kind: node.HolderContent, State: node.RefAttached, UpdatedAt: time.Now().Add(-24 * time.Hour)}
	a.vmu.Unlock()
	if err := m.reconcileVolumes(ctx, false); err != nil {
		t.Fatal(err)
	}
	a.vmu.Lock()
	defer a.vmu.Unlock()
	if _, ok := a.refs["vol1/"+m.leases.remoteHolder]; !ok {
		t.Fatal("the reconciler released this replica's held lease")
	}
	if _, ok := a.refs["vol1/volume-content-other"]; !ok {
		t.Fatal("the reconciler released another replica's recent lease")
	}
	if _, ok := a.refs["vol1/volume-content-dead"]; ok {
		t.Fatal("a lease nobody touched for a day is kept")
	}
}
