package catalog_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/cubicle-dev/cubicle/internal/store"
	"github.com/cubicle-dev/cubicle/internal/template/catalog"
)

var cubeIDRE = regexp.MustCompile(`^tpl-[0-9a-f]{24}$`)

func (e *env) ready(t *testing.T, job *catalog.ImageBuild) {
	t.Helper()
	if st := e.wait(t, job.TemplateID, job.BuildID); st.Status != store.BuildReady {
		t.Fatalf("build %s: %+v", job.BuildID, st)
	}
}

func (e *env) names(t *testing.T, id string) []string {
	t.Helper()
	tpl, err := e.st.GetTemplate(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	return tpl.Names
}

// CubeAPI's templates: each create is a new unnamed template with a tpl-
// ID; the alias moves to the newest ready one; PUT alias sets, steals and
// clears; rebuild repeats the stored request.
func TestCubeAPIImageTemplates(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	src := filepath.Join(e.dir, "src")
	os.MkdirAll(filepath.Join(src, "bin"), 0o755)
	if err := e.images.ImportRootfs("tools/img:1", src); err != nil {
		t.Fatal(err)
	}
	cpu, mem := 1500, 256
	a, err := e.cat.CreateFromImage(ctx, dev, catalog.ImageRequest{Image: "tools/img:1", Name: "web", CPU: &cpu, Memory: &mem, WritableLayerSize: "1G",
		Env: []string{"A=1", "B=x=y"}})
	if err != nil {
		t.Fatal(err)
	}
	if !cubeIDRE.MatchString(a.TemplateID) || a.JobID != a.BuildID || a.Status != "WAITING" {
		t.Fatalf("create answered %+v", a)
	}
	if n := e.names(t, a.TemplateID); len(n) != 0 {
		t.Fatalf("the alias moved before the build was ready: %q", n)
	}
	e.ready(t, a)
	got, err := e.cat.Get(ctx, dev, "web")
	if err != nil || got.ID != a.TemplateID || got.CPUCount != 2 || got.MemoryMB != 256 || got.DiskSizeMB != 1024 {
		t.Fatalf("web after the first build: %+v %v (want 1500m rounded up to 2 CPUs, 256 MiB, 1G = 1024 MiB)", got, err)
	}
	// env is the runtime env of every sandbox of the template.
	if tpl, err := e.cat.Resolve(ctx, "web"); err != nil || len(tpl.Env) != 2 || tpl.Env["A"] != "1" || tpl.Env["B"] != "x=y" {
		t.Fatalf("resolved env: %+v %v", tpl.Env, err)
	}
	if tpl, _ := e.cat.Resolve(ctx, "base"); tpl.Env != nil {
		t.Fatalf("an e2b template resolved with env %v", tpl.Env)
	}

	// The same alias again: a second template, which takes it once ready.
	b, err := e.cat.CreateFromImage(ctx, dev, catalog.ImageRequest{Image: "tools/img:1", Name: "web"})
	if err != nil || b.TemplateID == a.TemplateID {
		t.Fatalf("second create: %+v %v", b, err)
	}
	e.ready(t, b)
	if got, _ := e.cat.Get(ctx, dev, "web"); got == nil || got.ID != b.TemplateID {
		t.Fatalf("web did not move to the newer ready template: %+v", got)
	}
	if n := e.names(t, a.TemplateID); len(n) != 0 {
		t.Fatalf("the older template kept %q", n)
	}

	// PUT alias: CubeAPI's rule, then set, steal and clear.
	for _, bad := range []string{"My-Alias", "tpl-hijack", "snap-x", strings.Repeat("a", 65), "a_b", "a.b"} {
		if _, err := e.cat.SetAlias(ctx, dev, a.TemplateID, bad); !errors.Is(err, catalog.ErrInvalid) {
			t.Errorf("alias %q: %v, want ErrInvalid", bad, err)
		}
	}
	if _, err := e.cat.SetAlias(ctx, dev, a.TemplateID, "base"); !errors.Is(err, catalog.ErrConflict) {
		t.Fatalf("the built-in's name: %v", err)
	}
	if _, err := e.cat.SetAlias(ctx, dev, catalog.BaseID, "mine"); !errors.Is(err, catalog.ErrConflict) {
		t.Fatalf("renaming a built-in: %v", err)
	}
	if tpl, err := e.cat.SetAlias(ctx, dev, a.TemplateID, "web"); err != nil || tpl.ID != a.TemplateID || len(tpl.Names) != 1 || tpl.Names[0] != "web" {
		t.Fatalf("steal web back: %+v %v", tpl, err)
	}
	if n := e.names(t, b.TemplateID); len(n) != 0 {
		t.Fatalf("the robbed template kept %q", n)
	}
	other := catalog.Caller{TeamID: "t_other"}
	if _, err := e.cat.SetAlias(ctx, other, a.TemplateID, "x"); !errors.Is(err, catalog.ErrNotFound) {
		t.Fatalf("another team set an alias on this team's template: %v", err)
	}
	if tpl, err := e.cat.SetAlias(ctx, dev, "web", ""); err != nil || len(tpl.Names) != 0 {
		t.Fatalf("clear by alias: %+v %v", tpl, err)
	}
	if _, err := e.cat.Get(ctx, dev, "web"); !errors.Is(err, catalog.ErrNotFound) {
		t.Fatalf("a cleared alias resolves: %v", err)
	}
	// An unnamed template has nothing to tag.
	if _, err := e.cat.AssignTags(ctx, dev, a.TemplateID, []string{"v1"}); !errors.Is(err, catalog.ErrInvalid) {
		t.Fatalf("tag an unnamed template: %v", err)
	}

	// Rebuild: a new build of the same template from the stored request.
	r, err := e.cat.RebuildFromImage(ctx, dev, a.TemplateID)
	if err != nil || r.TemplateID != a.TemplateID || r.BuildID == a.BuildID {
		t.Fatalf("rebuild: %+v %v", r, err)
	}
	e.ready(t, r)
	if got, _ := e.st.GetTemplate(ctx, a.TemplateID); got.ReadyBuildID != r.BuildID || got.DiskSizeMB != 1024 || len(got.Names) != 0 {
		t.Fatalf("after the rebuild: %+v (the cleared alias must stay cleared)", got)
	}
	req, err := e.cat.ImageRequestOf(ctx, got)
	if err != nil || req == nil || req.Image != "tools/img:1" || req.WritableLayerSize != "1G" {
		t.Fatalf("stored request: %+v %v", req, err)
	}
	// An e2b-made template is rebuilt through e2b's API.
	e2b, err := e.cat.Create(ctx, dev, catalog.CreateRequest{Name: "e2b-made"}, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.cat.RebuildFromImage(ctx, dev, e2b.TemplateID); !errors.Is(err, catalog.ErrInvalid) {
		t.Fatalf("rebuild of an e2b template: %v", err)
	}
}

// Every field is honoured or refused: none is dropped.
func TestCubeAPIImageRequestRefusals(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	no, port, bad := false, 8080, 70000
	zero := 0
	for want, req := range map[string]catalog.ImageRequest{
		"image is required":      {},
		"instanceType":           {Image: "x", InstanceType: "cubebox"},
		"networkType":            {Image: "x", NetworkType: "tap"},
		"nodes":                  {Image: "x", Nodes: []string{"n1"}},
		"dns":                    {Image: "x", DNS: []string{"1.1.1.1"}},
		"allowOut/denyOut":       {Image: "x", AllowOut: []string{"10.0.0.0/8"}},
		"allowInternetAccess":    {Image: "x", AllowInternetAccess: &no},
		"qos":                    {Image: "x", QoS: []byte(`{"network":{}}`)},
		"args need a command":    {Image: "x", Args: []string{"-v"}},
		"probePath needs":        {Image: "x", ProbePath: "/health"},
		"probePort 70000":        {Image: "x", ProbePort: &bad},
		"exposedPorts: 0":        {Image: "x", ExposedPorts: []int{0}},
		"not KEY=VALUE":          {Image: "x", Env: []string{"NOVALUE"}},
		"writableLayerSize":      {Image: "x", WritableLayerSize: "lots"},
		"cpu is in millicores":   {Image: "x", CPU: &zero},
		"must match":             {Image: "x", Name: "Web"},
		"must be an absolute":    {Image: "x", ProbePort: &port, ProbePath: "health"},
		"not start with tpl-":    {Image: "x", Name: "tpl-abc"},
		"memoryMB must be at le": {Image: "x", Memory: &zero},
	} {
		if _, err := e.cat.CreateFromImage(ctx, dev, req); !errors.Is(err, catalog.ErrInvalid) || !strings.Contains(err.Error(), want) {
			t.Errorf("%+v: %v, want ErrInvalid naming %q", req, err, want)
		}
	}
	if _, err := e.cat.CreateFromImage(ctx, dev, catalog.ImageRequest{Image: "x", Name: "code-interpreter"}); !errors.Is(err, catalog.ErrConflict) {
		t.Fatalf("a built-in's name: %v", err)
	}
	// e2b's names are at most 64 characters too, so every name resolves
	// through both APIs; CubeAPI's ID prefixes stay e2b's to use.
	for _, name := range []string{strings.Repeat("n", 65), "Upper"} {
		if _, err := e.cat.Create(ctx, dev, catalog.CreateRequest{Name: name}, "", nil); !errors.Is(err, catalog.ErrInvalid) {
			t.Errorf("e2b name %q: %v", name, err)
		}
	}
	if ts, _ := e.cat.List(ctx, dev, "", 100); len(ts) != 2 {
		t.Fatalf("refused creates left templates: %d listed", len(ts))
	}
}
