package catalog_test

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/store"
	"github.com/cubicle-dev/cubicle/internal/store/sqlite"
	"github.com/cubicle-dev/cubicle/internal/template/catalog"
	"github.com/cubicle-dev/cubicle/internal/template/contextstore"
)

func smallTar(t *testing.T) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	tw.WriteHeader(&tar.Header{Name: "a.txt", Mode: 0o644, Size: 2, Typeflag: tar.TypeReg})
	tw.Write([]byte("hi"))
	tw.Close()
	return buf.Bytes()
}

// One collector pass, by a catalog of a fresh process over the same store
// and context dir (its state survives restarts): idempotency keys older
// than 24 h and old uploaded contexts no queued build reads are removed;
// fresh ones and referenced ones stay.
func TestCollectorRemovesExpiredKeysAndContexts(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	st, err := sqlite.Open(filepath.Join(dir, "db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	cs, err := contextstore.Open(filepath.Join(dir, "ctx"), 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	team, err := cs.Team(store.DefaultTeamID)
	if err != nil {
		t.Fatal(err)
	}
	old, used, fresh := strings.Repeat("a", 64), strings.Repeat("b", 64), strings.Repeat("c", 64)
	for _, h := range []string{old, used, fresh} {
		if err := team.Put(h, bytes.NewReader(smallTar(t))); err != nil {
			t.Fatal(err)
		}
	}
	past := time.Now().Add(-48 * time.Hour)
	for _, h := range []string{old, used} {
		if err := os.Chtimes(team.Path(h), past, past); err != nil {
			t.Fatal(err)
		}
	}

	cat := catalog.New(catalog.Config{Store: st})
	// A queued build (start accepted, not begun) reads the "used" context.
	r, err := cat.Create(ctx, dev, catalog.CreateRequest{Name: "app"}, "fresh-key", []byte(`{"name":"app"}`))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := st.GetTemplateBuild(ctx, r.BuildID)
	b.Spec = `{"fromTemplate":"base","steps":[{"type":"COPY","args":["a","/a"],"filesHash":"` + used + `"}]}`
	if err := st.UpdateTemplateBuild(ctx, b); err != nil {
		t.Fatal(err)
	}
	if _, err := st.PutIdempotency(ctx, &store.Idempotency{Key: "templates:" + store.DefaultTeamID + ":old-key", BodyHash: "x", CreatedAt: past}); err != nil {
		t.Fatal(err)
	}

	// Restart: a new catalog over the same state collects.
	cat2 := catalog.New(catalog.Config{Store: st})
	cat2.Collect(ctx, catalog.CollectorConfig{Contexts: cs.GCExcept})

	if team.Has(old) {
		t.Error("an unreferenced 48 h old context survived")
	}
	if !team.Has(used) || !team.Has(fresh) {
		t.Errorf("kept contexts removed: used %v, fresh %v", team.Has(used), team.Has(fresh))
	}
	// The old key is free again (a different body no longer conflicts)...
	if _, err := cat2.Create(ctx, dev, catalog.CreateRequest{Name: "other"}, "old-key", []byte(`{"name":"other"}`)); err != nil {
		t.Errorf("old idempotency key still held: %v", err)
	}
	// ...the fresh one still guards its body.
	if _, err := cat2.Create(ctx, dev, catalog.CreateRequest{Name: "x"}, "fresh-key", []byte(`{"name":"x"}`)); !errors.Is(err, catalog.ErrConflict) {
		t.Errorf("fresh idempotency key collected: %v", err)
	}
}
