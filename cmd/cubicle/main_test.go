package main

import (
	"bytes"
	"context"
	"regexp"
	"strings"
	"testing"

	"github.com/cubicle-dev/cubicle/internal/api"
)

func run(t *testing.T, args ...string) (string, error) {
	t.Helper()
	root := newRoot()
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&out)
	root.SetArgs(args)
	err := root.ExecuteContext(context.Background())
	return out.String(), err
}

func TestHelpListsSubcommands(t *testing.T) {
	out, err := run(t, "--help")
	if err != nil {
		t.Fatal(err)
	}
	for _, sub := range []string{"serve", "apikey", "sandbox", "version"} {
		if !strings.Contains(out, sub) {
			t.Errorf("help lacks %q:\n%s", sub, out)
		}
	}
}

func TestAPIKeyCreateListDelete(t *testing.T) {
	dir := t.TempDir()
	out, err := run(t, "apikey", "create", "--data-dir", dir, "--name", "ci")
	if err != nil {
		t.Fatal(err)
	}
	key := strings.TrimSpace(out)
	if !regexp.MustCompile(`^e2b_[0-9a-f]{40}$`).MatchString(key) {
		t.Fatalf("key shape: %q", key)
	}
	st, err := openStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	k, err := st.APIKeyByHash(context.Background(), api.HashKey(key))
	st.Close()
	if err != nil || k.Name != "ci" || k.Hash == key {
		t.Fatalf("stored key: %+v %v", k, err)
	}
	out, err = run(t, "apikey", "list", "--data-dir", dir)
	if err != nil || !strings.Contains(out, k.ID) || strings.Contains(out, key) {
		t.Fatalf("list must show the ID and never the secret: %q %v", out, err)
	}
	if _, err := run(t, "apikey", "delete", "--data-dir", dir, k.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := run(t, "apikey", "delete", "--data-dir", dir, k.ID); err == nil {
		t.Fatal("deleting twice should fail")
	}
}

func TestSandboxCommandNeedsKey(t *testing.T) {
	t.Setenv("CUBICLE_API_KEY", "")
	t.Setenv("E2B_API_KEY", "")
	t.Setenv("CUBE_API_KEY", "")
	_, err := run(t, "sandbox", "list")
	if err == nil || !strings.Contains(err.Error(), "apikey create") {
		t.Fatalf("want a hint to create a key, got %v", err)
	}
}

func TestVersion(t *testing.T) {
	out, err := run(t, "version")
	if err != nil || !strings.HasPrefix(out, "cubicle ") {
		t.Fatalf("%q %v", out, err)
	}
}
