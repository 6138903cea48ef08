package storetest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/store"
)

func runTenancy(t *testing.T, open func(t *testing.T) store.Store) {
	t.Run("TeamsCRUD", func(t *testing.T) { testTeams(t, open(t)) })
	t.Run("DeleteTeamRefusesOwners", func(t *testing.T) { testDeleteTeamGuard(t, open(t)) })
	t.Run("KeysBelongToTeams", func(t *testing.T) { testKeyTeams(t, open(t)) })
	t.Run("SandboxListIsPerTeam", func(t *testing.T) { testSandboxTeams(t, open(t)) })
	t.Run("VolumeNamesPerTeam", func(t *testing.T) { testVolumeTeams(t, open(t)) })
	t.Run("TemplateNamesPerTeam", func(t *testing.T) { testTemplateTeams(t, open(t)) })
	t.Run("SandboxQuota", func(t *testing.T) { testSandboxQuota(t, open(t)) })
	t.Run("SandboxQuotaRace", func(t *testing.T) { testSandboxQuotaRace(t, open(t)) })
	t.Run("VolumeQuota", func(t *testing.T) { testVolumeQuota(t, open(t)) })
	t.Run("VolumeByteQuota", func(t *testing.T) { testVolumeByteQuota(t, open(t)) })
	t.Run("PoolClaimMovesTeamAndChecksQuota", func(t *testing.T) { testPoolClaimTeams(t, open(t)) })
}

func mustTeam(t *testing.T, s store.Store, id string, q store.Quota) *store.Team {
	t.Helper()
	tm := &store.Team{ID: id, Name: "name-" + id, Quota: q}
	if err := s.CreateTeam(context.Background(), tm); err != nil {
		t.Fatal(err)
	}
	return tm
}

func teamSandbox(id, team string, started time.Time) *store.Sandbox {
	sb := sample(id, started)
	sb.TeamID = team
	return sb
}

func testTeams(t *testing.T, s store.Store) {
	ctx := context.Background()
	// Every store has the default team (migrated installs put everything in it).
	if d, err := s.GetTeam(ctx, store.DefaultTeamID); err != nil || d.Name != "default" {
		t.Fatalf("default team: %+v %v", d, err)
	}
	a := mustTeam(t, s, "t_a", store.Quota{MaxSandboxes: 3, MaxVCPUs: 4, MaxMemoryMB: 1024, MaxDiskMB: 2048, MaxVolumes: 5, MaxVolumeMB: 4096})
	if err := s.CreateTeam(ctx, &store.Team{ID: "t_b", Name: a.Name}); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("duplicate name: want ErrConflict, got %v", err)
	}
	if err := s.CreateTeam(ctx, &store.Team{ID: "t_a", Name: "other"}); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("duplicate ID: want ErrConflict, got %v", err)
	}
	got, err := s.TeamByName(ctx, a.Name)
	if err != nil || got.ID != "t_a" || got.Quota != a.Quota {
		t.Fatalf("by name: %+v %v", got, err)
	}
	got.Quota.MaxSandboxes = 0
	got.Name = "renamed"
	if err := s.UpdateTeam(ctx, got); err != nil {
		t.Fatal(err)
	}
	if again, _ := s.GetTeam(ctx, "t_a"); again.Name != "renamed" || again.Quota.MaxSandboxes != 0 || again.Quota.MaxVolumes != 5 {
		t.Fatalf("after update: %+v", again)
	}
	if err := s.UpdateTeam(ctx, &store.Team{ID: "missing", Name: "x"}); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("update missing: want ErrNotFound, got %v", err)
	}
	ts, err := s.ListTeams(ctx)
	if err != nil || len(ts) != 2 {
		t.Fatalf("list: %+v %v", ts, err)
	}
	if err := s.DeleteTeam(ctx, "t_a"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.GetTeam(ctx, "t_a"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("deleted team: want ErrNotFound, got %v", err)
	}
	if err := s.DeleteTeam(ctx, "t_a"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("second delete: want ErrNotFound, got %v", err)
	}
}

func testDeleteTeamGuard(t *testing.T, s store.Store) {
	ctx := context.Background()
	mustTeam(t, s, "t_a", store.Quota{})
	if err := s.CreateAPIKey(ctx, &store.APIKey{ID: "key_a", TeamID: "t_a", Hash: "ha", CreatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteTeam(ctx, "t_a"); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("team with a key: want ErrConflict, got %v", err)
	}
	if err := s.DeleteAPIKey(ctx, "key_a"); err != nil {
		t.Fatal(err)
	}
	sb := teamSandbox("aaaaaaaaaaaaaaaaaaaa", "t_a", time.Now())
	if err := s.CreateSandbox(ctx, sb); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteTeam(ctx, "t_a"); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("team with a live sandbox: want ErrConflict, got %v", err)
	}
	if _, err := s.CompareAndSetState(ctx, sb.ID, nil, store.StateKilled); err != nil {
		t.Fatal(err)
	}
	if err := s.CreateVolume(ctx, &store.Volume{ID: "v1", TeamID: "t_a", Name: "v1", Driver: "local", State: store.VolumeReady}); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteTeam(ctx, "t_a"); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("team with a volume: want ErrConflict, got %v", err)
	}
	if err := s.DeleteVolume(ctx, "v1"); err != nil {
		t.Fatal(err)
	}
	tpl := &store.Template{ID: "tpl_a", TeamID: "t_a", PrimaryName: "x", Names: []string{"x"}, BuildStatus: store.BuildWaiting}
	if err := s.CreateTemplate(ctx, tpl, &store.TemplateBuild{ID: "bld_a", TemplateID: tpl.ID, Status: store.BuildWaiting}); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteTeam(ctx, "t_a"); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("team with a template: want ErrConflict, got %v", err)
	}
	if err := s.DeleteTemplate(ctx, tpl.ID); err != nil {
		t.Fatal(err)
	}
	// Killed sandboxes are history, not ownership.
	if err := s.DeleteTeam(ctx, "t_a"); err != nil {
		t.Fatalf("empty team: %v", err)
	}
}

func testKeyTeams(t *testing.T, s store.Store) {
	ctx := context.Background()
	if err := s.CreateAPIKey(ctx, &store.APIKey{ID: "key_x", TeamID: "no-such-team", Hash: "hx", CreatedAt: time.Now()}); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("key of a missing team: want ErrNotFound, got %v", err)
	}
	if err := s.CreateAPIKey(ctx, &store.APIKey{ID: "key_y", Hash: "hy", CreatedAt: time.Now()}); err == nil {
		t.Fatal("a key without a team was stored")
	}
	mustTeam(t, s, "t_a", store.Quota{})
	if err := s.CreateAPIKey(ctx, &store.APIKey{ID: "key_a", TeamID: "t_a", Hash: "ha", CreatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	k, err := s.APIKeyByHash(ctx, "ha")
	if err != nil || k.TeamID != "t_a" || k.Admin {
		t.Fatalf("key: %+v %v", k, err)
	}
	// Deletion is visible to the very next lookup.
	if err := s.DeleteAPIKey(ctx, "key_a"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.APIKeyByHash(ctx, "ha"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("revoked key: want ErrNotFound, got %v", err)
	}
}

func testSandboxTeams(t *testing.T, s store.Store) {
	ctx := context.Background()
	mustTeam(t, s, "t_a", store.Quota{})
	mustTeam(t, s, "t_b", store.Quota{})
	now := time.Now().Truncate(time.Microsecond)
	for i, team := range []string{"t_a", "t_b", "t_a"} {
		if err := s.CreateSandbox(ctx, teamSandbox(fmt.Sprintf("%020d", i), team, now.Add(time.Duration(i)*time.Second))); err != nil {
			t.Fatal(err)
		}
	}
	got, err := s.GetSandbox(ctx, fmt.Sprintf("%020d", 1))
	if err != nil || got.TeamID != "t_b" {
		t.Fatalf("get: %+v %v", got, err)
	}
	a, _ := s.ListSandboxes(ctx, store.SandboxFilter{TeamID: "t_a"})
	b, _ := s.ListSandboxes(ctx, store.SandboxFilter{TeamID: "t_b"})
	all, _ := s.ListSandboxes(ctx, store.SandboxFilter{})
	if len(a) != 2 || len(b) != 1 || len(all) != 3 {
		t.Fatalf("lists: a %d b %d all %d", len(a), len(b), len(all))
	}
	for _, sb := range a {
		if sb.TeamID != "t_a" {
			t.Fatalf("team a's list holds %s of %s", sb.ID, sb.TeamID)
		}
	}
}

func testVolumeTeams(t *testing.T, s store.Store) {
	ctx := context.Background()
	mustTeam(t, s, "t_a", store.Quota{})
	mustTeam(t, s, "t_b", store.Quota{})
	if err := s.CreateVolume(ctx, &store.Volume{ID: "va", TeamID: "t_a", Name: "data", Driver: "local", State: store.VolumeReady}); err != nil {
		t.Fatal(err)
	}
	// The same name in another team is another volume.
	if err := s.CreateVolume(ctx, &store.Volume{ID: "vb", TeamID: "t_b", Name: "data", Driver: "local", State: store.VolumeReady}); err != nil {
		t.Fatal(err)
	}
	if err := s.CreateVolume(ctx, &store.Volume{ID: "vc", TeamID: "t_a", Name: "data", Driver: "local", State: store.VolumeReady}); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("same name in one team: want ErrConflict, got %v", err)
	}
	if err := s.CreateVolume(ctx, &store.Volume{ID: "vd", TeamID: "missing", Name: "x", Driver: "local", State: store.VolumeReady}); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("missing team: want ErrNotFound, got %v", err)
	}
	v, err := s.VolumeByName(ctx, "t_b", "data")
	if err != nil || v.ID != "vb" || v.TeamID != "t_b" {
		t.Fatalf("by name: %+v %v", v, err)
	}
	if _, err := s.VolumeByName(ctx, "t_b", "nope"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("missing name: want ErrNotFound, got %v", err)
	}
	la, _ := s.ListTeamVolumes(ctx, "t_a")
	all, _ := s.ListVolumes(ctx)
	if len(la) != 1 || la[0].ID != "va" || len(all) != 2 {
		t.Fatalf("lists: team %+v all %d", la, len(all))
	}
}

func testTemplateTeams(t *testing.T, s store.Store) {
	ctx := context.Background()
	mustTeam(t, s, "t_a", store.Quota{})
	mustTeam(t, s, "t_b", store.Quota{})
	mk := func(id, team, name string, public bool) *store.Template {
		tpl := &store.Template{ID: id, TeamID: team, PrimaryName: name, Names: []string{name, name + ":v1"}, Public: public, BuildStatus: store.BuildWaiting}
		if err := s.CreateTemplate(ctx, tpl, &store.TemplateBuild{ID: "bld_" + id, TemplateID: id, Status: store.BuildWaiting}); err != nil {
			t.Fatalf("create %s: %v", id, err)
		}
		time.Sleep(time.Millisecond) // distinct creation order
		return tpl
	}
	mk("tpl_pub", store.DefaultTeamID, "shared", true)
	mk("tpl_a", "t_a", "app", false)
	mk("tpl_b", "t_b", "app", false) // the same name in another team
	mk("tpl_a2", "t_a", "shared", false)
	if err := s.CreateTemplate(ctx, &store.Template{ID: "tpl_dup", TeamID: "t_a", PrimaryName: "app", Names: []string{"app"}, BuildStatus: store.BuildWaiting},
		&store.TemplateBuild{ID: "bld_dup", TemplateID: "tpl_dup", Status: store.BuildWaiting}); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("same name in one team: want ErrConflict, got %v", err)
	}
	for _, c := range []struct{ team, name, want string }{
		{"t_a", "app", "tpl_a"}, {"t_b", "app:v1", "tpl_b"},
		{"t_a", "shared", "tpl_a2"}, // a team's own name shadows a public one
		{"t_b", "shared:v1", "tpl_pub"},
	} {
		got, err := s.TemplateByName(ctx, c.team, c.name)
		if err != nil || got.ID != c.want || got.TeamID == "" {
			t.Fatalf("%s sees %s: %+v %v, want %s", c.team, c.name, got, err, c.want)
		}
	}
	if _, err := s.TemplateByName(ctx, store.DefaultTeamID, "app"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("another team's private name: want ErrNotFound, got %v", err)
	}
	// Renaming keeps the team's namespace.
	if err := s.SetTemplateNames(ctx, "tpl_b", []string{"app", "app:v2"}); err != nil {
		t.Fatal(err)
	}
	if got, err := s.TemplateByName(ctx, "t_b", "app:v2"); err != nil || got.ID != "tpl_b" {
		t.Fatalf("after rename: %+v %v", got, err)
	}
	ids := func(ts []*store.Template) []string {
		var out []string
		for _, x := range ts {
			out = append(out, x.ID)
		}
		return out
	}
	lb, err := s.ListTeamTemplates(ctx, "t_b", "", 0)
	if err != nil || fmt.Sprint(ids(lb)) != "[tpl_pub tpl_b]" {
		t.Fatalf("team b lists %v %v", ids(lb), err)
	}
	la1, _ := s.ListTeamTemplates(ctx, "t_a", "", 2)
	la2, _ := s.ListTeamTemplates(ctx, "t_a", la1[len(la1)-1].ID, 2)
	if fmt.Sprint(ids(la1), ids(la2)) != "[tpl_pub tpl_a] [tpl_a2]" {
		t.Fatalf("team a pages %v %v", ids(la1), ids(la2))
	}
	if all, _ := s.ListTemplates(ctx, "", 0); len(all) != 4 {
		t.Fatalf("all templates: %v", ids(all))
	}
}

func testSandboxQuota(t *testing.T, s store.Store) {
	ctx := context.Background()
	now := time.Now()
	mustTeam(t, s, "t_n", store.Quota{MaxSandboxes: 2})
	mustTeam(t, s, "t_c", store.Quota{MaxVCPUs: 3})
	mustTeam(t, s, "t_m", store.Quota{MaxMemoryMB: 1000})
	mustTeam(t, s, "t_d", store.Quota{MaxDiskMB: 1500})
	for _, c := range []struct {
		team, quota string
		limit       int
	}{{"t_n", "concurrent sandboxes", 2}, {"t_c", "vCPUs", 3}, {"t_m", "memory MiB", 1000}, {"t_d", "disk MiB", 1500}} {
		// sample() is 2 vCPUs, 512 MiB, 1024 MiB disk: the second create
		// trips the size quotas, the third the count.
		var err error
		n := 0
		for ; n < 5; n++ {
			if err = s.CreateSandbox(ctx, teamSandbox(fmt.Sprintf("%s%016d", c.team, n), c.team, now)); err != nil {
				break
			}
		}
		var qe *store.QuotaError
		if !errors.As(err, &qe) || !errors.Is(err, store.ErrQuota) || qe.Quota != c.quota || qe.Limit != c.limit {
			t.Fatalf("%s after %d creates: want a %s quota error, got %v", c.team, n, c.quota, err)
		}
		if want := fmt.Sprintf("team quota exceeded: %s (%d)", c.quota, c.limit); err.Error() != want {
			t.Fatalf("message %q, want %q", err.Error(), want)
		}
		if _, err := s.GetSandbox(ctx, fmt.Sprintf("%s%016d", c.team, n)); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("%s: the refused create left a row: %v", c.team, err)
		}
	}
	// Killed sandboxes give their share back; other teams are unaffected.
	if _, err := s.CompareAndSetState(ctx, "t_n"+fmt.Sprintf("%016d", 0), nil, store.StateKilled); err != nil {
		t.Fatal(err)
	}
	if err := s.CreateSandbox(ctx, teamSandbox("t_nxxxxxxxxxxxxxxxxx", "t_n", now)); err != nil {
		t.Fatalf("after a kill: %v", err)
	}
	for i := 0; i < 4; i++ {
		if err := s.CreateSandbox(ctx, teamSandbox(fmt.Sprintf("default%013d", i), store.DefaultTeamID, now)); err != nil {
			t.Fatalf("unlimited team: %v", err)
		}
	}
	if err := s.CreateSandbox(ctx, teamSandbox("nosuchteamxxxxxxxxxx", "nosuchteam", now)); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("missing team: want ErrNotFound, got %v", err)
	}
}

// Concurrent creates never overshoot the quota: the check and the insert
// are one step.
func testSandboxQuotaRace(t *testing.T, s store.Store) {
	ctx := context.Background()
	mustTeam(t, s, "t_r", store.Quota{MaxSandboxes: 3})
	var wg sync.WaitGroup
	var mu sync.Mutex
	ok, quota := 0, 0
	for i := 0; i < 16; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := s.CreateSandbox(ctx, teamSandbox(fmt.Sprintf("race%016d", i), "t_r", time.Now()))
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				ok++
			case errors.Is(err, store.ErrQuota):
				quota++
			default:
				t.Errorf("create: %v", err)
			}
		}()
	}
	wg.Wait()
	if ok != 3 || quota != 13 {
		t.Fatalf("want 3 creates and 13 quota errors, got %d and %d", ok, quota)
	}
}

func testVolumeQuota(t *testing.T, s store.Store) {
	ctx := context.Background()
	mustTeam(t, s, "t_v", store.Quota{MaxVolumes: 2})
	var err error
	for i := 0; i < 3 && err == nil; i++ {
		err = s.CreateVolume(ctx, &store.Volume{ID: fmt.Sprint("v", i), TeamID: "t_v", Name: fmt.Sprint("v", i), Driver: "local", State: store.VolumeReady})
	}
	var qe *store.QuotaError
	if !errors.As(err, &qe) || qe.Quota != "volumes" || qe.Limit != 2 {
		t.Fatalf("third volume: want the volumes quota, got %v", err)
	}
	if _, err := s.GetVolume(ctx, "v2"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("the refused create left a row: %v", err)
	}
}

// The byte quota sums the sizes of the team's volumes (deleting ones
// included, their data is still on disk) in the insert transaction;
// unsized volumes count nothing.
func testVolumeByteQuota(t *testing.T, s store.Store) {
	ctx := context.Background()
	mustTeam(t, s, "t_vb", store.Quota{MaxVolumeMB: 100})
	mk := func(id string, size int) error {
		return s.CreateVolume(ctx, &store.Volume{ID: id, TeamID: "t_vb", Name: id, Driver: "local", State: store.VolumeReady, SizeMB: size})
	}
	for _, v := range []struct {
		id   string
		size int
	}{{"b1", 60}, {"b2", 40}, {"b3", 0}} {
		if err := mk(v.id, v.size); err != nil {
			t.Fatalf("%s (%d MiB) within the quota: %v", v.id, v.size, err)
		}
	}
	if got, err := s.GetVolume(ctx, "b1"); err != nil || got.SizeMB != 60 {
		t.Fatalf("size round trip: %+v %v", got, err)
	}
	err := mk("b4", 1)
	var qe *store.QuotaError
	if !errors.As(err, &qe) || qe.Quota != "volume MiB" || qe.Limit != 100 || !errors.Is(err, store.ErrQuota) {
		t.Fatalf("101 MiB over a 100 MiB quota: want the volume size quota, got %v", err)
	}
	if _, err := s.GetVolume(ctx, "b4"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("the refused create left a row: %v", err)
	}
	// Another team's volumes do not count.
	mustTeam(t, s, "t_vb2", store.Quota{MaxVolumeMB: 100})
	if err := s.CreateVolume(ctx, &store.Volume{ID: "c1", TeamID: "t_vb2", Name: "c1", Driver: "local", State: store.VolumeReady, SizeMB: 100}); err != nil {
		t.Fatal(err)
	}
	// Concurrent creates cannot both pass the check.
	mustTeam(t, s, "t_vb3", store.Quota{MaxVolumeMB: 10})
	var wg sync.WaitGroup
	errs := make([]error, 8)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			id := fmt.Sprint("r", i)
			errs[i] = s.CreateVolume(ctx, &store.Volume{ID: id, TeamID: "t_vb3", Name: id, Driver: "local", State: store.VolumeReady, SizeMB: 4})
		}()
	}
	wg.Wait()
	ok := 0
	for _, err := range errs {
		switch {
		case err == nil:
			ok++
		case !errors.Is(err, store.ErrQuota):
			t.Fatalf("racing create: %v", err)
		}
	}
	if ok != 2 {
		t.Fatalf("%d racing 4 MiB creates fit a 10 MiB quota, want 2", ok)
	}
}

func testPoolClaimTeams(t *testing.T, s store.Store) {
	ctx := context.Background()
	mustTeam(t, s, "t_b", store.Quota{MaxSandboxes: 1})
	now := time.Now().Truncate(time.Microsecond)
	// Standbys of a public template belong to its team until claimed.
	for i, id := range []string{"pool0000000000000000", "pool1111111111111111"} {
		sb := standby(id, "t1", "b1", now.Add(time.Duration(i)*time.Second))
		sb.TeamID = store.DefaultTeamID
		if err := s.CreateSandbox(ctx, sb); err != nil {
			t.Fatal(err)
		}
	}
	got, err := s.ClaimPoolSandbox(ctx, "t1", "b1", "t_b", nil)
	if err != nil || got.ID != "pool0000000000000000" || got.TeamID != "t_b" {
		t.Fatalf("claim: %+v %v", got, err)
	}
	if _, ok := got.Metadata[store.PoolMetadataKey]; ok {
		t.Fatalf("claimed row keeps its pool mark: %v", got.Metadata)
	}
	// Team b is at its quota now: the next claim is refused and leaves the standby in the pool.
	if _, err := s.ClaimPoolSandbox(ctx, "t1", "b1", "t_b", nil); !errors.Is(err, store.ErrQuota) {
		t.Fatalf("claim over quota: want ErrQuota, got %v", err)
	}
	left, err := s.GetSandbox(ctx, "pool1111111111111111")
	if err != nil || left.TeamID != store.DefaultTeamID || left.Metadata[store.PoolMetadataKey] != "t1" {
		t.Fatalf("refused claim changed the standby: %+v %v", left, err)
	}
}
