package control

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/store"
)

// Under WithTeam another team's sandbox is not found by any operation, and
// nothing happens to it.
func TestWithTeamHidesOtherTeamsSandboxes(t *testing.T) {
	m, n, st := newPoolManager(t)
	ctx := context.Background()
	if err := st.CreateTeam(ctx, &store.Team{ID: "t_b", Name: "b"}); err != nil {
		t.Fatal(err)
	}
	own := WithTeam(ctx, store.DefaultTeamID)
	sb, err := m.Create(own, CreateOptions{TemplateID: "tpl", TeamID: store.DefaultTeamID, Timeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	other := WithTeam(ctx, "t_b")
	for name, op := range map[string]func() error{
		"get":      func() error { _, err := m.Get(other, sb.ID); return err },
		"kill":     func() error { return m.Kill(other, sb.ID, "by b") },
		"timeout":  func() error { return m.SetTimeout(other, sb.ID, time.Second) },
		"refresh":  func() error { return m.Refresh(other, sb.ID, time.Second) },
		"pause":    func() error { return m.Pause(other, sb.ID, true) },
		"connect":  func() error { _, _, err := m.Connect(other, sb.ID, time.Second, false); return err },
		"snapshot": func() error { _, err := m.Snapshot(other, sb.ID, ""); return err },
		"fork":     func() error { _, err := m.Fork(other, sb.ID, 1, time.Second, CreateOptions{}); return err },
		"rollback": func() error { return m.Rollback(other, sb.ID, "snap_0000000000000000") },
		"network":  func() error { return m.UpdateNetwork(other, sb.ID, store.Network{AllowInternet: false}) },
		"logs":     func() error { _, _, _, err := m.Logs(other, sb.ID, time.Time{}, 10); return err },
		"metrics":  func() error { _, err := m.MetricsHistory(other, sb.ID); return err },
	} {
		err := op()
		if !errors.Is(err, ErrNotFound) || err.Error() != "sandbox not found: sandbox '"+sb.ID+"' not found" {
			t.Errorf("%s as another team: want the missing-sandbox error, got %v", name, err)
		}
	}
	got, err := m.Get(own, sb.ID)
	if err != nil || got.State != store.StateRunning || got.EndAt.Before(time.Now().Add(30*time.Second)) || n.count() != 1 {
		t.Fatalf("the sandbox changed: %+v %v (node has %d)", got, err, n.count())
	}
	// The control plane's own context sees every team.
	if _, err := m.Get(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if rows, _ := m.List(ctx, store.SandboxFilter{TeamID: "t_b"}); len(rows) != 0 {
		t.Fatalf("team b lists %d sandboxes", len(rows))
	}
}

// A template bigger than the server maxima is refused at sandbox create,
// naming the field and the maximum.
func TestCreateRefusesTemplatesAboveTheMaxima(t *testing.T) {
	_, _, st := newPoolManager(t)
	for _, c := range []struct {
		cfg  Config
		want string
	}{
		{Config{MaxSandboxCPU: 1, MaxSandboxMemoryMB: 64}, "memoryMB 128, above the server maximum of 64"},
		{Config{MaxSandboxCPU: 1, MaxSandboxMemoryMB: 128}, ""},
	} {
		m := New(c.cfg, st, newFakeNode(), storeResolver{st})
		sb, err := m.Create(context.Background(), CreateOptions{TemplateID: "tpl", TeamID: store.DefaultTeamID, Timeout: time.Minute})
		switch {
		case c.want == "" && err != nil:
			t.Fatalf("%+v: %v", c.cfg, err)
		case c.want != "" && (!errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), c.want)):
			t.Fatalf("%+v: want ErrInvalid naming %q, got %v", c.cfg, c.want, err)
		case c.want != "" && sb != nil:
			t.Fatalf("a refused create returned a sandbox")
		}
	}
}

// A team at its quota gets the typed quota error from Create.
func TestCreateAtQuota(t *testing.T) {
	m, _, st := newPoolManager(t)
	ctx := context.Background()
	if err := st.CreateTeam(ctx, &store.Team{ID: "t_q", Name: "q", Quota: store.Quota{MaxSandboxes: 1}}); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Create(ctx, CreateOptions{TemplateID: "tpl", TeamID: "t_q", Timeout: time.Minute}); err != nil {
		t.Fatal(err)
	}
	_, err := m.Create(ctx, CreateOptions{TemplateID: "tpl", TeamID: "t_q", Timeout: time.Minute})
	var qe *store.QuotaError
	if !errors.As(err, &qe) || qe.Quota != "concurrent sandboxes" || qe.Limit != 1 {
		t.Fatalf("want the sandbox quota error, got %v", err)
	}
}
