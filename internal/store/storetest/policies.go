package storetest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/cubicle-dev/cubicle/internal/store"
)

func runPolicies(t *testing.T, open func(t *testing.T) store.Store) {
	t.Run("PlacementPolicies", func(t *testing.T) { testPolicies(t, open(t)) })
	t.Run("PlacementPolicyPutRace", func(t *testing.T) { testPolicyRace(t, open(t)) })
	t.Run("PlacementPolicyGoesWithTeam", func(t *testing.T) { testPolicyTeamDelete(t, open(t)) })
}

// testPolicies: put, get, replace keeps CreatedAt, list order, the
// per-create read (team first, then template, only the two that apply),
// delete, and ErrNotFound for a missing one.
func testPolicies(t *testing.T, s store.Store) {
	ctx := context.Background()
	if _, err := s.GetPlacementPolicy(ctx, store.PolicyTeam, "t1"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("missing policy: want ErrNotFound, got %v", err)
	}
	if ps, err := s.PlacementPoliciesFor(ctx, "t1", "base"); err != nil || len(ps) != 0 {
		t.Fatalf("no policies yet: %v, %v", ps, err)
	}
	put := func(scope store.PolicyScope, target, filter, score string) *store.PlacementPolicy {
		t.Helper()
		p := &store.PlacementPolicy{Scope: scope, Target: target, Filter: filter, Score: score}
		if err := s.PutPlacementPolicy(ctx, p); err != nil {
			t.Fatalf("put %s %s: %v", scope, target, err)
		}
		if p.CreatedAt.IsZero() || p.UpdatedAt.IsZero() {
			t.Fatalf("put did not set the times: %+v", p)
		}
		return p
	}
	tmpl := put(store.PolicyTemplate, "base", `node.labels["zone"] == "a"`, "")
	put(store.PolicyTemplate, "other", "", "1")
	team := put(store.PolicyTeam, "t1", "", `node.free_cpu`)
	put(store.PolicyTeam, "t2", "true", "")

	got, err := s.GetPlacementPolicy(ctx, store.PolicyTemplate, "base")
	if err != nil || got.Filter != tmpl.Filter || got.Score != "" || !got.CreatedAt.Equal(tmpl.CreatedAt) {
		t.Fatalf("get = %+v, %v; want %+v", got, err, tmpl)
	}
	// Replacing keeps the row's creation time and changes the text.
	again := put(store.PolicyTemplate, "base", "", "node.warm")
	if !again.CreatedAt.Equal(tmpl.CreatedAt) || again.UpdatedAt.Before(tmpl.UpdatedAt) {
		t.Fatalf("replace: created %v (was %v), updated %v", again.CreatedAt, tmpl.CreatedAt, again.UpdatedAt)
	}
	if got, _ := s.GetPlacementPolicy(ctx, store.PolicyTemplate, "base"); got.Filter != "" || got.Score != "node.warm" {
		t.Fatalf("after replace: %+v", got)
	}

	all, err := s.ListPlacementPolicies(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if want := "team/t1 team/t2 template/base template/other"; keys(all) != want {
		t.Fatalf("list = %s, want %s", keys(all), want)
	}
	ps, err := s.PlacementPoliciesFor(ctx, "t1", "base")
	if err != nil {
		t.Fatal(err)
	}
	if want := "team/t1 template/base"; keys(ps) != want {
		t.Fatalf("for t1/base = %s, want %s", keys(ps), want)
	}
	if ps[0].Score != team.Score {
		t.Fatalf("team policy read back as %+v", ps[0])
	}
	// A team ID equal to a template ID does not pick up the template's.
	if ps, _ := s.PlacementPoliciesFor(ctx, "base", "none"); len(ps) != 0 {
		t.Fatalf("scopes mixed up: %s", keys(ps))
	}

	if err := s.DeletePlacementPolicy(ctx, store.PolicyTeam, "t1"); err != nil {
		t.Fatal(err)
	}
	if err := s.DeletePlacementPolicy(ctx, store.PolicyTeam, "t1"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("second delete: want ErrNotFound, got %v", err)
	}
	if ps, _ := s.PlacementPoliciesFor(ctx, "t1", "base"); keys(ps) != "template/base" {
		t.Fatalf("after delete: %s", keys(ps))
	}
	if err := s.PutPlacementPolicy(ctx, &store.PlacementPolicy{Scope: "cluster", Target: "x", Filter: "true"}); err == nil {
		t.Fatal("an unknown scope was stored")
	}
}

// testPolicyRace: concurrent writers of one policy leave exactly one row,
// holding one writer's whole text (never a mix).
func testPolicyRace(t *testing.T, s store.Store) {
	ctx := context.Background()
	const n = 16
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = s.PutPlacementPolicy(ctx, &store.PlacementPolicy{Scope: store.PolicyTeam, Target: "t1",
				Filter: fmt.Sprintf("node.id == 'n%d'", i), Score: fmt.Sprintf("%d", i)})
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("writer %d: %v", i, err)
		}
	}
	all, err := s.ListPlacementPolicies(ctx)
	if err != nil || len(all) != 1 {
		t.Fatalf("want one row, got %s, %v", keys(all), err)
	}
	var i int
	if _, err := fmt.Sscanf(all[0].Score, "%d", &i); err != nil || all[0].Filter != fmt.Sprintf("node.id == 'n%d'", i) {
		t.Fatalf("mixed row: %+v", all[0])
	}
}

// testPolicyTeamDelete: deleting a team deletes its policy, so a team
// made later under the same ID starts without one.
func testPolicyTeamDelete(t *testing.T, s store.Store) {
	ctx := context.Background()
	if err := s.CreateTeam(ctx, &store.Team{ID: "t_pol", Name: "pol"}); err != nil {
		t.Fatal(err)
	}
	for _, p := range []*store.PlacementPolicy{
		{Scope: store.PolicyTeam, Target: "t_pol", Filter: "true"},
		{Scope: store.PolicyTemplate, Target: "t_pol", Filter: "true"},
	} {
		if err := s.PutPlacementPolicy(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.DeleteTeam(ctx, "t_pol"); err != nil {
		t.Fatal(err)
	}
	all, err := s.ListPlacementPolicies(ctx)
	if err != nil || keys(all) != "template/t_pol" {
		t.Fatalf("after DeleteTeam: %s, %v (want only the template's)", keys(all), err)
	}
}

func keys(ps []*store.PlacementPolicy) string {
	s := ""
	for i, p := range ps {
		if i > 0 {
			s += " "
		}
		s += string(p.Scope) + "/" + p.Target
	}
	return s
}
