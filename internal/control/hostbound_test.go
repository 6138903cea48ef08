package control

import (
	"context"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/node"
	"github.com/cubicle-dev/cubicle/internal/nodeset"
	"github.com/cubicle-dev/cubicle/internal/store"
	"github.com/cubicle-dev/cubicle/internal/volume"
	volumeregistry "github.com/cubicle-dev/cubicle/internal/volume/registry"
)

// localDriverNode is the in-process fake with the local volume driver.
type localDriverNode struct{ *fakeNode }

func (l localDriverNode) Info(ctx context.Context) (node.Info, error) {
	i, err := l.fakeNode.Info(ctx)
	i.VolumeDrivers = []string{"local"}
	i.Capacity = node.Capacity{CPUs: 8, MemoryBytes: 64 << 30} // room for the test's creates, less than node-a's
	return i, err
}

// hostBoundCluster is a control plane over a remote node with far more
// room than its in-process node (spread prefers the remote one), or over
// the remote node alone when embedded is false, with the built-in local
// volume driver configured on the control plane.
func hostBoundCluster(t *testing.T, embedded bool) (*Manager, store.Store) {
	t.Helper()
	ctx := context.Background()
	st := openSQLite(t)
	tpl := &store.Template{ID: "tpl", PrimaryName: "tpl", Names: []string{"tpl"}, ReadyBuildID: "b1", LatestBuildID: "b1", BuildStatus: store.BuildReady}
	if err := st.CreateTemplate(ctx, tpl, &store.TemplateBuild{ID: "b1", TemplateID: "tpl", Status: store.BuildReady, Rootfs: "/x"}); err != nil {
		t.Fatal(err)
	}
	if err := st.RegisterNode(ctx, &store.Node{ID: "node-a", Address: "node-a:7443", Runtime: "fake", VolumeDrivers: []string{"local"},
		Capacity: store.Capacity{MilliCPU: 64000, MemoryMiB: 1 << 20}}); err != nil {
		t.Fatal(err)
	}
	remote := volumeNode{newRemoteNode()}
	cfg := nodeset.Config{Registry: st, Dial: func(*store.Node) (node.Node, io.Closer, error) { return remote, io.NopCloser(nil), nil }}
	if embedded {
		cfg.LocalID, cfg.Local = "local", localDriverNode{newFakeNode()}
	}
	reg, err := volumeregistry.Open([]volume.PluginConfig{{Name: "local", Type: volume.TypeLocal, Root: t.TempDir()}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { reg.Close() })
	m := New(Config{Nodes: nodeset.New(cfg), Volumes: reg}, st, nil, storeResolver{st})
	if embedded {
		if err := m.RegisterNode(ctx); err != nil {
			t.Fatal(err)
		}
	}
	return m, st
}

// A local volume is files of the control plane's host: every sandbox that
// mounts one runs on the in-process node, even where the scheduler would
// have picked a roomier remote node (which would look for the volume in
// its own data dir and fail, or worse, make an empty one).
func TestHostBoundVolumesPinToTheInProcessNode(t *testing.T) {
	ctx := context.Background()
	m, _ := hostBoundCluster(t, true)
	if _, err := m.CreateVolume(ctx, store.DefaultTeamID, "shared", "local", 0); err != nil {
		t.Fatal(err)
	}
	plain, err := m.Create(ctx, CreateOptions{TemplateID: "tpl", TeamID: store.DefaultTeamID, Timeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if plain.Node != "node-a" {
		t.Fatalf("a sandbox without volumes went to %s; the test needs spread to prefer node-a", plain.Node)
	}
	for range 3 {
		sb, err := m.Create(ctx, CreateOptions{TemplateID: "tpl", TeamID: store.DefaultTeamID, Timeout: time.Minute,
			VolumeMounts: []VolumeMount{{Name: "shared", Path: "/data"}}})
		if err != nil {
			t.Fatal(err)
		}
		if sb.Node != "local" {
			t.Fatalf("a sandbox mounting a local volume went to %s, want the in-process node", sb.Node)
		}
	}
}

// A control plane without an in-process node has no host a sandbox could
// mount a local volume on: creating one is 400 naming the flag, and a
// sandbox naming an existing one (made while it had a node) is 400 before
// anything is placed.
func TestHostBoundVolumesWithoutInProcessNode(t *testing.T) {
	ctx := context.Background()
	m, st := hostBoundCluster(t, false)
	_, err := m.CreateVolume(ctx, store.DefaultTeamID, "shared", "local", 0)
	if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "--embedded-node=false") {
		t.Fatalf("create a local volume on a pure control plane: %v", err)
	}
	if vs, err := st.ListVolumes(ctx); err != nil || len(vs) != 0 {
		t.Fatalf("volumes left: %+v, %v", vs, err)
	}
	if err := st.CreateVolume(ctx, &store.Volume{ID: "old", TeamID: store.DefaultTeamID, Name: "old", Driver: "local", State: store.VolumeReady}); err != nil {
		t.Fatal(err)
	}
	_, err = m.Create(ctx, CreateOptions{TemplateID: "tpl", TeamID: store.DefaultTeamID, Timeout: time.Minute,
		VolumeMounts: []VolumeMount{{Name: "old", Path: "/data"}}})
	if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "--embedded-node=false") {
		t.Fatalf("mount an old local volume on a pure control plane: %v", err)
	}
	if sbs, err := st.ListSandboxes(ctx, store.SandboxFilter{}); err != nil || len(sbs) != 0 {
		t.Fatalf("sandboxes left: %d, %v", len(sbs), err)
	}
}
