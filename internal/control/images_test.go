package control

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/node"
	"github.com/cubicle-dev/cubicle/internal/nodeset"
	"github.com/cubicle-dev/cubicle/internal/store"
	"github.com/cubicle-dev/cubicle/internal/store/sqlite"
	"github.com/cubicle-dev/cubicle/internal/template"
)

// imageResolver gives every template layers on the control plane's host
// and, by name, the image they came from.
type imageResolver struct{}

func (imageResolver) Resolve(_ context.Context, ref string) (template.Template, error) {
	images := map[string]string{"builtin": "base", "built": "cubicle/built:b1", "none": "", "recorded": "cubicle/recorded:b2"}
	im, ok := images[ref]
	if !ok {
		return template.Template{}, fmt.Errorf("%w: %s", template.ErrNotFound, ref)
	}
	tpl := template.Template{ID: ref, Alias: ref, Layers: []string{"/cp/" + ref + "/rootfs"}, Image: im, CPUCount: 1, MemoryMB: 128}
	if ref == "recorded" {
		// Built through another replica: this one's index (ImageDigest)
		// does not have the tag; the build row's digest names the image.
		tpl.ImageDigest = recordedDigest
	}
	return tpl, nil
}

var recordedDigest = "sha256:" + strings.Repeat("cd", 32)

var builtDigest = "sha256:" + strings.Repeat("ab", 32)

func newImageManager(t *testing.T, pulls bool) (*Manager, *fakeNode) {
	t.Helper()
	st, err := sqlite.Open(filepath.Join(t.TempDir(), "c.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	n := newFakeNode()
	n.pulls = pulls
	m := New(Config{ImageDigest: func(ref string) (node.Image, error) {
		if ref != "cubicle/built:b1" {
			return node.Image{}, fmt.Errorf("no image %s", ref)
		}
		return node.Image{Name: "cubicle/built", Digest: builtDigest}, nil
	}}, st, n, imageResolver{})
	if err := m.RegisterNode(context.Background()); err != nil {
		t.Fatal(err)
	}
	return m, n
}

// A node that resolves images itself gets image references, never the
// control plane's paths: a built-in by name, a built template by digest.
// A template without an image is refused before any row or node call.
func TestCreateSendsImagesToPullingNode(t *testing.T) {
	ctx := context.Background()
	m, n := newImageManager(t, true)
	for tpl, want := range map[string]node.Image{
		"builtin":  {Name: "base"},
		"built":    {Name: "cubicle/built", Digest: builtDigest},
		"recorded": {Name: "cubicle/recorded", Digest: recordedDigest},
	} {
		sb, err := m.Create(ctx, CreateOptions{TemplateID: tpl, Timeout: time.Minute})
		if err != nil {
			t.Fatalf("%s: %v", tpl, err)
		}
		got := n.sbs[sb.ID]
		if got.Image != want || got.Layers != nil {
			t.Fatalf("%s: node got image %+v layers %v; want image %+v and no layers", tpl, got.Image, got.Layers, want)
		}
	}
	before := n.count()
	_, err := m.Create(ctx, CreateOptions{TemplateID: "none", Timeout: time.Minute})
	if !errors.Is(err, ErrConflict) || !strings.Contains(err.Error(), "no image a node can pull") {
		t.Fatalf("template without an image: %v, want ErrConflict", err)
	}
	if n.count() != before {
		t.Fatal("a refused create reached the node")
	}
	if l, _ := m.store.ListSandboxes(ctx, store.SandboxFilter{}); len(l) != before {
		t.Fatalf("a refused create left a row: %d rows", len(l))
	}
}

// The embedded node shares the control plane's files: it gets the layers,
// exactly as before image references existed.
func TestCreateSendsLayersToEmbeddedNode(t *testing.T) {
	m, n := newImageManager(t, false)
	sb, err := m.Create(context.Background(), CreateOptions{TemplateID: "built", Timeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	got := n.sbs[sb.ID]
	if !got.Image.IsZero() || len(got.Layers) != 1 || got.Layers[0] != "/cp/built/rootfs" {
		t.Fatalf("embedded node got image %+v layers %v", got.Image, got.Layers)
	}
	// A build row's digest changes nothing for the embedded node.
	sb, err = m.Create(context.Background(), CreateOptions{TemplateID: "recorded", Timeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if got := n.sbs[sb.ID]; !got.Image.IsZero() || len(got.Layers) != 1 || got.Layers[0] != "/cp/recorded/rootfs" {
		t.Fatalf("embedded node got image %+v layers %v", got.Image, got.Layers)
	}
}

// A warm pool on a node that pulls images has it fetch the template's
// image once before the first standby; the standbys boot by reference.
func TestPoolPrefetchesImage(t *testing.T) {
	ctx := context.Background()
	m, n, st := newPoolManager(t)
	n.pulls = true
	if err := m.RegisterNode(ctx); err != nil {
		t.Fatal(err)
	}
	setPool(t, st, 2, "b1")
	if err := m.reconcilePool(ctx); err != nil {
		t.Fatal(err)
	}
	ids := standbys(t, m, "b1")
	if len(n.pulled) != 1 || n.pulled[0] != (node.Image{Name: "mini"}) || len(ids) != 2 {
		t.Fatalf("pulled %v, %d standbys; want one pull of mini, then 2 standbys", n.pulled, len(ids))
	}
	for _, id := range ids {
		if req := n.sbs[id]; req.Image != (node.Image{Name: "mini"}) || req.Layers != nil {
			t.Fatalf("standby %s booted from %+v / %v", id, req.Image, req.Layers)
		}
	}
	// Full: nothing to fetch again.
	if err := m.reconcilePool(ctx); err != nil || len(n.pulled) != 1 {
		t.Fatalf("a full pool pulled again: %v %v", n.pulled, err)
	}
}

// The embedded node is never asked to pull.
func TestPoolEmbeddedNoPrefetch(t *testing.T) {
	ctx := context.Background()
	m, n, st := newPoolManager(t)
	if err := m.RegisterNode(ctx); err != nil {
		t.Fatal(err)
	}
	setPool(t, st, 1, "b1")
	if err := m.reconcilePool(ctx); err != nil {
		t.Fatal(err)
	}
	if len(n.pulled) != 0 || len(standbys(t, m, "b1")) != 1 {
		t.Fatalf("embedded: pulled %v", n.pulled)
	}
}

// A snapshot recorded only as host paths (its sandbox booted from
// layers) cannot be named to a node that pulls images: a rollback there is
// a clear 409, and the sandbox is left as it was.
func TestRollbackOfPathOnlySnapshotRefusedOnPullingNode(t *testing.T) {
	ctx := context.Background()
	m, _ := newImageManager(t, true)
	sb, err := m.Create(ctx, CreateOptions{TemplateID: "builtin", Timeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	sn := &store.Snapshot{ID: "snap_x", TeamID: sb.TeamID, SandboxID: sb.ID, SourceTemplateID: "builtin", Node: sb.Node,
		Kind: "filesystem", Runtime: "fake", Layers: []string{"/node/snap_x/rootfs", "/cp/builtin/rootfs"}}
	tpl := &store.Template{ID: "snap_x", TeamID: sb.TeamID, PrimaryName: "snap_x", Names: []string{"snap_x"},
		ReadyBuildID: "bld_x", LatestBuildID: "bld_x", BuildStatus: store.BuildReady, BuildCount: 1}
	b := &store.TemplateBuild{ID: "bld_x", TemplateID: "snap_x", Status: store.BuildReady, Rootfs: "/node/snap_x/rootfs:/cp/builtin/rootfs"}
	if err := m.store.CreateSnapshot(ctx, sn, tpl, b, 0); err != nil {
		t.Fatal(err)
	}
	err = m.Rollback(ctx, sb.ID, "snap_x")
	if !errors.Is(err, ErrConflict) || !strings.Contains(err.Error(), "only as host paths") {
		t.Fatalf("rollback on a pulling node: %v, want ErrConflict", err)
	}
	if got, err := m.store.GetSandbox(ctx, sb.ID); err != nil || got.State != store.StateRunning {
		t.Fatalf("after the refused rollback: %+v %v", got, err)
	}
}

// A create retried on another node is sent the root file system that node
// takes: a pulling remote node that failed, then the embedded node, which
// shares the control plane's files, gets the layers, not the image (and
// the other way round).
func TestCreateRetryResolvesBootImageForSecondNode(t *testing.T) {
	for _, firstPulls := range []bool{true, false} {
		t.Run(fmt.Sprintf("firstPulls=%v", firstPulls), func(t *testing.T) {
			ctx := context.Background()
			st, err := sqlite.Open(filepath.Join(t.TempDir(), "c.db"))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { st.Close() })
			local, remote := newRemoteNode(), newRemoteNode()
			remote.pulls = true
			first, second := remote, local
			if !firstPulls {
				first, second = local, remote
			}
			first.down.Store(true)
			// Spread tries the remote node first when it is the emptier
			// after the create, else the in-process node (1 CPU, 1 GiB).
			capacity := store.Capacity{MilliCPU: 8000, MemoryMiB: 1 << 20}
			if !firstPulls {
				capacity = store.Capacity{MilliCPU: 1000, MemoryMiB: 129}
			}
			if err := st.RegisterNode(ctx, &store.Node{ID: "node-a", Address: "node-a:7443", Runtime: "fake", Capacity: capacity}); err != nil {
				t.Fatal(err)
			}
			set := nodeset.New(nodeset.Config{LocalID: "local", Local: local, Registry: st,
				Dial: func(row *store.Node) (node.Node, io.Closer, error) { return remote, io.NopCloser(nil), nil }})
			m := New(Config{Nodes: set, ImageDigest: func(ref string) (node.Image, error) {
				return node.Image{Name: "cubicle/built", Digest: builtDigest}, nil
			}}, st, nil, imageResolver{})
			if err := m.RegisterNode(ctx); err != nil {
				t.Fatal(err)
			}
			sb, err := m.Create(ctx, CreateOptions{TemplateID: "built", Timeout: time.Minute})
			if err != nil {
				t.Fatal(err)
			}
			if first.creates.Load() != 1 || second.creates.Load() != 1 {
				t.Fatalf("creates: first %d, second %d; want one each (a retry)", first.creates.Load(), second.creates.Load())
			}
			got := second.sbs[sb.ID]
			if firstPulls && (!got.Image.IsZero() || len(got.Layers) != 1) {
				t.Fatalf("embedded node after the retry got image %+v layers %v; want the layers", got.Image, got.Layers)
			}
			if !firstPulls && (got.Image.Digest != builtDigest || got.Layers != nil) {
				t.Fatalf("pulling node after the retry got image %+v layers %v; want the image by digest", got.Image, got.Layers)
			}
		})
	}
}

// A built-in this control plane has published (serve --publish-builtins)
// goes to a pulling node by repository and digest, and the sandbox row
// records that reference; before it is published, by name as before. The
// embedded node still gets layers.
func TestCreateSendsPublishedBuiltin(t *testing.T) {
	ctx := context.Background()
	published := false
	pub := node.Image{Name: "builtin/base", Digest: "sha256:" + strings.Repeat("ef", 32)}
	lookup := func(name string) (node.Image, bool) {
		if name != "base" || !published {
			return node.Image{}, false
		}
		return pub, true
	}
	for _, pulls := range []bool{true, false} {
		published = false
		m, n := newImageManager(t, pulls)
		m.cfg.BuiltinImage = lookup
		create := func() (node.Image, []string, string) {
			t.Helper()
			sb, err := m.Create(ctx, CreateOptions{TemplateID: "builtin", Timeout: time.Minute})
			if err != nil {
				t.Fatal(err)
			}
			row, err := m.store.GetSandbox(ctx, sb.ID)
			if err != nil {
				t.Fatal(err)
			}
			return n.sbs[sb.ID].Image, n.sbs[sb.ID].Layers, row.Image
		}
		im, layers, rowImage := create()
		if pulls && (im != node.Image{Name: "base"} || layers != nil || rowImage != "base") {
			t.Fatalf("not yet published: node got %+v %v, row %q; want the built-in by name", im, layers, rowImage)
		}
		published = true
		im, layers, rowImage = create()
		switch {
		case pulls && (im != pub || layers != nil || rowImage != pub.String()):
			t.Fatalf("published: node got %+v %v, row %q; want %v", im, layers, rowImage, pub)
		case !pulls && (im != node.Image{} || len(layers) != 1):
			t.Fatalf("embedded node: got image %+v layers %v; want the layers", im, layers)
		}
	}
}
