package control

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/runtime"
	"github.com/cubicle-dev/cubicle/internal/scheduler"
	"github.com/cubicle-dev/cubicle/internal/scheduler/storeledger"
	"github.com/cubicle-dev/cubicle/internal/snapstore"
	"github.com/cubicle-dev/cubicle/internal/store"
	"github.com/cubicle-dev/cubicle/internal/volume/s3/s3test"
)

// loseNode makes nodeID silent (its calls fail as an unreachable node's
// do, its last heartbeat past the threshold, not the grace) and runs the node-loss loop's pass,
// which makes its running and paused sandboxes lost.
func (c *cluster) loseNode(t *testing.T, nodeID string) {
	t.Helper()
	c.nodes[nodeID].down.Store(true)
	beatAt(t, c.st, nodeID, time.Now().Add(-DefaultNodeLostAfter-5*time.Second))
	_ = c.m.detectNodeLoss(context.Background()) // the silent node's calls fail
}

func (c *cluster) events(t *testing.T, id string) []string {
	t.Helper()
	evs, err := c.st.ListEvents(context.Background(), id, time.Time{}, 100)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range evs {
		out = append(out, e.Type+": "+e.Message)
	}
	return out
}

func eventWith(evs []string, prefix string) bool {
	return slices.ContainsFunc(evs, func(e string) bool { return strings.HasPrefix(e, prefix) })
}

// paused creates a sandbox with opts (template "tpl" for a minute unless
// they say otherwise) and pauses it, with its memory when keepMemory. It
// returns the sandbox as created and its row after the pause (the pause
// package is on the row only).
func (c *cluster) paused(t *testing.T, opts CreateOptions, keepMemory bool) (sb, row *store.Sandbox) {
	t.Helper()
	ctx := context.Background()
	if opts.TemplateID == "" {
		opts.TemplateID = "tpl"
	}
	if opts.Timeout == 0 {
		opts.Timeout = time.Minute
	}
	sb, err := c.m.Create(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.m.Pause(ctx, sb.ID, keepMemory); err != nil {
		t.Fatal(err)
	}
	if row, err = c.st.GetSandbox(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	return sb, row
}

// moveRefused loses sb's node; connect must then refuse to move sb with
// ErrConflict naming want, and change nothing: the row stays lost on its
// node, and the other node has no copy.
func (c *cluster) moveRefused(t *testing.T, sb *store.Sandbox, want string) {
	t.Helper()
	ctx := context.Background()
	c.loseNode(t, sb.Node)
	_, _, err := c.m.Connect(ctx, sb.ID, time.Minute, false)
	if !errors.Is(err, ErrConflict) || !strings.Contains(err.Error(), want) {
		t.Fatalf("connect: %v, want ErrConflict naming %q", err, want)
	}
	if row, _ := c.st.GetSandbox(ctx, sb.ID); row.State != store.StateLost || row.Node != sb.Node {
		t.Fatalf("a refused move changed the row: %s on %s", row.State, row.Node)
	}
	if c.nodes[other(sb.Node)].has(sb.ID) {
		t.Fatalf("a refused move left a sandbox on the other node")
	}
}

// killPurges kills sandbox id and runs the snapshot pass, which must
// delete the objects of its pause package snapshotID from gw.
func (c *cluster) killPurges(t *testing.T, gw *s3test.Server, id, snapshotID string) {
	t.Helper()
	ctx := context.Background()
	if err := c.m.Kill(ctx, id, "done"); err != nil {
		t.Fatal(err)
	}
	if err := c.m.reconcileSnapshots(ctx); err != nil {
		t.Fatal(err)
	}
	if keys := gw.Keys(t, snapshotID+"/"); len(keys) != 0 {
		t.Fatalf("pause package %s left after its sandbox was killed: %v", snapshotID, keys)
	}
}

// A filesystem pause with a snapshot store is packaged in the pause call;
// when the sandbox's node is lost, connect resumes it on the other node,
// which fetches the package (real bytes through versitygw) and boots the
// same sandbox (ID, token, env) over the pause's files. The old node's
// copy goes at the reconcile once that node answers, and the package
// goes with the sandbox.
func TestPausedSandboxResumesOnAnotherNode(t *testing.T) {
	ctx := context.Background()
	c, gw := newSnapCluster(t, true)
	sb, row := c.paused(t, CreateOptions{EnvVars: map[string]string{"K": "v"}, Metadata: map[string]string{"m": "1"}}, false)
	from, to := sb.Node, other(sb.Node)
	pp := row.PausePackage
	if pp == nil || pp.FilesOnly {
		t.Fatalf("pause package after a filesystem pause: %+v", pp)
	}
	if keys := gw.Keys(t, pp.SnapshotID+"/"); len(keys) != 1 || keys[0] != pp.SnapshotID+"/"+snapstore.PartRootfs+".tar" {
		t.Fatalf("objects of the pause package: %v", keys)
	}
	if _, err := c.st.GetTemplate(ctx, pp.SnapshotID); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("the pause package has a template row: %v", err)
	}
	// Internal: never listed, and its files stay while the sandbox is paused.
	if l, _ := c.m.ListSnapshots(ctx, store.SnapshotFilter{}, ""); len(l.Snapshots) != 0 {
		t.Fatalf("pause package listed: %+v", l.Snapshots)
	}
	if err := c.m.reconcileSnapshots(ctx); err != nil {
		t.Fatal(err)
	}
	if keys := gw.Keys(t, pp.SnapshotID+"/"); len(keys) != 1 {
		t.Fatalf("the snapshot pass removed a live pause package: %v", keys)
	}

	c.loseNode(t, from)
	if row, _ = c.st.GetSandbox(ctx, sb.ID); row.State != store.StateLost {
		t.Fatalf("state after its node was lost: %s", row.State)
	}
	got, resumed, err := c.m.Connect(ctx, sb.ID, time.Minute, false)
	if err != nil || !resumed {
		t.Fatalf("connect to a paused sandbox of a lost node: %v (resumed %v)", err, resumed)
	}
	if got.Node != to || got.State != store.StateRunning {
		t.Fatalf("after connect: node %s state %s, want %s running", got.Node, got.State, to)
	}
	row, _ = c.st.GetSandbox(ctx, sb.ID)
	if row.Node != to || row.State != store.StateRunning || row.PausePackage != nil || row.SnapshotLayers[0] != pp.SnapshotID {
		t.Fatalf("row after the move: node %s state %s package %+v chain %v", row.Node, row.State, row.PausePackage, row.SnapshotLayers)
	}
	dst := c.nodes[to]
	if b, err := os.ReadFile(filepath.Join(dst.snapDir, pp.SnapshotID, "rootfs", "marker")); err != nil || string(b) != pp.SnapshotID {
		t.Fatalf("node %s's copy of the pause package: %q %v", to, b, err)
	}
	req := dst.req(sb.ID)
	if req.ID != sb.ID || req.EnvdToken != sb.EnvdToken || req.EnvVars["K"] != "v" || req.SnapshotLayers[0] != pp.SnapshotID ||
		req.Restore != "" || req.RestoreSnapshot != "" || req.Image.Name != "mini" {
		t.Fatalf("create on %s: %+v", to, req)
	}
	if row.Metadata["m"] != "1" || row.EnvdToken != sb.EnvdToken {
		t.Fatalf("row lost its metadata or token: %+v", row)
	}
	if evs := c.events(t, sb.ID); !eventWith(evs, "moved: resumed on node "+to+", moved from node "+from+" (node "+from+" lost)") {
		t.Fatalf("events: %q", evs)
	}
	// The ledger holds the reservation on the new node only.
	committed, err := storeledger.New(c.st).Committed(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if committed[from] != (scheduler.Resources{}) || committed[to] == (scheduler.Resources{}) {
		t.Fatalf("committed after the move: %+v", committed)
	}

	// The old node returns: its copy is a leftover, deleted at the first
	// node-loss pass that sees it back (and by the periodic reconcile).
	c.nodes[from].down.Store(false)
	if !c.nodes[from].has(sb.ID) {
		t.Fatalf("the lost node's copy went before it returned")
	}
	beatAt(t, c.st, from, time.Now())
	if err := c.m.detectNodeLoss(ctx); err != nil {
		t.Fatal(err)
	}
	if c.nodes[from].has(sb.ID) {
		t.Fatalf("node %s kept the moved sandbox after it returned", from)
	}
	if err := c.m.reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	if !c.nodes[to].has(sb.ID) {
		t.Fatalf("the reconcile removed the sandbox from its new node")
	}
	// Killed: its chain (the pause package among it) is purged.
	c.killPurges(t, gw, sb.ID, pp.SnapshotID)
}

// A package is only ever this pause's: a resume clears it (and the next
// snapshot pass deletes it), and a pause whose upload failed has none, so
// the sandbox stays on its node: connect while that node is lost is 409
// naming why, and nothing changes.
func TestStalePausePackageRefused(t *testing.T) {
	ctx := context.Background()
	c, gw := newSnapCluster(t, true)
	sb, row := c.paused(t, CreateOptions{}, false)
	first := row.PausePackage.SnapshotID
	if _, _, err := c.m.Connect(ctx, sb.ID, time.Minute, false); err != nil {
		t.Fatal(err)
	}
	if row, _ = c.st.GetSandbox(ctx, sb.ID); row.PausePackage != nil || row.Node != sb.Node {
		t.Fatalf("after a resume on its node: package %+v node %s", row.PausePackage, row.Node)
	}
	if err := c.m.reconcileSnapshots(ctx); err != nil {
		t.Fatal(err)
	}
	if keys := gw.Keys(t, first+"/"); len(keys) != 0 {
		t.Fatalf("the previous pause's package was kept: %v", keys)
	}
	c.nodes[sb.Node].pushErr = errors.New("upload refused")
	if err := c.m.Pause(ctx, sb.ID, false); err != nil {
		t.Fatalf("a pause whose package failed: %v", err)
	}
	if row, _ = c.st.GetSandbox(ctx, sb.ID); row.State != store.StatePaused || row.PausePackage != nil {
		t.Fatalf("after a failed package: state %s package %+v", row.State, row.PausePackage)
	}
	if evs := c.events(t, sb.ID); !eventWith(evs, "pause-package-failed") {
		t.Fatalf("events: %q", evs)
	}
	c.moveRefused(t, sb, "no package")
}

// Pinned paused sandboxes: each refusal is 409 with the reason and
// changes nothing; a pinned sandbox on a cordoned node resumes there.
func TestPinnedPausedSandboxes(t *testing.T) {
	ctx := context.Background()
	t.Run("NoSnapshotStore", func(t *testing.T) {
		c, _ := newSnapCluster(t, false)
		sb, _ := c.paused(t, CreateOptions{}, false)
		c.moveRefused(t, sb, "--snapshot-store")
	})
	t.Run("BootedByPath", func(t *testing.T) {
		c, _ := newSnapCluster(t, true)
		for _, n := range c.nodes {
			n.pulls = false
		}
		sb, _ := c.paused(t, CreateOptions{}, false)
		c.moveRefused(t, sb, "not by reference")
	})
	pausedWith := func(t *testing.T, edit func(c *cluster, sb *store.Sandbox)) (*cluster, *store.Sandbox) {
		c, _ := newSnapCluster(t, true)
		_, row := c.paused(t, CreateOptions{}, false)
		edit(c, row)
		if err := c.st.UpdateSandbox(ctx, row); err != nil {
			t.Fatal(err)
		}
		return c, row
	}
	t.Run("Accelerators", func(t *testing.T) {
		c, sb := pausedWith(t, func(_ *cluster, sb *store.Sandbox) { sb.Accelerators = `[{"count":1}]` })
		c.moveRefused(t, sb, "accelerators")
	})
	t.Run("LocalVolume", func(t *testing.T) {
		c, sb := pausedWith(t, func(c *cluster, sb *store.Sandbox) {
			if err := c.st.CreateVolume(ctx, &store.Volume{ID: "vol", TeamID: sb.TeamID, Name: "vol", Driver: "local", State: store.VolumeReady}); err != nil {
				t.Fatal(err)
			}
			sb.Volumes = []store.VolumeMount{{VolumeID: "vol", Path: "/data"}}
		})
		c.moveRefused(t, sb, "local driver")
	})
	t.Run("HostMounts", func(t *testing.T) {
		c, sb := pausedWith(t, func(_ *cluster, sb *store.Sandbox) {
			sb.Metadata = map[string]string{"host-mount": `[{"hostPath":"/data/shared/a","mountPath":"/mnt/a"}]`}
		})
		c.moveRefused(t, sb, "host directories")
	})
	t.Run("CordonedResumesInPlace", func(t *testing.T) {
		c, _ := newSnapCluster(t, false)
		sb, _ := c.paused(t, CreateOptions{}, false)
		if _, err := c.st.SetNodeFlags(ctx, sb.Node, true, false); err != nil {
			t.Fatal(err)
		}
		got, _, err := c.m.Connect(ctx, sb.ID, time.Minute, false)
		if err != nil || got.Node != sb.Node {
			t.Fatalf("a pinned sandbox of a cordoned node: %v on %v", err, got)
		}
	})
}

// A runc pause with memory keeps the memory frozen in its node's RAM: the
// package holds its files only, so it moves only with a reboot.
func TestRuncMemoryPauseMovesOnlyWithReboot(t *testing.T) {
	ctx := context.Background()
	c, _ := newSnapCluster(t, true)
	sb, row := c.paused(t, CreateOptions{}, true)
	if row.PausePackage == nil || !row.PausePackage.FilesOnly {
		t.Fatalf("package of a runc memory pause: %+v", row.PausePackage)
	}
	c.moveRefused(t, sb, "reboot") // keeping its memory
	got, _, err := c.m.Connect(ctx, sb.ID, time.Minute, true)
	if err != nil || got.Node != other(sb.Node) {
		t.Fatalf("connect with reboot: %v", err)
	}
	if req := c.nodes[got.Node].req(sb.ID); req.RestoreSnapshot != "" || req.Restore != "" {
		t.Fatalf("a files-only package restored memory: %+v", req)
	}
	if evs := c.events(t, sb.ID); !eventWith(evs, "moved:") || !strings.Contains(strings.Join(evs, "\n"), "booted afresh over its files") {
		t.Fatalf("events: %q", evs)
	}
}

// A runsc pause's package holds its checkpoint: on another node of the
// same runtime the sandbox is restored with its memory (and the token its
// restored agent holds).
func TestRunscMemoryPauseMovesWithMemory(t *testing.T) {
	ctx := context.Background()
	c, gw := newSnapCluster(t, true)
	for _, n := range c.nodes {
		n.snapKind = runtime.SnapshotMemory
	}
	sb, row := c.paused(t, CreateOptions{}, true)
	pp := row.PausePackage
	if pp == nil || pp.FilesOnly {
		t.Fatalf("package of a runsc memory pause: %+v", pp)
	}
	if keys := gw.Keys(t, pp.SnapshotID+"/"); len(keys) != 2 {
		t.Fatalf("objects: %v, want the layer and the checkpoint", keys)
	}
	// The other node is cordoned, not lost: it answers, and its copy goes
	// at once.
	from := sb.Node
	if _, err := c.st.SetNodeFlags(ctx, from, false, true); err != nil {
		t.Fatal(err)
	}
	got, _, err := c.m.Connect(ctx, sb.ID, time.Minute, false)
	if err != nil || got.Node != other(from) {
		t.Fatalf("connect with its node draining: %v", err)
	}
	dst := c.nodes[got.Node]
	req := dst.req(sb.ID)
	if req.RestoreSnapshot != pp.SnapshotID || req.CurrentToken != sb.EnvdToken {
		t.Fatalf("restore on %s: snapshot %q token %q", got.Node, req.RestoreSnapshot, req.CurrentToken)
	}
	if b, err := os.ReadFile(filepath.Join(dst.snapDir, pp.SnapshotID, "checkpoint", "pages")); err != nil || string(b) != "memory of "+pp.SnapshotID {
		t.Fatalf("checkpoint on %s: %q %v", got.Node, b, err)
	}
	if c.nodes[from].has(sb.ID) {
		t.Fatalf("the draining node kept its copy")
	}
	if evs := c.events(t, sb.ID); !eventWith(evs, "moved: resumed on node "+got.Node+", moved from node "+from+" (node "+from+" is draining): its memory restored") {
		t.Fatalf("events: %q", evs)
	}
}

// A resume that fails on the sandbox's node as unavailable moves it.
func TestResumeFailureMovesPaused(t *testing.T) {
	ctx := context.Background()
	c, _ := newSnapCluster(t, true)
	sb, _ := c.paused(t, CreateOptions{}, false)
	c.nodes[sb.Node].down.Store(true) // silent, not yet judged lost
	got, _, err := c.m.Connect(ctx, sb.ID, time.Minute, false)
	if err != nil || got.Node != other(sb.Node) {
		t.Fatalf("connect while its node is unreachable: %v", err)
	}
	if evs := c.events(t, sb.ID); !eventWith(evs, "moved: resumed on node "+got.Node+", moved from node "+sb.Node+" (its resume there failed") {
		t.Fatalf("events: %q", evs)
	}
}

// withSharedVolume gives the cluster's nodes a volume driver every node
// reaches ("shared") and returns a volume of it.
func (c *cluster) withSharedVolume(t *testing.T) *store.Volume {
	t.Helper()
	ctx := context.Background()
	for id, n := range c.nodes {
		n.volDrivers = []string{"shared"}
		if err := c.st.RegisterNode(ctx, &store.Node{ID: id, Address: id + ":7443", Runtime: "fake", VolumeDrivers: []string{"shared"},
			Capacity: store.Capacity{MilliCPU: 4000, MemoryMiB: 1 << 20}}); err != nil {
			t.Fatal(err)
		}
	}
	v := &store.Volume{ID: "vol1", TeamID: store.DefaultTeamID, Name: "data", Driver: "shared", State: store.VolumeReady}
	if err := c.st.CreateVolume(ctx, v); err != nil {
		t.Fatal(err)
	}
	return v
}

// A paused sandbox of a cordoned node that no other node can take (its
// volume's driver is on no other node) resumes where it is, and says why.
func TestCordonedPausedWithoutRoomElsewhereResumesInPlace(t *testing.T) {
	ctx := context.Background()
	c, _ := newSnapCluster(t, true)
	c.withSharedVolume(t)
	sb, err := c.m.Create(ctx, CreateOptions{TemplateID: "tpl", TeamID: store.DefaultTeamID, Timeout: time.Minute,
		VolumeMounts: []VolumeMount{{Name: "data", Path: "/data"}}})
	if err != nil {
		t.Fatal(err)
	}
	to := other(sb.Node)
	c.nodes[to].volDrivers = nil
	if err := c.st.RegisterNode(ctx, &store.Node{ID: to, Address: to + ":7443", Runtime: "fake",
		Capacity: store.Capacity{MilliCPU: 4000, MemoryMiB: 1 << 20}}); err != nil {
		t.Fatal(err)
	}
	if err := c.m.Pause(ctx, sb.ID, false); err != nil {
		t.Fatal(err)
	}
	if _, err := c.st.SetNodeFlags(ctx, sb.Node, true, false); err != nil {
		t.Fatal(err)
	}
	got, _, err := c.m.Connect(ctx, sb.ID, time.Minute, false)
	if err != nil || got.Node != sb.Node || got.State != store.StateRunning {
		t.Fatalf("connect: %v (%+v)", err, got)
	}
	if c.nodes[to].has(sb.ID) {
		t.Fatalf("the node without the volume driver got the sandbox")
	}
	if evs := c.events(t, sb.ID); !eventWith(evs, "move-failed: node "+sb.Node+" is cordoned, but the sandbox could not move") ||
		!strings.Contains(strings.Join(evs, "\n"), `volume driver "shared"`) {
		t.Fatalf("events: %q", evs)
	}
}

// Volumes move with a paused sandbox only when its old node confirms it
// let go (the seed): from a cordoned node the sandbox moves, the new node
// attaches them through its plugin, the old one deletes its copy, and the
// attachment rows name the new node; from a lost node the move is 409
// and the rows stay with the lost node.
func TestPausedSandboxMovesWithVolumes(t *testing.T) {
	ctx := context.Background()
	for _, lost := range []bool{false, true} {
		name := "cordoned"
		if lost {
			name = "lost"
		}
		t.Run(name, func(t *testing.T) {
			c, _ := newSnapCluster(t, true)
			v := c.withSharedVolume(t)
			sb, row := c.paused(t, CreateOptions{TeamID: store.DefaultTeamID, VolumeMounts: []VolumeMount{{Name: "data", Path: "/data"}}}, false)
			from, to := sb.Node, other(sb.Node)
			if row.PausePackage == nil {
				t.Fatalf("a sandbox with a shared volume was not packaged")
			}
			if lost {
				c.loseNode(t, from)
			} else if _, err := c.st.SetNodeFlags(ctx, from, true, false); err != nil {
				t.Fatal(err)
			}
			got, _, err := c.m.Connect(ctx, sb.ID, time.Minute, false)
			atts, _ := c.st.ListVolumeAttachments(ctx, v.ID, "")
			if lost {
				if !errors.Is(err, ErrConflict) || !strings.Contains(err.Error(), "holds until it confirms") {
					t.Fatalf("move from a lost node with volumes: %v, want ErrConflict", err)
				}
				if len(atts) != 1 || atts[0].Node != from {
					t.Fatalf("attachments after a refused move: %+v", atts)
				}
				return
			}
			if err != nil || got.Node != to {
				t.Fatalf("move from a cordoned node with volumes: %v", err)
			}
			if req := c.nodes[to].req(sb.ID); len(req.Volumes) != 1 || req.Volumes[0].VolumeID != v.ID || req.Volumes[0].Path != "/data" {
				t.Fatalf("volumes attached on %s: %+v", to, req.Volumes)
			}
			if c.nodes[from].has(sb.ID) {
				t.Fatalf("the old node kept its copy (and the volume)")
			}
			if len(atts) != 1 || atts[0].Node != to || atts[0].SandboxID != sb.ID {
				t.Fatalf("attachments after the move: %+v", atts)
			}
		})
	}
}

// A lost paused sandbox whose node returns with it running (resumed
// behind the control plane's back) runs again: its pause's package is
// stale and goes from the row.
func TestReturnedRunningClearsPausePackage(t *testing.T) {
	ctx := context.Background()
	c, _ := newSnapCluster(t, true)
	sb, _ := c.paused(t, CreateOptions{}, false)
	c.loseNode(t, sb.Node)
	c.nodes[sb.Node].down.Store(false) // the fake node reports its sandboxes running
	beatAt(t, c.st, sb.Node, time.Now())
	if err := c.m.detectNodeLoss(ctx); err != nil {
		t.Fatal(err)
	}
	row, _ := c.st.GetSandbox(ctx, sb.ID)
	if row.State != store.StateRunning || row.PausePackage != nil {
		t.Fatalf("after its node returned with it running: %s, package %+v", row.State, row.PausePackage)
	}
}

// A pause package taken on a node that was lost and then forgotten
// (`cubicle node forget`, after the sandbox moved away) is still deleted
// once its sandbox ends: the forgotten node's files went with it, so the
// snapshot pass deletes the package and purges the row instead of
// retrying a node that will never answer, every pass, forever.
func TestPausePackageOfForgottenNodeIsPurged(t *testing.T) {
	ctx := context.Background()
	c, gw := newSnapCluster(t, true)
	sb, row := c.paused(t, CreateOptions{}, false)
	from := sb.Node
	if row.PausePackage == nil {
		t.Fatal("no pause package")
	}
	pp := row.PausePackage
	c.loseNode(t, from)
	if _, _, err := c.m.Connect(ctx, sb.ID, time.Minute, false); err != nil {
		t.Fatal(err)
	}
	if err := c.st.ForgetNode(ctx, from); err != nil {
		t.Fatalf("forget the lost node the sandbox left: %v", err)
	}
	// The forgotten node's package goes all the same.
	c.killPurges(t, gw, sb.ID, pp.SnapshotID)
	if _, err := c.st.GetSnapshot(ctx, pp.SnapshotID); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("pause package row after the pass: %v", err)
	}
}

// Past the node-loss grace, a lost sandbox is killed, except a paused one
// with a package: the package makes it resumable on another node, so the
// grace does not destroy a pause the user can still connect to (e2b
// keeps paused sandboxes). A running one of the same node is killed.
func TestLostPausedWithPackageSurvivesTheGrace(t *testing.T) {
	ctx := context.Background()
	c, _ := newSnapCluster(t, true)
	paused, row := c.paused(t, CreateOptions{}, false)
	from := paused.Node
	if row.PausePackage == nil {
		t.Fatal("no pause package")
	}
	c.loseNode(t, from)
	if evs := c.events(t, paused.ID); !slices.ContainsFunc(evs, func(e string) bool {
		return strings.HasPrefix(e, "lost: node "+from+" lost") && strings.Contains(e, "resume on another node") && !strings.Contains(e, "is killed after")
	}) {
		t.Fatalf("lost event of a movable pause: %q", evs)
	}
	beatAt(t, c.st, from, time.Now().Add(-DefaultNodeLostAfter-DefaultNodeLostGrace-time.Minute))
	if err := c.m.detectNodeLoss(ctx); err != nil {
		t.Fatal(err)
	}
	row, _ = c.st.GetSandbox(ctx, paused.ID)
	if row.State != store.StateLost || row.PausePackage == nil {
		t.Fatalf("a lost pause with a package past the grace: %s (package %+v)", row.State, row.PausePackage)
	}
	// It does not hold its dead node: the operator forgets that, and it
	// still moves at its next connect.
	if err := c.st.ForgetNode(ctx, from); err != nil {
		t.Fatalf("forget the lost node of a movable pause: %v", err)
	}
	got, resumed, err := c.m.Connect(ctx, paused.ID, time.Minute, false)
	if err != nil || !resumed || got.Node == from {
		t.Fatalf("connect past the grace: %v (resumed %v, node %v)", err, resumed, got)
	}
}

// One with volumes cannot leave a lost node (the node holds them until it
// confirms, or is forgotten, which a live sandbox refuses): the grace
// kills it as before, so a forget is not refused forever.
func TestLostPausedWithVolumesKilledAfterTheGrace(t *testing.T) {
	ctx := context.Background()
	c, _ := newSnapCluster(t, true)
	c.withSharedVolume(t)
	sb, row := c.paused(t, CreateOptions{TeamID: store.DefaultTeamID, VolumeMounts: []VolumeMount{{Name: "data", Path: "/data"}}}, false)
	if row.PausePackage == nil {
		t.Fatal("no pause package")
	}
	c.loseNode(t, sb.Node)
	if evs := c.events(t, sb.ID); !slices.ContainsFunc(evs, func(e string) bool { return strings.Contains(e, "is killed after") }) {
		t.Fatalf("lost event of a pause that cannot move: %q", evs)
	}
	beatAt(t, c.st, sb.Node, time.Now().Add(-DefaultNodeLostAfter-DefaultNodeLostGrace-time.Minute))
	if err := c.m.detectNodeLoss(ctx); err != nil {
		t.Fatal(err)
	}
	if row, _ := c.st.GetSandbox(ctx, sb.ID); row.State != store.StateKilled {
		t.Fatalf("a lost pause with volumes past the grace: %s", row.State)
	}
	if err := c.st.ForgetNode(ctx, sb.Node); err != nil {
		t.Fatalf("forget the lost node: %v", err)
	}
}

// The pause package's snapshot row is written (born deleted: internal)
// before the sandbox's row names it, and the snapshot pass may run on
// another replica in between: it keeps the internal snapshots of a
// paused sandbox whose row names no package yet, so it never deletes the
// package the pause is about to record.
func TestPausePackageKeptBeforeItsRowNamesIt(t *testing.T) {
	ctx := context.Background()
	c, gw := newSnapCluster(t, true)
	sb, row := c.paused(t, CreateOptions{}, false)
	// The window of packagePause: the snapshot is taken and pushed, the
	// row does not name it yet.
	row.PausePackage = nil
	if err := c.st.UpdateSandbox(ctx, row); err != nil {
		t.Fatal(err)
	}
	info, err := c.m.takeSnapshot(ctx, row, "", true, true)
	if err != nil || len(info.Package) == 0 {
		t.Fatalf("package snapshot: %v", err)
	}
	if err := c.m.reconcileSnapshots(ctx); err != nil {
		t.Fatal(err)
	}
	if keys := gw.Keys(t, info.ID+"/"); len(keys) == 0 {
		t.Fatal("the snapshot pass deleted a pause package before the row could name it")
	}
	if _, err := c.st.GetSnapshot(ctx, info.ID); err != nil {
		t.Fatalf("its row: %v", err)
	}
	// Once the sandbox is killed, it goes.
	c.killPurges(t, gw, sb.ID, info.ID)
}

// A lost node that returns without a paused sandbox (its data dir was
// wiped) leaves it paused, not killed, when its pause has a package: its
// next connect finds it missing there and resumes it on another node.
func TestReturnedWithoutPausedSandboxMovesAtConnect(t *testing.T) {
	ctx := context.Background()
	c, _ := newSnapCluster(t, true)
	sb, _ := c.paused(t, CreateOptions{}, false)
	from, to := sb.Node, other(sb.Node)
	c.loseNode(t, from)
	// It comes back without the sandbox.
	if err := c.nodes[from].fakeNode.Delete(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	c.nodes[from].down.Store(false)
	beatAt(t, c.st, from, time.Now())
	if err := c.m.detectNodeLoss(ctx); err != nil {
		t.Fatal(err)
	}
	row, err := c.st.GetSandbox(ctx, sb.ID)
	if err != nil || row.State != store.StatePaused || row.PausePackage == nil {
		t.Fatalf("after its node returned without it: %+v %v", row, err)
	}
	if evs := c.events(t, sb.ID); !eventWith(evs, "recovered: node "+from+" returned without the sandbox; it stays paused") {
		t.Fatalf("events: %q", evs)
	}
	got, resumed, err := c.m.Connect(ctx, sb.ID, time.Minute, false)
	if err != nil || !resumed || got.Node != to || got.State != store.StateRunning {
		t.Fatalf("connect: %+v resumed %v: %v", got, resumed, err)
	}
	if !c.nodes[to].has(sb.ID) {
		t.Fatalf("node %s does not run the moved sandbox", to)
	}
}
