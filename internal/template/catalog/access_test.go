package catalog_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/cubicle-dev/cubicle/internal/store"
	"github.com/cubicle-dev/cubicle/internal/template"
	"github.com/cubicle-dev/cubicle/internal/template/catalog"
)

// Names are per team, another team's private template does not exist for
// a caller, and public ones are read-only to non-admins.
func TestTeamsSeeOwnAndPublicTemplates(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	for _, id := range []string{"t_a", "t_b"} {
		if err := e.st.CreateTeam(ctx, &store.Team{ID: id, Name: id}); err != nil {
			t.Fatal(err)
		}
	}
	a, b := catalog.Caller{TeamID: "t_a"}, catalog.Caller{TeamID: "t_b"}
	ra, err := e.cat.Create(ctx, a, catalog.CreateRequest{Name: "app"}, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	rb, err := e.cat.Create(ctx, b, catalog.CreateRequest{Name: "app"}, "", nil)
	if err != nil || rb.TemplateID == ra.TemplateID {
		t.Fatalf("B's own app: %+v %v", rb, err)
	}
	if got, err := e.cat.Get(ctx, b, "app"); err != nil || got.ID != rb.TemplateID {
		t.Fatalf("B resolves app to %+v %v", got, err)
	}
	if _, err := e.cat.Get(ctx, b, ra.TemplateID); !errors.Is(err, catalog.ErrNotFound) {
		t.Fatalf("B gets A's template by ID: %v", err)
	}
	for name, op := range map[string]func() error{
		"status": func() error { _, err := e.cat.BuildStatus(ctx, b, ra.TemplateID, ra.BuildID, 0, 10, ""); return err },
		"start": func() error {
			return e.cat.StartBuild(ctx, b, ra.TemplateID, ra.BuildID, catalog.StartRequest{FromTemplate: "base"})
		},
		"delete": func() error { return e.cat.Delete(ctx, b, ra.TemplateID, true, nil) },
		"pool":   func() error { _, err := e.cat.SetPoolSize(ctx, b, ra.TemplateID, 1); return err },
		"tags":   func() error { _, err := e.cat.AssignTags(ctx, b, ra.TemplateID, []string{"x"}); return err },
	} {
		if err := op(); !errors.Is(err, catalog.ErrNotFound) {
			t.Errorf("%s of A's template as B: want ErrNotFound, got %v", name, err)
		}
	}
	// Resolution for sandbox create follows the same rule.
	if _, err := e.cat.ResolveTeam(ctx, "t_b", ra.TemplateID); !errors.Is(err, template.ErrNotFound) {
		t.Fatalf("B resolves A's template: %v", err)
	}
	if tpl, err := e.cat.ResolveTeam(ctx, "t_b", "code-interpreter"); err != nil || tpl.ID != catalog.CodeInterpreterID {
		t.Fatalf("B resolves a built-in name: %+v %v", tpl, err)
	}
	// base is visible and read-only to a non-admin; the built-in names are reserved.
	if _, err := e.cat.Get(ctx, b, "base"); err != nil {
		t.Fatal(err)
	}
	if err := e.cat.Delete(ctx, b, "base", true, nil); !errors.Is(err, catalog.ErrForbidden) {
		t.Fatalf("non-admin deletes base: %v", err)
	}
	if _, err := e.cat.Create(ctx, b, catalog.CreateRequest{Name: "python"}, "", nil); !errors.Is(err, catalog.ErrConflict) {
		t.Fatalf("a team takes a built-in name: %v", err)
	}
	// Only admins publish; a public template resolves for everyone, and
	// a team's own name still shadows it.
	if _, err := e.cat.SetPublic(ctx, a, ra.TemplateID, true); !errors.Is(err, catalog.ErrForbidden) {
		t.Fatalf("non-admin publishes: %v", err)
	}
	admin := catalog.Caller{TeamID: "t_a", Admin: true}
	if _, err := e.cat.SetPublic(ctx, admin, ra.TemplateID, true); err != nil {
		t.Fatal(err)
	}
	if got, _ := e.cat.Get(ctx, b, ra.TemplateID); got == nil || got.ID != ra.TemplateID {
		t.Fatal("B does not see A's public template by ID")
	}
	if got, _ := e.cat.Get(ctx, b, "app"); got == nil || got.ID != rb.TemplateID {
		t.Fatal("A's public app shadows B's own app for B")
	}
	if _, err := e.cat.SetPoolSize(ctx, a, ra.TemplateID, 1); !errors.Is(err, catalog.ErrForbidden) {
		t.Fatalf("non-admin sets the pool of a public template: %v", err)
	}
	// Lists: own plus public.
	ls, err := e.cat.List(ctx, b, "", 0)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, x := range ls {
		ids = append(ids, x.ID)
	}
	if got := strings.Join(ids, ","); got != strings.Join([]string{catalog.BaseID, catalog.CodeInterpreterID, ra.TemplateID, rb.TemplateID}, ",") {
		t.Fatalf("B lists %s", got)
	}
	// An Idempotency-Key is per team.
	x, err := e.cat.Create(ctx, a, catalog.CreateRequest{Name: "idem"}, "k", []byte(`{"name":"idem"}`))
	if err != nil {
		t.Fatal(err)
	}
	y, err := e.cat.Create(ctx, b, catalog.CreateRequest{Name: "idem"}, "k", []byte(`{"name":"idem"}`))
	if err != nil || y.TemplateID == x.TemplateID {
		t.Fatalf("B's replay of A's key: %+v %v", y, err)
	}
	// teamID in the body may only name the caller's team.
	if _, err := e.cat.Create(ctx, b, catalog.CreateRequest{Name: "z", TeamID: "t_a"}, "", nil); !errors.Is(err, catalog.ErrInvalid) {
		t.Fatalf("teamID of another team: %v", err)
	}
}

// Template sizes above the server maxima are refused, naming the field.
func TestTemplateSizesAboveMaxima(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	c := catalog.New(catalog.Config{Store: e.st, MaxCPUCount: 4, MaxMemoryMB: 2048, MaxDiskSizeMB: 4096})
	big, mem, disk := 64, 1<<20, 100000
	for _, r := range []struct {
		req  catalog.CreateRequest
		want string
	}{
		{catalog.CreateRequest{Name: "a", CPUCount: &big}, "cpuCount 64 exceeds the server maximum of 4"},
		{catalog.CreateRequest{Name: "a", MemoryMB: &mem}, "memoryMB 1048576 exceeds the server maximum of 2048"},
		{catalog.CreateRequest{Name: "a", MinFreeDiskMB: &disk}, "minFreeDiskMb 100000 exceeds the server maximum of 4096"},
	} {
		if _, err := c.Create(ctx, dev, r.req, "", nil); !errors.Is(err, catalog.ErrInvalid) || !strings.Contains(err.Error(), r.want) {
			t.Fatalf("%+v: want ErrInvalid naming %q, got %v", r.req, r.want, err)
		}
	}
}
