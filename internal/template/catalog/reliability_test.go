package catalog_test

import (
	"context"
	"errors"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/store"
	"github.com/cubicle-dev/cubicle/internal/store/sqlite"
	"github.com/cubicle-dev/cubicle/internal/template/catalog"
)

// flakyStore is the real SQLite store whose writes of a build's final
// state (ready or error) fail while failFinal > 0 (fault injection).
type flakyStore struct {
	*sqlite.Store
	failFinal atomic.Int64
	failed    atomic.Int64
}

var errInjected = errors.New("injected store failure")

func (f *flakyStore) RecordTemplateBuild(ctx context.Context, b *store.TemplateBuild, r *store.TemplateReady) error {
	if (b.Status == store.BuildReady || b.Status == store.BuildError) && f.failFinal.Load() > 0 {
		f.failFinal.Add(-1)
		f.failed.Add(1)
		return errInjected
	}
	return f.Store.RecordTemplateBuild(ctx, b, r)
}

func newFlakyEnv(t *testing.T, sweep time.Duration) (*catalog.Catalog, *flakyStore, func() *catalog.Catalog) {
	t.Helper()
	sq, base, _, b := deps(t, t.TempDir())
	st := &flakyStore{Store: sq}
	start := func() *catalog.Catalog {
		cat := catalog.New(catalog.Config{Store: st, Builder: b, BaseRootfs: base, StoreRetries: 3, StoreRetryDelay: time.Millisecond, SweepInterval: sweep})
		ctx, cancel := context.WithCancel(context.Background())
		t.Cleanup(cancel)
		if err := cat.Start(ctx); err != nil {
			t.Fatal(err)
		}
		return cat
	}
	return start(), st, start
}

func buildStatus(t *testing.T, cat *catalog.Catalog, tplID, buildID string) *catalog.Status {
	t.Helper()
	st, err := cat.BuildStatus(context.Background(), dev, tplID, buildID, 0, 100, "")
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// settle waits until the build is no longer building (or gives up).
func settle(t *testing.T, cat *catalog.Catalog, tplID, buildID string, within time.Duration) *catalog.Status {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		st := buildStatus(t, cat, tplID, buildID)
		if st.Status == store.BuildReady || st.Status == store.BuildError || time.Now().After(deadline) {
			return st
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// startFromBase creates a template called name and starts its first build
// from the base image.
func startFromBase(t *testing.T, cat *catalog.Catalog, name string) *catalog.CreateResponse {
	t.Helper()
	ctx := context.Background()
	r, err := cat.Create(ctx, dev, catalog.CreateRequest{Name: name}, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := cat.StartBuild(ctx, dev, r.TemplateID, r.BuildID, catalog.StartRequest{FromTemplate: "base"}); err != nil {
		t.Fatal(err)
	}
	return r
}

// waitFailedWrites waits until st has refused n final writes (or gives up);
// callers then assert on the state, so giving up shows as their failure.
func waitFailedWrites(st *flakyStore, n int64, within time.Duration) {
	deadline := time.Now().Add(within)
	for st.failed.Load() < n && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
}

// A transient failure of the final write is retried: the build ends ready.
func TestBuildFinalWriteRetried(t *testing.T) {
	ctx := context.Background()
	cat, st, _ := newFlakyEnv(t, time.Hour)
	st.failFinal.Store(2) // fewer than StoreRetries
	r := startFromBase(t, cat, "retry")
	if s := settle(t, cat, r.TemplateID, r.BuildID, 30*time.Second); s.Status != store.BuildReady || st.failed.Load() != 2 {
		t.Fatalf("build %s after %d failed writes, want ready", s.Status, st.failed.Load())
	}
	if tpl, _ := cat.Get(ctx, dev, r.TemplateID); tpl.ReadyBuildID != r.BuildID || tpl.BuildStatus != store.BuildReady {
		t.Fatalf("template %+v", tpl)
	}
}

// A final write that fails past the retries leaves the build "building"
// only until the sweep: it writes the kept outcome once the store heals.
func TestBuildUnwrittenOutcomeSwept(t *testing.T) {
	cat, st, _ := newFlakyEnv(t, 20*time.Millisecond)
	st.failFinal.Store(1 << 30)
	r := startFromBase(t, cat, "swept")
	waitFailedWrites(st, 3, 30*time.Second)
	if s := buildStatus(t, cat, r.TemplateID, r.BuildID); s.Status != store.BuildBuilding {
		t.Fatalf("with the store failing: %s", s.Status)
	}
	st.failFinal.Store(0) // the store heals
	if s := settle(t, cat, r.TemplateID, r.BuildID, 10*time.Second); s.Status != store.BuildReady {
		t.Fatalf("after the store healed: %s, want ready", s.Status)
	}
}

// A build whose outcome was never written (the process died) is failed by
// the next Start's recovery, not left building.
func TestBuildUnwrittenOutcomeRecoveredOnRestart(t *testing.T) {
	cat, st, restart := newFlakyEnv(t, time.Hour)
	st.failFinal.Store(1 << 30)
	r := startFromBase(t, cat, "restart")
	waitFailedWrites(st, 3, 30*time.Second)
	st.failFinal.Store(0)
	cat2 := restart()
	if s := buildStatus(t, cat2, r.TemplateID, r.BuildID); s.Status != store.BuildError || s.Reason == nil || s.Reason.Message != "builder disappeared" {
		t.Fatalf("after restart: %+v", s)
	}
}

// barrierStore holds every AddTemplateBuild until n callers arrived, so
// all concurrent rebuilds have read the same template row (a wrapper
// around the real SQLite store); onRelease runs once, before release.
type barrierStore struct {
	*sqlite.Store
	n         int
	mu        sync.Mutex
	arrived   int
	release   chan struct{}
	onRelease func()
}

func (b *barrierStore) AddTemplateBuild(ctx context.Context, t *store.Template, bl *store.TemplateBuild, prev string) error {
	b.mu.Lock()
	b.arrived++
	if b.arrived == b.n {
		b.onRelease()
		close(b.release)
	}
	b.mu.Unlock()
	select {
	case <-b.release:
	case <-time.After(5 * time.Second):
	}
	return b.Store.AddTemplateBuild(ctx, t, bl, prev)
}

// Of concurrent rebuilds of one template exactly one is accepted, the rest
// get ErrConflict (409), and BuildCount counts one; spawns recorded while
// they ran are not lost to their stale rows. Concurrent creates of a new
// name: one is accepted.
func TestConcurrentRebuildsOneWins(t *testing.T) {
	ctx := context.Background()
	sq, err := sqlite.Open(filepath.Join(t.TempDir(), "db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sq.Close() })
	const n = 8
	bs := &barrierStore{Store: sq, n: n, release: make(chan struct{})}
	cat := catalog.New(catalog.Config{Store: bs})
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if err := cat.Start(cctx); err != nil {
		t.Fatal(err)
	}
	r, err := cat.Create(ctx, dev, catalog.CreateRequest{Name: "race"}, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	bs.onRelease = func() {
		for i := 0; i < 5; i++ {
			cat.Spawned(ctx, r.TemplateID)
		}
	}
	ids := map[string]bool{}
	run := func(name string) (won int) {
		errs := make([]error, n)
		resps := make([]*catalog.CreateResponse, n)
		var wg sync.WaitGroup
		for i := 0; i < n; i++ {
			wg.Add(1)
			go func(i int) {
				defer wg.Done()
				resps[i], errs[i] = cat.Create(ctx, dev, catalog.CreateRequest{Name: name}, "", nil)
			}(i)
		}
		wg.Wait()
		for i, err := range errs {
			if err == nil {
				won++
				ids[resps[i].TemplateID] = true
			} else if !errors.Is(err, catalog.ErrConflict) {
				t.Fatalf("%s: losing create: %v, want ErrConflict", name, err)
			}
		}
		return won
	}
	if won := run("race"); won != 1 {
		t.Fatalf("%d of %d concurrent rebuilds accepted, want 1", won, n)
	}
	tpl, err := cat.Get(ctx, dev, "race")
	if err != nil {
		t.Fatal(err)
	}
	if tpl.BuildCount != 2 || tpl.SpawnCount != 5 {
		t.Fatalf("BuildCount %d (want 2), SpawnCount %d (want 5)", tpl.BuildCount, tpl.SpawnCount)
	}
	if builds, _ := cat.Builds(ctx, tpl.ID); len(builds) != 2 {
		t.Fatalf("%d builds, want 2", len(builds))
	}
	// Creates of a new name: the name's insert is the one transaction, so
	// one template results; later arrivals that saw it are rebuilds (each
	// superseding the unstarted one before it), never a second template.
	clear(ids)
	if won := run("fresh"); won < 1 || len(ids) != 1 {
		t.Fatalf("concurrent creates of a new name: %d accepted, %d templates", won, len(ids))
	}
}
