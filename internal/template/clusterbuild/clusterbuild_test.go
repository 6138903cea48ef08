package clusterbuild

import (
	"context"
	"errors"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/image"
	"github.com/cubicle-dev/cubicle/internal/store"
	"github.com/cubicle-dev/cubicle/internal/store/sqlite"
	"github.com/cubicle-dev/cubicle/internal/template/builder"
	"github.com/cubicle-dev/cubicle/internal/template/buildkit"
	"github.com/cubicle-dev/cubicle/internal/template/catalog"
)

// A build goes only to a node labelled builder=true that is ready (a
// fresh heartbeat, a data address) and not cordoned; none such is
// ErrNoBuilder, whose message names the label. Among several, the one
// with the fewest builds in flight is picked.
func TestPickBuilder(t *testing.T) {
	ctx := context.Background()
	st, err := sqlite.Open(filepath.Join(t.TempDir(), "c.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	now := time.Now()
	reg := func(id string, labels map[string]string, data string, beat time.Time) {
		t.Helper()
		if err := st.RegisterNode(ctx, &store.Node{ID: id, Address: "10.0.0.1:7443", DataAddress: data, Labels: labels, Runtime: "runc",
			Capacity: store.Capacity{MilliCPU: 1000, MemoryMiB: 1024}, HeartbeatAt: beat}); err != nil {
			t.Fatal(err)
		}
	}
	s := &Solver{Nodes: st.ListNodes, TTL: 15 * time.Second, Now: func() time.Time { return now }, Dial: refuseDial, Grant: noGrant}
	noBuilder := func(why string) {
		t.Helper()
		err := s.Available(ctx)
		if !errors.Is(err, ErrNoBuilder) || !errors.Is(err, errdefs.ErrFailedPrecondition) {
			t.Fatalf("%s: %v, want ErrNoBuilder", why, err)
		}
	}
	noBuilder("no nodes")
	reg("plain", map[string]string{"zone": "a"}, "10.0.0.1:7444", now)
	reg("false", map[string]string{Label: "false"}, "10.0.0.2:7444", now)
	noBuilder("no node labelled")
	reg("stale", map[string]string{Label: "true"}, "10.0.0.3:7444", now.Add(-time.Minute))
	noBuilder("a builder whose heartbeat is older than the TTL")
	reg("noaddr", map[string]string{Label: "true"}, "", now)
	noBuilder("a builder without a data address")
	reg("b1", map[string]string{Label: "true"}, "10.0.0.4:7444", now)
	if _, err := st.SetNodeFlags(ctx, "b1", true, false); err != nil {
		t.Fatal(err)
	}
	noBuilder("a cordoned builder")
	if _, err := st.SetNodeFlags(ctx, "b1", false, false); err != nil {
		t.Fatal(err)
	}
	if err := s.Available(ctx); err != nil {
		t.Fatalf("a ready builder: %v", err)
	}
	reg("b2", map[string]string{Label: "true"}, "10.0.0.5:7444", now)
	n1, rel1, err := s.pick(ctx)
	if err != nil {
		t.Fatal(err)
	}
	n2, rel2, err := s.pick(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if n1.ID == n2.ID {
		t.Fatalf("two builds in flight went to the same builder %s while another was idle", n1.ID)
	}
	rel1()
	n3, rel3, err := s.pick(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if n3.ID != n1.ID {
		t.Fatalf("after %s's build ended the next went to %s", n1.ID, n3.ID)
	}
	rel2()
	rel3()
	if len(s.busy) != 0 {
		t.Fatalf("builds still counted after release: %v", s.busy)
	}
}

// The builder refuses up front what no builder node can run now: a build
// with steps is ErrNotImplemented (501) naming the label, a build from an
// image the control plane does not hold is ErrInvalid (400) saying why;
// once a builder is ready both pass.
func TestValidateWithoutBuilder(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	st, err := sqlite.Open(filepath.Join(dir, "c.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	imgs, err := image.Open(filepath.Join(dir, "oci"))
	if err != nil {
		t.Fatal(err)
	}
	s := &Solver{Nodes: st.ListNodes, TTL: 15 * time.Second, Dial: refuseDial, Grant: noGrant}
	b, err := builder.New(builder.Config{Images: imgs, Registry: RegistryHost, Solver: s, RootfsDir: filepath.Join(dir, "builds"), WorkDir: filepath.Join(dir, "work")})
	if err != nil {
		t.Fatal(err)
	}
	withSteps := catalog.Job{TemplateID: "tpl_a", BuildID: "bld_a", FromImage: "base", Start: catalog.StartRequest{FromTemplate: "base",
		Steps: []catalog.Step{{Type: "RUN", Args: []string{"true"}}}}}
	fromImage := catalog.Job{TemplateID: "tpl_b", BuildID: "bld_b", FromImage: "docker.io/library/alpine:3", Start: catalog.StartRequest{FromImage: "docker.io/library/alpine:3"}}
	if err := b.Validate(ctx, withSteps); !errors.Is(err, catalog.ErrNotImplemented) || !strings.Contains(err.Error(), "builder=true") {
		t.Fatalf("steps with no builder: %v", err)
	}
	if err := b.Validate(ctx, fromImage); !errors.Is(err, catalog.ErrInvalid) || !strings.Contains(err.Error(), "builder=true") {
		t.Fatalf("a remote image with no builder: %v", err)
	}
	if err := st.RegisterNode(ctx, &store.Node{ID: "b1", Address: "10.0.0.1:7443", DataAddress: "10.0.0.1:7444", Labels: map[string]string{Label: "true"},
		Runtime: "runc", Capacity: store.Capacity{MilliCPU: 1000, MemoryMiB: 1024}}); err != nil {
		t.Fatal(err)
	}
	if err := b.Validate(ctx, withSteps); err != nil {
		t.Fatalf("steps with a builder ready: %v", err)
	}
	if err := b.Validate(ctx, fromImage); err != nil {
		t.Fatalf("a remote image with a builder ready: %v", err)
	}
}

// The choice and the validation never dial or grant; these are there
// because a Solver without them has no builder at all.
func refuseDial(context.Context, string, string) (net.Conn, error) {
	return nil, errors.New("not dialled in this test")
}

func noGrant(string, string, []string) (buildkit.Credentials, func(), error) {
	return buildkit.Credentials{}, func() {}, nil
}
