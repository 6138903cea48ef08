package catalog_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/accel"

	"github.com/cubicle-dev/cubicle/internal/image"
	"github.com/cubicle-dev/cubicle/internal/store"
	"github.com/cubicle-dev/cubicle/internal/store/sqlite"
	"github.com/cubicle-dev/cubicle/internal/template"
	"github.com/cubicle-dev/cubicle/internal/template/builder"
	"github.com/cubicle-dev/cubicle/internal/template/catalog"
	"github.com/google/uuid"
)

// dev is the key `cubicle apikey create` makes: the default team's admin.
var dev = catalog.Caller{TeamID: store.DefaultTeamID, Admin: true}

type env struct {
	cat    *catalog.Catalog
	st     *sqlite.Store
	images *image.Store
	base   string
	ci     string // the code interpreter's layer
	dir    string
}

// deps makes what a catalog needs under dir: a SQLite store, a base
// rootfs, an image store and a builder.
func deps(t *testing.T, dir string) (*sqlite.Store, string, *image.Store, *builder.Builder) {
	t.Helper()
	st, err := sqlite.Open(filepath.Join(dir, "db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	base := filepath.Join(dir, "images", "base", "rootfs")
	os.MkdirAll(filepath.Join(base, "etc"), 0o755)
	os.WriteFile(filepath.Join(base, "etc", "os-release"), []byte("ID=test\n"), 0o644)
	imgs, err := image.Open(filepath.Join(dir, "oci"))
	if err != nil {
		t.Fatal(err)
	}
	b, err := builder.New(builder.Config{Images: imgs, RootfsDir: filepath.Join(dir, "images", "builds"), WorkDir: filepath.Join(dir, "work")})
	if err != nil {
		t.Fatal(err)
	}
	return st, base, imgs, b
}

func newEnv(t *testing.T) *env {
	t.Helper()
	dir := t.TempDir()
	st, base, imgs, b := deps(t, dir)
	ci := filepath.Join(dir, "images", "code-interpreter-v1", "rootfs")
	os.MkdirAll(filepath.Join(ci, "usr", "local"), 0o755)
	cat := catalog.New(catalog.Config{Store: st, Builder: b, BaseRootfs: base, CodeInterpreterRootfs: template.JoinLayers(ci, base),
		CPUCount: 2, MemoryMB: 512, DiskSizeMB: 1024})
	cat.SetFallback(&template.Images{Dir: filepath.Join(dir, "images"), CPUCount: 2, MemoryMB: 512, DiskSizeMB: 1024})
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	if err := cat.Start(ctx); err != nil {
		t.Fatal(err)
	}
	return &env{cat: cat, st: st, images: imgs, base: base, ci: ci, dir: dir}
}

func (e *env) wait(t *testing.T, tplID, buildID string) *catalog.Status {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		st, err := e.cat.BuildStatus(context.Background(), dev, tplID, buildID, 0, 100, "")
		if err != nil {
			t.Fatal(err)
		}
		if st.Status == store.BuildReady || st.Status == store.BuildError {
			return st
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatal("build did not finish")
	return nil
}

var (
	tplRE = regexp.MustCompile(`^tpl_[0-9a-f]{8}$`)
	bldRE = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`) // UUIDv4, as e2b's SDKs parse it
)

func TestIDsNamesAndIdempotency(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	for i := 0; i < 20; i++ {
		if id := catalog.NewTemplateID(); !tplRE.MatchString(id) {
			t.Fatalf("template id %q", id)
		}
		if id := template.NewBuildID(); !bldRE.MatchString(id) {
			t.Fatalf("build id %q", id)
		}
	}
	// A built-in's seeded build has a UUID derived from its ID: another
	// replica, or the next start, seeds the same one.
	if tt, err := e.st.GetTemplate(ctx, catalog.BaseID); err != nil || tt.ReadyBuildID != template.DerivedBuildID("builtin", catalog.BaseID) {
		t.Fatalf("base's seeded build: %+v %v", tt, err)
	} else if u, err := uuid.Parse(tt.ReadyBuildID); err != nil || u.Version() != 5 || template.DerivedBuildID("snapshot", catalog.BaseID) == tt.ReadyBuildID {
		t.Fatalf("seeded build ID %q: %v", tt.ReadyBuildID, err)
	}
	r, err := e.cat.Create(ctx, dev, catalog.CreateRequest{Name: "app:v1", Tags: []string{"v1", "prod"}}, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	if !tplRE.MatchString(r.TemplateID) || !bldRE.MatchString(r.BuildID) || len(r.Tags) != 2 || r.Tags[0] != "v1" || r.Tags[1] != "prod" {
		t.Fatalf("create: %+v", r)
	}
	if r2, _ := e.cat.Create(ctx, dev, catalog.CreateRequest{Alias: "legacy"}, "", nil); r2 == nil || r2.Tags[0] != "default" || r2.Names[0] != "legacy" {
		t.Fatalf("alias-only create (deprecated field) with the default tag: %+v", r2)
	}
	for _, bad := range []catalog.CreateRequest{{}, {Name: "Upper"}, {Name: "a:b:c"}, {Name: "x", Tags: []string{"bad tag"}}, {Name: "base"}} {
		if _, err := e.cat.Create(ctx, dev, bad, "", nil); !errors.Is(err, catalog.ErrInvalid) && !errors.Is(err, catalog.ErrConflict) {
			t.Fatalf("create %+v: %v", bad, err)
		}
	}
	body := []byte(`{"name":"idem"}`)
	a, err := e.cat.Create(ctx, dev, catalog.CreateRequest{Name: "idem"}, "key-1", body)
	if err != nil {
		t.Fatal(err)
	}
	b, err := e.cat.Create(ctx, dev, catalog.CreateRequest{Name: "idem"}, "key-1", body)
	if err != nil || b.TemplateID != a.TemplateID || b.BuildID != a.BuildID {
		t.Fatalf("replay: %+v %v (first %+v)", b, err, a)
	}
	if _, err := e.cat.Create(ctx, dev, catalog.CreateRequest{Name: "other"}, "key-1", []byte(`{"name":"other"}`)); !errors.Is(err, catalog.ErrConflict) {
		t.Fatalf("same key, different body: %v", err)
	}
	// Same name without a key is a rebuild: same template, new build.
	c, err := e.cat.Create(ctx, dev, catalog.CreateRequest{Name: "idem"}, "", nil)
	if err != nil || c.TemplateID != a.TemplateID || c.BuildID == a.BuildID {
		t.Fatalf("rebuild: %+v %v", c, err)
	}
	// The superseded waiting build is closed, not left dangling.
	if old, _ := e.st.GetTemplateBuild(ctx, a.BuildID); old.Status != store.BuildError {
		t.Fatalf("superseded build: %+v", old)
	}
}

func TestBuildsResolutionAndGuards(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	// Resolution of the seeded base and its built-in aliases.
	for _, ref := range []string{"", "base", "python", "base:default"} {
		tpl, err := e.cat.Resolve(ctx, ref)
		if err != nil || tpl.ID != catalog.BaseID || !slices.Equal(tpl.Layers, []string{e.base}) || tpl.CPUCount != 2 {
			t.Fatalf("resolve %q: %+v %v", ref, tpl, err)
		}
	}
	// The code interpreter is its own template: its layer above base.
	for _, ref := range []string{"code-interpreter", "code-interpreter-v1", "code-interpreter-v1:default"} {
		tpl, err := e.cat.Resolve(ctx, ref)
		if err != nil || tpl.ID != catalog.CodeInterpreterID || !slices.Equal(tpl.Layers, []string{e.ci, e.base}) {
			t.Fatalf("resolve %q: %+v %v", ref, tpl, err)
		}
	}
	if err := e.cat.Delete(ctx, dev, catalog.CodeInterpreterID, false, nil); !errors.Is(err, catalog.ErrConflict) {
		t.Fatalf("delete the built-in code interpreter: %v", err)
	}
	if _, err := e.cat.Resolve(ctx, "nope"); !errors.Is(err, template.ErrNotFound) {
		t.Fatalf("unknown: %v", err)
	}
	// A template that has not built yet: not ready (409 at the API).
	cpu, mem := 1, 256
	r, _ := e.cat.Create(ctx, dev, catalog.CreateRequest{Name: "img", CPUCount: &cpu, MemoryMB: &mem}, "", nil)
	if _, err := e.cat.Resolve(ctx, "img"); !errors.Is(err, template.ErrNotReady) {
		t.Fatalf("not built: %v", err)
	}
	// fromImage of an imported image: ready without BuildKit.
	src := filepath.Join(e.dir, "src")
	os.MkdirAll(filepath.Join(src, "bin"), 0o755)
	os.WriteFile(filepath.Join(src, "bin", "tool"), []byte("#!/bin/sh\n"), 0o755)
	if err := e.images.ImportRootfs("tools/img:1", src); err != nil {
		t.Fatal(err)
	}
	if err := e.cat.StartBuild(ctx, dev, r.TemplateID, r.BuildID, catalog.StartRequest{FromImage: "tools/img:1"}); err != nil {
		t.Fatal(err)
	}
	if st := e.wait(t, r.TemplateID, r.BuildID); st.Status != store.BuildReady {
		t.Fatalf("build: %+v", st)
	}
	tpl, err := e.cat.Resolve(ctx, "img")
	if err != nil || tpl.CPUCount != 1 || tpl.MemoryMB != 256 || tpl.BuildID != r.BuildID {
		t.Fatalf("resolve built: %+v %v", tpl, err)
	}
	if _, err := os.Stat(filepath.Join(tpl.Layers[0], "bin", "tool")); err != nil {
		t.Fatalf("unpacked rootfs: %v", err)
	}
	// The row names the image by digest, and Resolve carries it: any
	// replica names the image to a node without its own index.
	d, err := e.images.Resolve("tools/img:1")
	if err != nil {
		t.Fatal(err)
	}
	if row, _ := e.st.GetTemplateBuild(ctx, r.BuildID); row.Image != "tools/img:1" || row.ImageDigest != d.Digest.String() {
		t.Fatalf("build row image %q digest %q, want tools/img:1 %s", row.Image, row.ImageDigest, d.Digest)
	}
	if tpl.Image != "tools/img:1" || tpl.ImageDigest != d.Digest.String() {
		t.Fatalf("resolved image %q digest %q, want %s", tpl.Image, tpl.ImageDigest, d.Digest)
	}
	// fromTemplate without steps shares the source's image and digest.
	r3, _ := e.cat.Create(ctx, dev, catalog.CreateRequest{Name: "img-copy"}, "", nil)
	if err := e.cat.StartBuild(ctx, dev, r3.TemplateID, r3.BuildID, catalog.StartRequest{FromTemplate: "img"}); err != nil {
		t.Fatal(err)
	}
	if st := e.wait(t, r3.TemplateID, r3.BuildID); st.Status != store.BuildReady {
		t.Fatalf("build: %+v", st)
	}
	if cp, err := e.cat.Resolve(ctx, "img-copy"); err != nil || cp.ImageDigest != d.Digest.String() {
		t.Fatalf("fromTemplate copy: %+v %v", cp, err)
	}
	// Validation is synchronous.
	r2, _ := e.cat.Create(ctx, dev, catalog.CreateRequest{Name: "img"}, "", nil)
	for _, bad := range []catalog.StartRequest{{}, {FromImage: "a", FromTemplate: "b"}, {FromImage: "not/imported:1"},
		{FromTemplate: "base", Steps: []catalog.Step{{Type: "RUN", Args: []string{"true"}}}}} {
		if err := e.cat.StartBuild(ctx, dev, r2.TemplateID, r2.BuildID, bad); err == nil {
			t.Fatalf("start %+v accepted", bad)
		}
	}
	if err := e.cat.StartBuild(ctx, dev, r2.TemplateID, "bld_00000000", catalog.StartRequest{FromTemplate: "base"}); !errors.Is(err, catalog.ErrBuildNotFound) {
		t.Fatalf("unknown build: %v", err)
	}
	// A failing rebuild (base image vanished) keeps the ready build.
	if err := e.images.Delete("tools/img:1"); err != nil {
		t.Fatal(err)
	}
	if err := e.cat.StartBuild(ctx, dev, r2.TemplateID, r2.BuildID, catalog.StartRequest{FromTemplate: "missing"}); !errors.Is(err, catalog.ErrInvalid) {
		t.Fatalf("fromTemplate of a missing template: %v", err)
	}
	// Logs: offset and level filter.
	st, _ := e.cat.BuildStatus(ctx, dev, r.TemplateID, r.BuildID, 0, 100, "")
	if len(st.LogEntries) < 2 {
		t.Fatalf("logs: %+v", st.LogEntries)
	}
	tail, _ := e.cat.BuildStatus(ctx, dev, r.TemplateID, r.BuildID, len(st.LogEntries), 100, "")
	if len(tail.LogEntries) != 0 {
		t.Fatalf("logs past the offset: %+v", tail.LogEntries)
	}
	errOnly, _ := e.cat.BuildStatus(ctx, dev, r.TemplateID, r.BuildID, 0, 100, "error")
	if len(errOnly.LogEntries) != 0 {
		t.Fatalf("level filter: %+v", errOnly.LogEntries)
	}
	if _, err := e.cat.BuildStatus(ctx, dev, r.TemplateID, r.BuildID, 0, 100, "loud"); !errors.Is(err, catalog.ErrInvalid) {
		t.Fatalf("bad level: %v", err)
	}
	if catalog.APIStatus(store.BuildUploaded) != store.BuildBuilding {
		t.Fatal("uploaded must be reported as building")
	}
	// Delete guards.
	inUse := func(context.Context, string) (string, error) { return "sandbox x uses it", nil }
	if err := e.cat.Delete(ctx, dev, "img", false, inUse); !errors.Is(err, catalog.ErrConflict) {
		t.Fatalf("delete in use: %v", err)
	}
	if err := e.cat.Delete(ctx, dev, "base", false, nil); !errors.Is(err, catalog.ErrConflict) {
		t.Fatalf("delete base: %v", err)
	}
	if err := e.cat.Delete(ctx, dev, "img", true, inUse); err != nil {
		t.Fatalf("force delete: %v", err)
	}
	if _, err := e.cat.Get(ctx, dev, "img"); !errors.Is(err, catalog.ErrNotFound) {
		t.Fatalf("after delete: %v", err)
	}
}

// A build a previous process left running fails with "builder disappeared".
func TestRecoverFailsRunningBuilds(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	r, _ := e.cat.Create(ctx, dev, catalog.CreateRequest{Name: "crashy"}, "", nil)
	b, _ := e.st.GetTemplateBuild(ctx, r.BuildID)
	b.Status, b.Spec = store.BuildBuilding, `{"fromTemplate":"base"}`
	e.st.UpdateTemplateBuild(ctx, b)
	cat2 := catalog.New(catalog.Config{Store: e.st, BaseRootfs: e.base})
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if err := cat2.Start(cctx); err != nil {
		t.Fatal(err)
	}
	st, err := cat2.BuildStatus(ctx, dev, r.TemplateID, r.BuildID, 0, 100, "")
	if err != nil || st.Status != store.BuildError || st.Reason == nil || st.Reason.Message != "builder disappeared" {
		t.Fatalf("after restart: %+v %v", st, err)
	}
}

func TestAcceleratorContract(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	// Registration stage: VM-only fields on a passthrough contract, bad version ranges.
	for _, bad := range []accel.Contract{
		{Class: "gpu", Backend: accel.BackendPassthrough, GuestKernel: "6.1"},
		{Class: "gpu", DriverVersion: ">=abc"},
		{Class: "fpga"},
		{Class: "gpu", Count: 99},
	} {
		bad := bad
		_, err := e.cat.Create(ctx, dev, catalog.CreateRequest{Name: "gpu-bad", Accelerators: &bad}, "", nil)
		var ce *accel.CompatError
		if !errors.Is(err, catalog.ErrInvalid) || !errors.As(err, &ce) || ce.Stage != accel.StageRegistration {
			t.Fatalf("contract %+v: %v", bad, err)
		}
	}
	r, err := e.cat.Create(ctx, dev, catalog.CreateRequest{Name: "gpu-app", Accelerators: &accel.Contract{Count: 1, DriverVersion: ">=535", CUDAVersion: ">=12.0"}}, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	tpl, err := e.st.GetTemplate(ctx, r.TemplateID)
	if err != nil {
		t.Fatal(err)
	}
	c, err := catalog.Contract(tpl)
	if err != nil || c == nil || c.Class != accel.ClassGPU || c.DriverVersion != ">=535" {
		t.Fatalf("stored contract %+v %v", c, err)
	}
	// A rebuild naming no contract keeps it; GPU templates have no warm pool.
	if _, err := e.cat.Create(ctx, dev, catalog.CreateRequest{Name: "gpu-app"}, "", nil); err != nil {
		t.Fatal(err)
	}
	if tpl, _ = e.st.GetTemplate(ctx, r.TemplateID); tpl.Accelerators == "" {
		t.Fatal("rebuild dropped the contract")
	}
	if _, err := e.cat.SetPoolSize(ctx, dev, r.TemplateID, 2); !errors.Is(err, catalog.ErrConflict) {
		t.Fatalf("pool on a GPU template: %v", err)
	}
	if _, err := e.cat.SetAccelerators(ctx, dev, r.TemplateID, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := e.cat.SetPoolSize(ctx, dev, r.TemplateID, 1); err != nil {
		t.Fatalf("pool after clearing the contract: %v", err)
	}
	if _, err := e.cat.SetAccelerators(ctx, dev, r.TemplateID, &accel.Contract{Class: "gpu"}); !errors.Is(err, catalog.ErrConflict) {
		t.Fatalf("contract on a pooled template: %v", err)
	}
}

// A store seeded before the code interpreter had its own template held every
// built-in name on base; the next start moves them.
func TestSeedMovesCodeInterpreterNamesOffBase(t *testing.T) {
	dir := t.TempDir()
	st, base, _, b := deps(t, dir)
	ctx := context.Background()
	old := &store.Template{ID: catalog.BaseID, TeamID: store.DefaultTeamID, PrimaryName: "base",
		Names: []string{"base", "code-interpreter", "code-interpreter-v1", "python"}, ReadyBuildID: "bld_base", LatestBuildID: "bld_base",
		BuildStatus: store.BuildReady, BuildCount: 1, Public: true, CPUCount: 2, MemoryMB: 512, DiskSizeMB: 1024}
	if err := st.CreateTemplate(ctx, old, &store.TemplateBuild{ID: "bld_base", TemplateID: catalog.BaseID, Status: store.BuildReady, Rootfs: base}); err != nil {
		t.Fatal(err)
	}
	ci := filepath.Join(dir, "ci")
	os.MkdirAll(ci, 0o755)
	cat := catalog.New(catalog.Config{Store: st, Builder: b, BaseRootfs: base, CodeInterpreterRootfs: template.JoinLayers(ci, base)})
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if err := cat.Start(cctx); err != nil {
		t.Fatal(err)
	}
	if tpl, err := cat.Resolve(ctx, "code-interpreter"); err != nil || tpl.ID != catalog.CodeInterpreterID || tpl.Layers[0] != ci {
		t.Fatalf("code-interpreter after the upgrade: %+v %v", tpl, err)
	}
	if tpl, err := cat.Resolve(ctx, "python"); err != nil || tpl.ID != catalog.BaseID {
		t.Fatalf("python after the upgrade: %+v %v", tpl, err)
	}
	// The seeded build keeps the ID it had before build IDs were UUIDs; the
	// code interpreter, seeded now, gets the derived UUID.
	if tt, err := st.GetTemplate(ctx, catalog.BaseID); err != nil || tt.ReadyBuildID != "bld_base" {
		t.Fatalf("base's seeded build after the upgrade: %+v %v", tt, err)
	}
	if tt, err := st.GetTemplate(ctx, catalog.CodeInterpreterID); err != nil || tt.ReadyBuildID != template.DerivedBuildID("builtin", catalog.CodeInterpreterID) {
		t.Fatalf("code interpreter's seeded build: %+v %v", tt, err)
	}
	// Seeded now, the code interpreter has e2b's size for it (its kernels
	// for python, JavaScript, R and Java); base keeps its row.
	if tt, _ := st.GetTemplate(ctx, catalog.CodeInterpreterID); tt.MemoryMB != 2048 {
		t.Fatalf("code interpreter seeded with %d MiB, want 2048", tt.MemoryMB)
	}
	if tt, _ := st.GetTemplate(ctx, catalog.BaseID); tt.MemoryMB != 512 {
		t.Fatalf("base's row changed to %d MiB", tt.MemoryMB)
	}
}

// A code interpreter seeded by an earlier version (the server's default
// memory, its seeded build) gets its own size at the next start; one whose
// size differs from that default is the operator's and stays.
func TestSeedResizesTheEarlierCodeInterpreter(t *testing.T) {
	for _, tc := range []struct{ had, want int }{{512, 2048}, {1024, 1024}} {
		dir := t.TempDir()
		st, base, _, b := deps(t, dir)
		ctx := context.Background()
		ci := filepath.Join(dir, "ci")
		os.MkdirAll(ci, 0o755)
		rootfs := template.JoinLayers(ci, base)
		bid := template.DerivedBuildID("builtin", catalog.CodeInterpreterID)
		old := &store.Template{ID: catalog.CodeInterpreterID, TeamID: store.DefaultTeamID, PrimaryName: "code-interpreter-v1",
			Names: []string{"code-interpreter-v1", "code-interpreter"}, ReadyBuildID: bid, LatestBuildID: bid,
			BuildStatus: store.BuildReady, BuildCount: 1, Public: true, CPUCount: 2, MemoryMB: tc.had, DiskSizeMB: 1024}
		if err := st.CreateTemplate(ctx, old, &store.TemplateBuild{ID: bid, TemplateID: catalog.CodeInterpreterID, Status: store.BuildReady,
			Rootfs: rootfs, MemoryMB: tc.had}); err != nil {
			t.Fatal(err)
		}
		cat := catalog.New(catalog.Config{Store: st, Builder: b, BaseRootfs: base, CodeInterpreterRootfs: rootfs, MemoryMB: 512})
		cctx, cancel := context.WithCancel(ctx)
		if err := cat.Start(cctx); err != nil {
			t.Fatal(err)
		}
		cancel()
		tt, err := st.GetTemplate(ctx, catalog.CodeInterpreterID)
		if err != nil || tt.MemoryMB != tc.want {
			t.Fatalf("had %d: row %+v %v, want %d MiB", tc.had, tt, err, tc.want)
		}
		if bb, err := st.GetTemplateBuild(ctx, bid); err != nil || bb.MemoryMB != tc.want {
			t.Fatalf("had %d: build %+v %v, want %d MiB", tc.had, bb, err, tc.want)
		}
	}
}

// A server whose sandboxes may not have 2048 MiB seeds the code
// interpreter at its maximum.
func TestSeedCodeInterpreterWithinTheMaximum(t *testing.T) {
	dir := t.TempDir()
	st, base, _, b := deps(t, dir)
	ci := filepath.Join(dir, "ci")
	os.MkdirAll(ci, 0o755)
	cat := catalog.New(catalog.Config{Store: st, Builder: b, BaseRootfs: base, CodeInterpreterRootfs: template.JoinLayers(ci, base), MaxMemoryMB: 1024})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := cat.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if tt, err := st.GetTemplate(ctx, catalog.CodeInterpreterID); err != nil || tt.MemoryMB != 1024 {
		t.Fatalf("code interpreter under a 1024 MiB maximum: %+v %v", tt, err)
	}
}

// With a store shared by replicas, another replica's build in progress is
// left alone while its heartbeat is recent, at start and at each sweep,
// and failed as an orphan once the heartbeat is older than OrphanAfter.
func TestSharedStoreLeavesOtherReplicasBuilds(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	r, _ := e.cat.Create(ctx, dev, catalog.CreateRequest{Name: "elsewhere"}, "", nil)
	b, _ := e.st.GetTemplateBuild(ctx, r.BuildID)
	b.Status, b.Spec = store.BuildBuilding, `{"fromTemplate":"base"}`
	if err := e.st.UpdateTemplateBuild(ctx, b); err != nil {
		t.Fatal(err)
	}
	// A long OrphanAfter: the build was touched just now.
	other := catalog.New(catalog.Config{Store: e.st, BaseRootfs: e.base, SharedStore: true, OrphanAfter: time.Hour})
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if err := other.Start(cctx); err != nil {
		t.Fatal(err)
	}
	other.Sweep(ctx)
	if st, err := other.BuildStatus(ctx, dev, r.TemplateID, r.BuildID, 0, 100, ""); err != nil || st.Status != store.BuildBuilding {
		t.Fatalf("another replica's running build after start and a sweep: %+v %v", st, err)
	}
	// Its heartbeat stops: older than OrphanAfter, the build is failed.
	stale := catalog.New(catalog.Config{Store: e.st, BaseRootfs: e.base, SharedStore: true, OrphanAfter: time.Millisecond})
	time.Sleep(5 * time.Millisecond)
	stale.Sweep(ctx)
	st, err := stale.BuildStatus(ctx, dev, r.TemplateID, r.BuildID, 0, 100, "")
	if err != nil || st.Status != store.BuildError || st.Reason == nil || st.Reason.Message != "builder disappeared" {
		t.Fatalf("a build without heartbeat: %+v %v", st, err)
	}
}
