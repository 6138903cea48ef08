package integration

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	cubicle "github.com/cubicle-dev/cubicle/sdk/go"
)

// The Go SDK and the CLI over a real server: every call, the typed 404,
// pagination, another team's secret looking missing, and a value that is
// never printed back.
func TestSDKAndCLISecrets(t *testing.T) {
	s := startServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := cubicle.NewClient(cubicle.Config{APIURL: s.URL, APIKey: s.Key})
	if err != nil {
		t.Fatal(err)
	}
	const value = "sdk-value-4c1f9e-never-shown"

	sec, err := c.CreateSecret(ctx, "sdk-token", value, map[string]string{"env": "ci"})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(sec.SecretID, "sec_") || sec.Name != "sdk-token" || sec.CurrentVersion != 1 || sec.Metadata["env"] != "ci" {
		t.Fatalf("create: %+v", sec)
	}
	if _, err := c.CreateSecret(ctx, "sdk-token", "x", nil); !errors.Is(err, cubicle.ErrConflict) {
		t.Fatalf("duplicate name: %v", err)
	}
	if _, err := c.CreateSecret(ctx, "bad{name}", "x", nil); !errors.Is(err, cubicle.ErrInvalidArgument) {
		t.Fatalf("bad name: %v", err)
	}
	up, err := c.UpdateSecret(ctx, "sdk-token", value+"-2", nil)
	if err != nil || up.CurrentVersion != 2 || up.SecretID != sec.SecretID {
		t.Fatalf("update by name: %+v %v", up, err)
	}
	got, err := c.GetSecret(ctx, sec.SecretID)
	if err != nil || got.CurrentVersion != 2 || got.Name != "sdk-token" || got.Metadata == nil {
		t.Fatalf("get by ID: %+v %v", got, err)
	}

	for i := range 3 {
		if _, err := c.CreateSecret(ctx, "page-"+string(rune('a'+i)), "v", nil); err != nil {
			t.Fatal(err)
		}
	}
	seen := map[string]bool{}
	tok := ""
	for pages := 0; ; pages++ {
		if pages > 10 {
			t.Fatal("pagination does not end")
		}
		p, err := c.ListSecrets(ctx, &cubicle.ListSecretsOptions{Limit: 2, NextToken: tok})
		if err != nil {
			t.Fatal(err)
		}
		if len(p.Secrets) > 2 {
			t.Fatalf("page of %d with limit 2", len(p.Secrets))
		}
		for _, x := range p.Secrets {
			if seen[x.SecretID] {
				t.Fatalf("%s listed twice", x.SecretID)
			}
			seen[x.SecretID] = true
		}
		if tok = p.NextToken; tok == "" {
			break
		}
	}
	if len(seen) != 4 || !seen[sec.SecretID] {
		t.Fatalf("listed %v", seen)
	}

	// Another team sees nothing of it: the same 404 as a missing secret.
	s.cli(t, "team", "create", "secrets-b")
	other, err := cubicle.NewClient(cubicle.Config{APIURL: s.URL, APIKey: s.cli(t, "apikey", "create", "--team", "secrets-b")})
	if err != nil {
		t.Fatal(err)
	}
	for _, ref := range []string{sec.SecretID, "sdk-token"} {
		if _, err := other.GetSecret(ctx, ref); !errors.Is(err, cubicle.ErrSecretNotFound) {
			t.Fatalf("other team get %s: %v", ref, err)
		}
		if _, err := other.UpdateSecret(ctx, ref, "stolen", nil); !errors.Is(err, cubicle.ErrSecretNotFound) {
			t.Fatalf("other team update %s: %v", ref, err)
		}
		if err := other.DeleteSecret(ctx, ref); !errors.Is(err, cubicle.ErrSecretNotFound) {
			t.Fatalf("other team delete %s: %v", ref, err)
		}
	}
	if p, err := other.ListSecrets(ctx, nil); err != nil || len(p.Secrets) != 0 {
		t.Fatalf("other team list: %+v %v", p, err)
	}

	// The CLI: value on stdin, from a file, never echoed.
	cli := func(stdin string, args ...string) (string, int) {
		t.Helper()
		cctx, ccancel := context.WithTimeout(ctx, time.Minute)
		defer ccancel()
		cmd := exec.CommandContext(cctx, filepath.Join(binDir, "cubicle"), args...)
		cmd.Env = append(os.Environ(), "CUBICLE_API_URL="+s.URL, "CUBICLE_API_KEY="+s.Key)
		cmd.Stdin = strings.NewReader(stdin)
		out, err := cmd.CombinedOutput()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatalf("%v: %v", args, err)
		}
		if strings.Contains(string(out), value) || strings.Contains(string(out), "cli-value-") {
			t.Fatalf("cubicle %v printed a secret value:\n%s", args, out)
		}
		return string(out), code
	}
	if out, code := cli("cli-value-stdin\n", "secret", "create", "cli-one", "--metadata", "who=cli"); code != 0 || !strings.Contains(out, "cli-one") {
		t.Fatalf("create from stdin: %d %s", code, out)
	}
	vf := filepath.Join(t.TempDir(), "v")
	if err := os.WriteFile(vf, []byte("cli-value-file"), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, code := cli("", "secret", "update", "cli-one", "--value-file", vf); code != 0 || !strings.Contains(out, "v2") {
		t.Fatalf("update from file: %d %s", code, out)
	}
	var info cubicle.Secret
	out, code := cli("", "secret", "get", "cli-one")
	if err := json.Unmarshal([]byte(out), &info); code != 0 || err != nil || info.CurrentVersion != 2 || info.Metadata["who"] != "cli" {
		t.Fatalf("get: %d %s %v", code, out, err)
	}
	if out, code := cli("", "secret", "create", "cli-empty"); code == 0 {
		t.Fatalf("empty stdin accepted: %s", out)
	}
	var listed []cubicle.Secret
	out, code = cli("", "secret", "list", "--json", "--page-size", "2")
	if err := json.Unmarshal([]byte(out), &listed); code != 0 || err != nil || len(listed) != 5 {
		t.Fatalf("list: %d %s %v", code, out, err)
	}
	if out, code := cli("", "secret", "delete", "cli-one"); code != 0 {
		t.Fatalf("delete: %d %s", code, out)
	}
	if out, code := cli("", "secret", "get", "cli-one"); code == 0 || !strings.Contains(out, "cubicle secret list") {
		t.Fatalf("get deleted: %d %s", code, out)
	}

	if err := c.DeleteSecret(ctx, sec.SecretID); err != nil {
		t.Fatal(err)
	}
	if err := c.DeleteSecret(ctx, sec.SecretID); !errors.Is(err, cubicle.ErrSecretNotFound) {
		t.Fatalf("delete twice: %v", err)
	}
	if _, err := c.GetSecret(ctx, "sdk-token"); !errors.Is(err, cubicle.ErrSecretNotFound) || !errors.Is(err, cubicle.ErrNotFound) {
		t.Fatalf("get deleted: %v", err)
	}
}
