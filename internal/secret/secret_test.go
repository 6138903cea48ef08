package secret_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/cubicle-dev/cubicle/internal/secret"
	"github.com/cubicle-dev/cubicle/internal/store"
	"github.com/cubicle-dev/cubicle/internal/store/sqlite"
)

func open(t *testing.T, dir string, key []byte) (*secret.Secrets, *sqlite.Store) {
	t.Helper()
	st, err := sqlite.Open(filepath.Join(dir, "c.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	x, err := secret.New(st, key)
	if err != nil {
		t.Fatal(err)
	}
	return x, st
}

func TestKeyFileCreatedPrivateAndReused(t *testing.T) {
	p := filepath.Join(t.TempDir(), "secrets.key")
	k1, err := secret.LoadOrCreateKey(p)
	if err != nil || len(k1) != secret.KeySize {
		t.Fatalf("create: %v", err)
	}
	st, _ := os.Stat(p)
	if st.Mode().Perm() != 0o600 {
		t.Fatalf("key file mode %#o, want 0600", st.Mode().Perm())
	}
	k2, err := secret.LoadOrCreateKey(p)
	if err != nil || !bytes.Equal(k1, k2) {
		t.Fatalf("reload must return the same key: %v", err)
	}
	if err := os.Chmod(p, 0o640); err != nil {
		t.Fatal(err)
	}
	if _, err := secret.LoadOrCreateKey(p); !errors.Is(err, secret.ErrKeyFile) {
		t.Fatalf("group-readable key: want ErrKeyFile, got %v", err)
	}
	os.Chmod(p, 0o600)
	os.WriteFile(p, []byte("not hex"), 0o600)
	if _, err := secret.LoadKey(p); !errors.Is(err, secret.ErrKeyFile) {
		t.Fatalf("garbage key: want ErrKeyFile, got %v", err)
	}
}

// The value must not appear anywhere in the database files, and the right
// key resolves it.
func TestValueEncryptedAtRest(t *testing.T) {
	dir := t.TempDir()
	key, _ := secret.LoadOrCreateKey(filepath.Join(dir, "k"))
	x, st := open(t, dir, key)
	ctx := context.Background()
	const value = "PLAINTEXT-canary-7f3a9c2e41b8"
	sec, err := x.Create(ctx, store.SystemTeamID, "api-key", value, map[string]string{"m": "1"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := x.Update(ctx, store.SystemTeamID, sec.ID, value+"-v2", nil); err != nil {
		t.Fatal(err)
	}
	if got, err := x.Resolve(ctx, store.SystemTeamID, "api-key"); err != nil || got != value+"-v2" {
		t.Fatalf("resolve: %q, %v", got, err)
	}
	st.Close()
	matches, _ := filepath.Glob(filepath.Join(dir, "c.db*"))
	if len(matches) == 0 {
		t.Fatal("no database files")
	}
	for _, f := range matches {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if bytes.Contains(b, []byte("PLAINTEXT-canary")) {
			t.Fatalf("%s holds the plaintext value", f)
		}
	}
}

func TestWrongKeyIsReportedAsSuch(t *testing.T) {
	dir := t.TempDir()
	k1, _ := secret.LoadOrCreateKey(filepath.Join(dir, "k1"))
	k2, _ := secret.LoadOrCreateKey(filepath.Join(dir, "k2"))
	x1, st := open(t, dir, k1)
	ctx := context.Background()
	if _, err := x1.Create(ctx, store.SystemTeamID, "s", "v", nil); err != nil {
		t.Fatal(err)
	}
	x2, _ := secret.New(st, k2)
	_, err := x2.Resolve(ctx, store.SystemTeamID, "s")
	if !errors.Is(err, secret.ErrWrongKey) || strings.Contains(err.Error(), "\"v\"") {
		t.Fatalf("want ErrWrongKey, got %v", err)
	}
	// Setting the value again under the new key repairs the secret.
	if _, err := x2.Update(ctx, store.SystemTeamID, "s", "v2", nil); err != nil {
		t.Fatal(err)
	}
	if v, err := x2.Resolve(ctx, store.SystemTeamID, "s"); err != nil || v != "v2" {
		t.Fatalf("after reset: %q, %v", v, err)
	}
}

// Sealed bytes moved from one row to another fail authentication (AAD).
func TestSealedBytesBoundToRow(t *testing.T) {
	dir := t.TempDir()
	key, _ := secret.LoadOrCreateKey(filepath.Join(dir, "k"))
	x, st := open(t, dir, key)
	ctx := context.Background()
	a, _ := x.Create(ctx, store.SystemTeamID, "a", "value-a", nil)
	b, _ := x.Create(ctx, store.SystemTeamID, "b", "value-b", nil)
	if _, err := st.UpdateSecret(ctx, store.SystemTeamID, b.ID, 1, a.Sealed, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := x.Resolve(ctx, store.SystemTeamID, "b"); !errors.Is(err, secret.ErrUnreadable) {
		t.Fatalf("swapped ciphertext: want ErrUnreadable, got %v", err)
	}
}

func TestValidationAndLookup(t *testing.T) {
	dir := t.TempDir()
	key, _ := secret.LoadOrCreateKey(filepath.Join(dir, "k"))
	x, _ := open(t, dir, key)
	ctx := context.Background()
	big := map[string]string{}
	for i := 0; i < 33; i++ {
		big[strings.Repeat("k", i+1)] = "v"
	}
	for _, c := range []struct {
		name, value string
		meta        map[string]string
	}{
		{"", "v", nil}, {"a{b", "v", nil}, {"a}b", "v", nil}, {"a\nb", "v", nil}, {" a", "v", nil},
		{strings.Repeat("n", 129), "v", nil}, {"ok", "", nil}, {"ok", strings.Repeat("v", secret.MaxValueBytes+1), nil},
		{"ok", "v", big}, {"ok", "v", map[string]string{strings.Repeat("k", 129): "v"}},
		{"ok", "v", map[string]string{"k": strings.Repeat("v", 1025)}},
	} {
		if _, err := x.Create(ctx, store.SystemTeamID, c.name, c.value, c.meta); !errors.Is(err, secret.ErrInvalid) {
			t.Fatalf("create(%q): want ErrInvalid, got %v", c.name, err)
		}
	}
	sec, err := x.Create(ctx, store.SystemTeamID, "svc.token-1", "v", nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := x.Create(ctx, store.SystemTeamID, "svc.token-1", "v", nil); !errors.Is(err, secret.ErrConflict) {
		t.Fatalf("duplicate: %v", err)
	}
	for _, ref := range []string{sec.ID, "svc.token-1"} {
		if got, err := x.Get(ctx, store.SystemTeamID, ref); err != nil || got.ID != sec.ID {
			t.Fatalf("get %q: %v", ref, err)
		}
	}
	if _, err := x.Get(ctx, "t_other", sec.ID); !errors.Is(err, secret.ErrNotFound) {
		t.Fatalf("other team: %v", err)
	}
	if _, err := x.Resolve(ctx, store.SystemTeamID, "nope"); !errors.Is(err, secret.ErrNotFound) {
		t.Fatalf("resolve missing: %v", err)
	}
}

// Concurrent updates each land as their own version.
func TestConcurrentUpdates(t *testing.T) {
	dir := t.TempDir()
	key, _ := secret.LoadOrCreateKey(filepath.Join(dir, "k"))
	x, _ := open(t, dir, key)
	ctx := context.Background()
	if _, err := x.Create(ctx, store.SystemTeamID, "c", "v0", nil); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for i := 0; i < 4; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := x.Update(ctx, store.SystemTeamID, "c", "v", nil)
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	sec, _ := x.Get(ctx, store.SystemTeamID, "c")
	if sec.Version != 5 {
		t.Fatalf("version %d, want 5", sec.Version)
	}
	if v, err := x.Resolve(ctx, store.SystemTeamID, "c"); err != nil || v != "v" {
		t.Fatalf("resolve: %v", err)
	}
}

// e2b's schema: "Names are lower-cased before storage and returned in that
// canonical form; the sec_ prefix is reserved for secret identifiers."
func TestNamesCanonicalAndNotIDs(t *testing.T) {
	dir := t.TempDir()
	key, _ := secret.LoadOrCreateKey(filepath.Join(dir, "k"))
	x, st := open(t, dir, key)
	ctx := context.Background()
	sec, err := x.Create(ctx, store.SystemTeamID, "OpenAI/API-Key", "v1", nil)
	if err != nil {
		t.Fatal(err)
	}
	if sec.Name != "openai/api-key" {
		t.Fatalf("stored name %q, want the lower-case form", sec.Name)
	}
	for _, ref := range []string{"openai/api-key", "OpenAI/API-Key", "OPENAI/API-KEY"} {
		if got, err := x.Get(ctx, store.SystemTeamID, ref); err != nil || got.ID != sec.ID {
			t.Fatalf("get %q: %v", ref, err)
		}
		if v, err := x.Resolve(ctx, store.SystemTeamID, ref); err != nil || v != "v1" {
			t.Fatalf("resolve %q: %q %v", ref, v, err)
		}
	}
	if _, err := x.Create(ctx, store.SystemTeamID, "OPENAI/api-key", "v", nil); !errors.Is(err, secret.ErrConflict) {
		t.Fatalf("a name differing only in case: want ErrConflict, got %v", err)
	}
	for _, name := range []string{"sec_" + strings.Repeat("0", 24), "sec_x", "SEC_x", "Sec_", ".", ".."} {
		_, err := x.Create(ctx, store.SystemTeamID, name, "v", nil)
		if !errors.Is(err, secret.ErrInvalid) || !strings.Contains(err.Error(), "name must not") {
			t.Fatalf("create %q: want ErrInvalid naming the name, got %v", name, err)
		}
	}
	// Lower-casing can lengthen a name: the limit applies to what is stored.
	if _, err := x.Create(ctx, store.SystemTeamID, strings.Repeat("Ⱥ", 64), "v", nil); !errors.Is(err, secret.ErrInvalid) {
		t.Fatalf("128-byte name that lower-cases to 192 bytes: %v", err)
	}
	// A row stored before names were canonicalised is still found as given.
	legacy := &store.Secret{ID: "sec_legacy0000000000000000", TeamID: store.SystemTeamID, Name: "Legacy-Name", Version: 1, Sealed: sec.Sealed}
	if err := st.CreateSecret(ctx, legacy, 0); err != nil {
		t.Fatal(err)
	}
	if got, err := x.Get(ctx, store.SystemTeamID, "Legacy-Name"); err != nil || got.ID != legacy.ID {
		t.Fatalf("legacy mixed-case row: %v", err)
	}
}

// serve's key loading: a fresh install gets a key; a missing key file with
// secrets already in the store is refused, naming the path, and no key is
// made; an existing key file is read as before.
func TestLoadOrCreateKeyForRefusesLostKey(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "secrets.key")
	st, err := sqlite.Open(filepath.Join(dir, "c.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ctx := context.Background()
	k1, err := secret.LoadOrCreateKeyFor(ctx, p, st)
	if err != nil || len(k1) != secret.KeySize {
		t.Fatalf("fresh install: %v", err)
	}
	x, err := secret.New(st, k1)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := x.Create(ctx, store.SystemTeamID, "s", "v", nil); err != nil {
		t.Fatal(err)
	}
	if k2, err := secret.LoadOrCreateKeyFor(ctx, p, st); err != nil || !bytes.Equal(k1, k2) {
		t.Fatalf("existing key: %v", err)
	}
	if err := os.Remove(p); err != nil {
		t.Fatal(err)
	}
	_, err = secret.LoadOrCreateKeyFor(ctx, p, st)
	if !errors.Is(err, secret.ErrKeyMissing) || !strings.Contains(err.Error(), p) {
		t.Fatalf("lost key: want ErrKeyMissing naming %s, got %v", p, err)
	}
	if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a key file was created after all: %v", err)
	}
	// Once the secrets are gone a new key may be made again.
	if err := x.Delete(ctx, store.SystemTeamID, "s"); err != nil {
		t.Fatal(err)
	}
	k3, err := secret.LoadOrCreateKeyFor(ctx, p, st)
	if err != nil {
		t.Fatalf("no secrets left: %v", err)
	}
	// A secret of a team (not the system team) counts too.
	if err := st.CreateTeam(ctx, &store.Team{ID: "t_a", Name: "a"}); err != nil {
		t.Fatal(err)
	}
	x3, _ := secret.New(st, k3)
	if _, err := x3.Create(ctx, "t_a", "s", "v", nil); err != nil {
		t.Fatal(err)
	}
	os.Remove(p)
	if _, err := secret.LoadOrCreateKeyFor(ctx, p, st); !errors.Is(err, secret.ErrKeyMissing) {
		t.Fatalf("lost key, team secret: want ErrKeyMissing, got %v", err)
	}
}
