package storetest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/store"
)

// testSecrets: CRUD, per-team names, another team's row is ErrNotFound,
// the update compare-and-set, paging, and the team delete guard.
func testSecrets(t *testing.T, s store.Store) {
	ctx := context.Background()
	mustTeam(t, s, "t_a", store.Quota{})
	mustTeam(t, s, "t_b", store.Quota{})
	base := time.Now().UTC().Truncate(time.Microsecond)
	mk := func(id, team, name string, at time.Time) *store.Secret {
		return &store.Secret{ID: id, TeamID: team, Name: name, Version: 1, Sealed: []byte("sealed-" + id), CreatedAt: at}
	}
	a := mk("sec_a1", "t_a", "db-password", base)
	a.Metadata = map[string]string{"env": "prod"}
	if err := s.CreateSecret(ctx, a, 0); err != nil {
		t.Fatal(err)
	}
	if err := s.CreateSecret(ctx, mk("sec_a2", "t_a", "db-password", base), 0); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("duplicate name in a team: want ErrConflict, got %v", err)
	}
	if err := s.CreateSecret(ctx, mk("sec_a1", "t_b", "other", base), 0); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("duplicate ID: want ErrConflict, got %v", err)
	}
	if err := s.CreateSecret(ctx, mk("sec_b1", "t_b", "db-password", base), 0); err != nil {
		t.Fatalf("same name in another team must be allowed: %v", err)
	}
	if err := s.CreateSecret(ctx, mk("sec_x", "t_missing", "x", base), 0); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("missing team: want ErrNotFound, got %v", err)
	}

	got, err := s.GetSecret(ctx, "t_a", "sec_a1")
	if err != nil || got.Name != "db-password" || got.Version != 1 || got.Metadata["env"] != "prod" || !bytes.Equal(got.Sealed, []byte("sealed-sec_a1")) {
		t.Fatalf("get: %+v, %v", got, err)
	}
	if b, err := s.GetSecret(ctx, "t_b", "sec_b1"); err != nil || len(b.Metadata) != 0 || b.Metadata == nil {
		t.Fatalf("unset metadata must read back as an empty map: %+v, %v", b, err)
	}
	for _, fn := range []func() error{
		func() error { _, err := s.GetSecret(ctx, "t_b", "sec_a1"); return err },
		func() error { _, err := s.SecretByName(ctx, "t_a", "nope"); return err },
		func() error { _, err := s.UpdateSecret(ctx, "t_b", "sec_a1", 1, []byte("x"), nil); return err },
		func() error { return s.DeleteSecret(ctx, "t_b", "sec_a1") },
	} {
		if err := fn(); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("another team's or a missing secret: want ErrNotFound, got %v", err)
		}
	}
	if byName, err := s.SecretByName(ctx, "t_b", "db-password"); err != nil || byName.ID != "sec_b1" {
		t.Fatalf("by name is team-scoped: %+v, %v", byName, err)
	}

	up, err := s.UpdateSecret(ctx, "t_a", "sec_a1", 1, []byte("sealed-v2"), nil)
	if err != nil || up.Version != 2 || up.Metadata["env"] != "prod" {
		t.Fatalf("update keeping metadata: %+v, %v", up, err)
	}
	if _, err := s.UpdateSecret(ctx, "t_a", "sec_a1", 1, []byte("stale"), nil); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("stale version: want ErrConflict, got %v", err)
	}
	up, err = s.UpdateSecret(ctx, "t_a", "sec_a1", 2, []byte("sealed-v3"), map[string]string{})
	if err != nil || up.Version != 3 || len(up.Metadata) != 0 {
		t.Fatalf("update replacing metadata: %+v, %v", up, err)
	}
	got, _ = s.GetSecret(ctx, "t_a", "sec_a1")
	if got.Version != 3 || !bytes.Equal(got.Sealed, []byte("sealed-v3")) || got.UpdatedAt.Before(got.CreatedAt) {
		t.Fatalf("after updates: %+v", got)
	}

	// Paging: five more in t_a, two of them sharing a created time.
	for i := 0; i < 5; i++ {
		at := base.Add(time.Duration(i/2+1) * time.Second)
		if err := s.CreateSecret(ctx, mk(fmt.Sprintf("sec_p%d", i), "t_a", fmt.Sprintf("p%d", i), at), 0); err != nil {
			t.Fatal(err)
		}
	}
	var seen []string
	f := store.SecretFilter{TeamID: "t_a", Limit: 2}
	for i := 0; i < 10; i++ {
		page, err := s.ListSecrets(ctx, f)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range page {
			seen = append(seen, p.ID)
		}
		if len(page) < f.Limit {
			break
		}
		last := page[len(page)-1]
		f.AfterCreated, f.AfterID = last.CreatedAt, last.ID
	}
	want := []string{"sec_a1", "sec_p0", "sec_p1", "sec_p2", "sec_p3", "sec_p4"}
	if fmt.Sprint(seen) != fmt.Sprint(want) {
		t.Fatalf("paged list: got %v, want %v", seen, want)
	}

	if err := s.CreateSecret(ctx, mk("sec_q", "t_b", "over", base), 1); !errors.Is(err, store.ErrQuota) {
		t.Fatalf("a team at its limit: want ErrQuota, got %v", err)
	}
	if err := s.DeleteTeam(ctx, "t_b"); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("a team with secrets must not be deleted: %v", err)
	}
	if err := s.DeleteSecret(ctx, "t_b", "sec_b1"); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteSecret(ctx, "t_b", "sec_b1"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("second delete: %v", err)
	}
	if err := s.DeleteTeam(ctx, "t_b"); err != nil {
		t.Fatal(err)
	}
}
