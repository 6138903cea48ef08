package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"syscall"
	"testing"

	"github.com/spf13/cobra"

	cubicle "github.com/cubicle-dev/cubicle/sdk/go"

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
	st, err := openStore(context.Background(), dir, "")
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

// Every command and subcommand has help with its Short text and usage.
func TestEveryCommandHasHelp(t *testing.T) {
	var walk func(c *cobra.Command, path []string)
	n := 0
	walk = func(c *cobra.Command, path []string) {
		for _, sub := range c.Commands() {
			if sub.Hidden || sub.Name() == "help" {
				continue
			}
			p := append(append([]string{}, path...), sub.Name())
			out, err := run(t, append(p, "--help")...)
			want := sub.Short // help shows Long instead when there is one
			if sub.Long != "" {
				want, _, _ = strings.Cut(strings.TrimSpace(sub.Long), "\n")
			}
			if err != nil || sub.Short == "" || !strings.Contains(out, want) || !strings.Contains(out, "Usage:") {
				t.Errorf("cubicle %s --help: %v\n%s", strings.Join(p, " "), err, out)
			}
			n++
			walk(sub, p)
		}
	}
	walk(newRoot(), nil)
	if n < 40 {
		t.Fatalf("only %d commands walked", n)
	}
	for _, want := range [][]string{{"sandbox", "exec"}, {"sandbox", "shell"}, {"files", "cp"}, {"files", "ls"}, {"template", "build"}, {"gpu", "list"}, {"completion", "bash"}} {
		if _, err := run(t, append(want, "--help")...); err != nil {
			t.Errorf("%v: %v", want, err)
		}
	}
}

func TestHints(t *testing.T) {
	for err, want := range map[error]string{
		&cubicle.APIError{StatusCode: 401}:                             "CUBICLE_API_KEY",
		fmt.Errorf("x: %w", cubicle.ErrSandboxNotFound):                "sandbox list",
		&cubicle.APIError{StatusCode: 409, ErrorCode: "volume_in_use"}: "volume get",
		&cubicle.APIError{StatusCode: 429}:                             "capacity",
		syscall.ECONNREFUSED:                                           "cubicle serve",
	} {
		if h := hint(err); !strings.Contains(h, want) {
			t.Errorf("hint(%v) = %q, want %q in it", err, h, want)
		}
	}
	if h := hint(errors.New("plain")); h != "" {
		t.Errorf("plain error got a hint: %q", h)
	}
}

func TestFlagParsers(t *testing.T) {
	m, err := parseVolumeFlags([]string{"data:/data", "models:/m:ro", "x:/x:rw"})
	if err != nil || len(m) != 3 || m[0].ReadOnly || !m[1].ReadOnly || m[2].ReadOnly || m[1].Name != "models" {
		t.Fatalf("%+v %v", m, err)
	}
	for _, bad := range []string{"data", ":/x", "d:/x:rx", "a:b:c:d"} {
		if _, err := parseVolumeFlags([]string{bad}); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
	kv, err := parseKV("env", []string{"A=1", "B=x=y", "C="})
	if err != nil || kv["A"] != "1" || kv["B"] != "x=y" || kv["C"] != "" {
		t.Fatalf("%v %v", kv, err)
	}
	if _, err := parseKV("env", []string{"=v"}); err == nil {
		t.Error("empty key accepted")
	}
	for s, ok := range map[string]bool{"abc:/x": true, "./local:x": false, "/abs/path": false, "a.b:/x": false} {
		if _, _, got := remotePath(s); got != ok {
			t.Errorf("remotePath(%q) = %v", s, got)
		}
	}
	if got := shellJoin([]string{"echo", "a b", "$HOME"}); got != `echo 'a b' '$HOME'` {
		t.Errorf("shellJoin: %s", got)
	}
}

func TestTeamsAndTeamKeys(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	out, err := run(t, "team", "create", "--data-dir", dir, "acme", "--max-sandboxes", "3", "--max-volumes", "2")
	if err != nil {
		t.Fatal(err)
	}
	teamID := strings.TrimSpace(out)
	if _, err := run(t, "team", "create", "--data-dir", dir, "acme"); err == nil {
		t.Fatal("a second team called acme was created")
	}
	if _, err := run(t, "team", "create", "--data-dir", dir, "Bad Name"); err == nil {
		t.Fatal("an invalid team name was accepted")
	}
	if _, err := run(t, "team", "update", "--data-dir", dir, "acme", "--max-vcpus", "8", "--max-sandboxes", "0"); err != nil {
		t.Fatal(err)
	}
	out, err = run(t, "team", "list", "--data-dir", dir)
	if err != nil || !regexp.MustCompile(`(?m)^`+teamID+`\s+acme\s+-\s+8\s+-\s+-\s+2\s+-\s*$`).MatchString(out) || !strings.Contains(out, "default") {
		t.Fatalf("list: %q %v", out, err)
	}
	member, err := run(t, "apikey", "create", "--data-dir", dir, "--team", "acme")
	if err != nil {
		t.Fatal(err)
	}
	boss, err := run(t, "apikey", "create", "--data-dir", dir, "--team", teamID, "--admin")
	if err != nil {
		t.Fatal(err)
	}
	dev, err := run(t, "apikey", "create", "--data-dir", dir)
	if err != nil {
		t.Fatal(err)
	}
	plain, err := run(t, "apikey", "create", "--data-dir", dir, "--admin=false")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := run(t, "apikey", "create", "--data-dir", dir, "--team", "nope"); err == nil {
		t.Fatal("a key of a missing team was created")
	}
	st, err := openStore(context.Background(), dir, "")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		key, team string
		admin     bool
	}{{member, teamID, false}, {boss, teamID, true}, {dev, "default", true}, {plain, "default", false}} {
		k, err := st.APIKeyByHash(ctx, api.HashKey(strings.TrimSpace(c.key)))
		if err != nil || k.TeamID != c.team || k.Admin != c.admin {
			t.Errorf("key of %s (admin %v): %+v %v", c.team, c.admin, k, err)
		}
	}
	st.Close()
	out, err = run(t, "apikey", "list", "--data-dir", dir, "--team", "acme")
	if err != nil || strings.Count(out, " acme ") != 2 || strings.Count(strings.TrimSpace(out), "\n") != 2 {
		t.Fatalf("team key list: %q %v", out, err)
	}
	// A team that still has keys is not deleted; the default team never is.
	if _, err := run(t, "team", "delete", "--data-dir", dir, "acme"); err == nil || !strings.Contains(err.Error(), "API keys") {
		t.Fatalf("delete with keys: %v", err)
	}
	if _, err := run(t, "team", "delete", "--data-dir", dir, "default"); err == nil {
		t.Fatal("the default team was deleted")
	}
	st, _ = openStore(context.Background(), dir, "")
	keys, _ := st.ListAPIKeys(ctx)
	st.Close()
	for _, k := range keys {
		if k.TeamID == teamID {
			if _, err := run(t, "apikey", "revoke", "--data-dir", dir, k.ID); err != nil {
				t.Fatal(err)
			}
		}
	}
	if _, err := run(t, "team", "delete", "--data-dir", dir, "acme"); err != nil {
		t.Fatal(err)
	}
}
