// Package storetest is the conformance suite every store.Store backend runs.
package storetest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/store"
)

// Run exercises a fresh, empty store returned by open.
func Run(t *testing.T, open func(t *testing.T) store.Store) {
	t.Run("SandboxCRUD", func(t *testing.T) { testSandboxCRUD(t, open(t)) })
	t.Run("ListFilterAndPaging", func(t *testing.T) { testList(t, open(t)) })
	t.Run("CompareAndSetState", func(t *testing.T) { testCAS(t, open(t)) })
	t.Run("APIKeys", func(t *testing.T) { testKeys(t, open(t)) })
	t.Run("Events", func(t *testing.T) { testEvents(t, open(t)) })
	t.Run("Volumes", func(t *testing.T) { testVolumes(t, open(t)) })
	t.Run("VolumeDeleteGuardRace", func(t *testing.T) { testVolumeGuardRace(t, open(t)) })
	t.Run("Templates", func(t *testing.T) { testTemplates(t, open(t)) })
	t.Run("TemplateCounters", func(t *testing.T) { testTemplateCounters(t, open(t)) })
	t.Run("TemplateAlias", func(t *testing.T) { testTemplateAlias(t, open(t)) })
	t.Run("IdempotencyGC", func(t *testing.T) { testIdempotencyGC(t, open(t)) })
	t.Run("PoolClaimAndExclude", func(t *testing.T) { testPoolClaim(t, open(t)) })
	t.Run("PoolClaimRace", func(t *testing.T) { testPoolClaimRace(t, open(t)) })
	t.Run("PoolClaimOnNodes", func(t *testing.T) { testPoolClaimOnNodes(t, open(t)) })
	t.Run("Snapshots", func(t *testing.T) { testSnapshots(t, open(t)) })
	t.Run("Secrets", func(t *testing.T) { testSecrets(t, open(t)) })
	runTenancy(t, open)
	runNodes(t, open)
	runCluster(t, open)
	runPolicies(t, open)
}

func standby(id, tpl, build string, started time.Time) *store.Sandbox {
	sb := sample(id, started)
	sb.Metadata = map[string]string{store.PoolMetadataKey: tpl, store.PoolBuildMetadataKey: build}
	return sb
}

func testPoolClaim(t *testing.T, s store.Store) {
	ctx := context.Background()
	now := time.Now().Truncate(time.Microsecond)
	paused := standby("dddddddddddddddddddd", "t1", "b1", now.Add(-time.Hour))
	paused.State = store.StatePaused
	for _, sb := range []*store.Sandbox{
		standby("bbbbbbbbbbbbbbbbbbbb", "t1", "b1", now.Add(time.Second)),
		standby("aaaaaaaaaaaaaaaaaaaa", "t1", "b1", now),
		standby("cccccccccccccccccccc", "t1", "b0", now.Add(-time.Minute)), // stale build
		standby("ffffffffffffffffffff", "t2", "b1", now.Add(-time.Minute)), // other template
		paused,
		sample("eeeeeeeeeeeeeeeeeeee", now),
	} {
		if err := s.CreateSandbox(ctx, sb); err != nil {
			t.Fatal(err)
		}
	}
	got, err := s.ClaimPoolSandbox(ctx, "t1", "b1", "", nil)
	if err != nil || got.ID != "aaaaaaaaaaaaaaaaaaaa" {
		t.Fatalf("first claim: want the oldest standby, got %v, %v", got, err)
	}
	if _, ok := got.Metadata[store.PoolMetadataKey]; ok || len(got.Metadata) != 0 {
		t.Fatalf("claimed row keeps pool metadata: %v", got.Metadata)
	}
	if again, _ := s.GetSandbox(ctx, got.ID); len(again.Metadata) != 0 {
		t.Fatalf("stored row keeps pool metadata: %v", again.Metadata)
	}
	if got, err = s.ClaimPoolSandbox(ctx, "t1", "b1", "", nil); err != nil || got.ID != "bbbbbbbbbbbbbbbbbbbb" {
		t.Fatalf("second claim: %v, %v", got, err)
	}
	// Only the stale-build, other-template and paused standbys are left.
	if got, err := s.ClaimPoolSandbox(ctx, "t1", "b1", "", nil); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("third claim: want ErrNotFound, got %v, %v", got, err)
	}
	rows, err := s.ListSandboxes(ctx, store.SandboxFilter{ExcludeMetadataKey: store.PoolMetadataKey})
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, r := range rows {
		ids = append(ids, r.ID)
	}
	want := fmt.Sprint([]string{"bbbbbbbbbbbbbbbbbbbb", "eeeeeeeeeeeeeeeeeeee", "aaaaaaaaaaaaaaaaaaaa"}) // started_at desc, then id desc
	if fmt.Sprint(ids) != want {
		t.Fatalf("ExcludeMetadataKey: got %v, want %v", ids, want)
	}
	if rows, _ := s.ListSandboxes(ctx, store.SandboxFilter{}); len(rows) != 6 {
		t.Fatalf("unfiltered list: %d rows, want 6", len(rows))
	}
}

// A claim restricted to some nodes takes the oldest standby among them
// only; an empty list takes none.
func testPoolClaimOnNodes(t *testing.T, s store.Store) {
	ctx := context.Background()
	now := time.Now().Truncate(time.Microsecond)
	for i, n := range []string{"node-a", "node-b", "node-c"} {
		sb := standby(fmt.Sprintf("%s%s", strings.Repeat("a", 19), string(rune('a'+i))), "t1", "b1", now.Add(time.Duration(i)*time.Second))
		sb.Node = n
		if err := s.CreateSandbox(ctx, sb); err != nil {
			t.Fatal(err)
		}
	}
	if got, err := s.ClaimPoolSandbox(ctx, "t1", "b1", "", []string{}); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("claim on no node: %v, %v; want ErrNotFound", got, err)
	}
	if got, err := s.ClaimPoolSandbox(ctx, "t1", "b1", "", []string{"node-z"}); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("claim on a node without standbys: %v, %v; want ErrNotFound", got, err)
	}
	got, err := s.ClaimPoolSandbox(ctx, "t1", "b1", "", []string{"node-c", "node-b"})
	if err != nil || got.Node != "node-b" {
		t.Fatalf("claim on node-b or node-c: %v, %v; want the oldest of them, on node-b", got, err)
	}
	if got, err = s.ClaimPoolSandbox(ctx, "t1", "b1", "", nil); err != nil || got.Node != "node-a" {
		t.Fatalf("unrestricted claim: %v, %v; want the oldest, on node-a", got, err)
	}
}

func testPoolClaimRace(t *testing.T, s store.Store) {
	ctx := context.Background()
	now := time.Now().Truncate(time.Microsecond)
	const standbys, claimers = 5, 20
	for i := 0; i < standbys; i++ {
		if err := s.CreateSandbox(ctx, standby(fmt.Sprintf("pool%016d", i), "t1", "b1", now.Add(time.Duration(i)*time.Millisecond))); err != nil {
			t.Fatal(err)
		}
	}
	var mu sync.Mutex
	seen := map[string]int{}
	misses := 0
	var wg sync.WaitGroup
	for i := 0; i < claimers; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sb, err := s.ClaimPoolSandbox(ctx, "t1", "b1", "", nil)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				seen[sb.ID]++
			case errors.Is(err, store.ErrNotFound):
				misses++
			default:
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	if len(seen) != standbys || misses != claimers-standbys {
		t.Fatalf("claims: %d distinct, %d misses; want %d and %d", len(seen), misses, standbys, claimers-standbys)
	}
	for id, n := range seen {
		if n != 1 {
			t.Fatalf("standby %s claimed %d times", id, n)
		}
	}
}

func sample(id string, started time.Time) *store.Sandbox {
	return &store.Sandbox{
		ID: id, TemplateID: "base", Alias: "python", State: store.StateRunning, Node: "local",
		Metadata: map[string]string{"user id": "a&b", "k": "v"}, EnvVars: map[string]string{"A": "1"},
		EnvdToken: "tok", TrafficToken: "ttok", CPUCount: 2, MemoryMB: 512, DiskSizeMB: 1024,
		Network:   store.Network{AllowInternet: true, AllowPublicTraffic: true, AllowOut: []string{"1.1.1.1"}},
		StartedAt: started.UTC(), EndAt: started.Add(time.Minute).UTC(), Addr: "10.0.0.2",
	}
}

func testSandboxCRUD(t *testing.T, s store.Store) {
	ctx := context.Background()
	now := time.Now().Truncate(time.Microsecond)
	sb := sample("aaaaaaaaaaaaaaaaaaaa", now)
	if err := s.CreateSandbox(ctx, sb); err != nil {
		t.Fatal(err)
	}
	if err := s.CreateSandbox(ctx, sample(sb.ID, now)); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("duplicate create: want ErrConflict, got %v", err)
	}
	got, err := s.GetSandbox(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.Metadata["user id"] != "a&b" || got.EnvVars["A"] != "1" || got.Network.AllowOut[0] != "1.1.1.1" ||
		!got.StartedAt.Equal(sb.StartedAt) || !got.EndAt.Equal(sb.EndAt) || got.CPUCount != 2 || got.Alias != "python" {
		t.Fatalf("round trip mismatch: %+v", got)
	}
	got.State = store.StateKilled
	got.KillReason = "test"
	got.KilledAt = now
	if err := s.UpdateSandbox(ctx, got); err != nil {
		t.Fatal(err)
	}
	again, _ := s.GetSandbox(ctx, sb.ID)
	if again.State != store.StateKilled || again.KillReason != "test" {
		t.Fatalf("update lost: %+v", again)
	}
	if _, err := s.GetSandbox(ctx, "missing"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("want ErrNotFound, got %v", err)
	}
	if err := s.UpdateSandbox(ctx, sample("missing", now)); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("update missing: want ErrNotFound, got %v", err)
	}
}

func testList(t *testing.T, s store.Store) {
	ctx := context.Background()
	base := time.Now().Truncate(time.Microsecond)
	for i := 0; i < 7; i++ {
		sb := sample(fmt.Sprintf("sb%018d", i), base.Add(time.Duration(i)*time.Second))
		if i%2 == 1 {
			sb.State = store.StatePaused
			sb.Metadata = map[string]string{"k": "other"}
		}
		if err := s.CreateSandbox(ctx, sb); err != nil {
			t.Fatal(err)
		}
	}
	all, err := s.ListSandboxes(ctx, store.SandboxFilter{})
	if err != nil || len(all) != 7 || all[0].ID != "sb000000000000000006" {
		t.Fatalf("list all: %d rows, err %v", len(all), err)
	}
	run, _ := s.ListSandboxes(ctx, store.SandboxFilter{States: []store.SandboxState{store.StateRunning}})
	if len(run) != 4 {
		t.Fatalf("running: want 4 got %d", len(run))
	}
	md, _ := s.ListSandboxes(ctx, store.SandboxFilter{Metadata: map[string]string{"user id": "a&b"}})
	if len(md) != 4 {
		t.Fatalf("metadata filter: want 4 got %d", len(md))
	}
	none, _ := s.ListSandboxes(ctx, store.SandboxFilter{Metadata: map[string]string{"k": "nope"}})
	if len(none) != 0 {
		t.Fatalf("metadata filter miss: got %d", len(none))
	}
	// Walk pages of 2 and see every row exactly once, newest first.
	seen := map[string]bool{}
	f := store.SandboxFilter{Limit: 2}
	for page := 0; page < 10; page++ {
		rows, err := s.ListSandboxes(ctx, f)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range rows {
			if seen[r.ID] {
				t.Fatalf("row %s twice", r.ID)
			}
			seen[r.ID] = true
		}
		if len(rows) < 2 {
			break
		}
		f.AfterStarted, f.AfterID = rows[len(rows)-1].StartedAt, rows[len(rows)-1].ID
	}
	if len(seen) != 7 {
		t.Fatalf("paging saw %d rows, want 7", len(seen))
	}
	asc, _ := s.ListSandboxes(ctx, store.SandboxFilter{Ascending: true, Limit: 1})
	if len(asc) != 1 || asc[0].ID != "sb000000000000000000" {
		t.Fatalf("ascending first: %+v", asc)
	}
	n, err := s.CountSandboxes(ctx, []store.SandboxState{store.StatePaused})
	if err != nil || n != 3 {
		t.Fatalf("count paused: %d %v", n, err)
	}
}

func testCAS(t *testing.T, s store.Store) {
	ctx := context.Background()
	sb := sample("cascascascascascasca", time.Now())
	if err := s.CreateSandbox(ctx, sb); err != nil {
		t.Fatal(err)
	}
	// Exactly one of many concurrent transitions wins.
	var wg sync.WaitGroup
	var mu sync.Mutex
	wins := 0
	for i := 0; i < 16; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := s.CompareAndSetState(ctx, sb.ID, []store.SandboxState{store.StateRunning}, store.StatePausing)
			if err == nil {
				mu.Lock()
				wins++
				mu.Unlock()
			} else if !errors.Is(err, store.ErrConflict) {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	if wins != 1 {
		t.Fatalf("want exactly one winner, got %d", wins)
	}
	if _, err := s.CompareAndSetState(ctx, "missing", nil, store.StateKilled); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("missing: want ErrNotFound, got %v", err)
	}
}

func testKeys(t *testing.T, s store.Store) {
	ctx := context.Background()
	k := &store.APIKey{ID: "key_1", TeamID: store.DefaultTeamID, Admin: true, Name: "n", Hash: "h1", Prefix: "e2b_12", CreatedAt: time.Now()}
	if err := s.CreateAPIKey(ctx, k); err != nil {
		t.Fatal(err)
	}
	if err := s.CreateAPIKey(ctx, &store.APIKey{ID: "key_2", TeamID: store.DefaultTeamID, Name: "n", Hash: "h1", CreatedAt: time.Now()}); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("duplicate hash: want ErrConflict, got %v", err)
	}
	got, err := s.APIKeyByHash(ctx, "h1")
	if err != nil || got.ID != "key_1" || got.TeamID != store.DefaultTeamID || !got.Admin {
		t.Fatalf("lookup: %+v %v", got, err)
	}
	if _, err := s.APIKeyByHash(ctx, "nope"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("want ErrNotFound, got %v", err)
	}
	if err := s.TouchAPIKey(ctx, "key_1", time.Now()); err != nil {
		t.Fatal(err)
	}
	keys, _ := s.ListAPIKeys(ctx)
	if len(keys) != 1 || keys[0].LastUsed.IsZero() {
		t.Fatalf("list: %+v", keys)
	}
	if err := s.DeleteAPIKey(ctx, "key_1"); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteAPIKey(ctx, "key_1"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("second delete: want ErrNotFound, got %v", err)
	}
}

func testEvents(t *testing.T, s store.Store) {
	ctx := context.Background()
	t0 := time.Now()
	for i := 0; i < 5; i++ {
		if err := s.AppendEvent(ctx, &store.Event{SandboxID: "x", Type: "t", Message: fmt.Sprint(i), Time: t0.Add(time.Duration(i) * time.Millisecond)}); err != nil {
			t.Fatal(err)
		}
	}
	evs, err := s.ListEvents(ctx, "x", t0.Add(2*time.Millisecond), 2)
	if err != nil || len(evs) != 2 || evs[0].Message != "2" || evs[0].Level != "info" {
		t.Fatalf("events: %+v %v", evs, err)
	}
}
