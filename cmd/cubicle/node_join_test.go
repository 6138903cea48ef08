package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cubicle-dev/cubicle/internal/secret"
)

// TestNodeTokenCommands: create refuses to make the cluster CA under a
// secrets key of its own (no replica could open it); with the control
// plane's key it makes the CA once and prints the same pin every time;
// list shows tokens without their secrets; revoke removes them.
func TestNodeTokenCommands(t *testing.T) {
	dir := t.TempDir()
	keyPath := filepath.Join(dir, "secrets.key")
	if _, err := run(t, "node", "token", "create", "--data-dir", dir); err == nil || !strings.Contains(err.Error(), "does not exist") {
		t.Fatalf("without the secrets key: %v", err)
	}
	if _, err := os.Stat(keyPath); !os.IsNotExist(err) {
		t.Fatalf("token create made a secrets key: %v", err)
	}
	if _, err := secret.LoadOrCreateKey(keyPath); err != nil {
		t.Fatal(err)
	}
	field := func(out, name string) string {
		for _, l := range strings.Split(out, "\n") {
			if v, ok := strings.CutPrefix(l, name+": "); ok {
				return v
			}
		}
		t.Fatalf("no %s in:\n%s", name, out)
		return ""
	}
	out1, err := run(t, "node", "token", "create", "--data-dir", dir, "--ttl", "30m", "--label", "zone=a", "--label", "gpu=yes")
	if err != nil {
		t.Fatal(err)
	}
	os.Remove(keyPath) // the CA exists now: the pin needs no key
	out2, err := run(t, "node", "token", "create", "--data-dir", dir)
	if err != nil {
		t.Fatal(err)
	}
	if p := field(out1, "ca-pin"); !strings.HasPrefix(p, "sha256:") || p != field(out2, "ca-pin") {
		t.Fatalf("pins %q and %q", p, field(out2, "ca-pin"))
	}
	tok := field(out1, "token")
	id, secretPart, _ := strings.Cut(tok, ".")
	list, err := run(t, "node", "token", "list", "--data-dir", dir)
	if err != nil || !strings.Contains(list, id) || !strings.Contains(list, "gpu=yes,zone=a") || !strings.Contains(list, "unused") || strings.Contains(list, secretPart) {
		t.Fatalf("list: %v\n%s", err, list)
	}
	if _, err := run(t, "node", "token", "revoke", "--data-dir", dir, tok); err != nil {
		t.Fatal(err)
	}
	if list, _ := run(t, "node", "token", "list", "--data-dir", dir); strings.Contains(list, id) {
		t.Fatalf("revoked token still listed:\n%s", list)
	}
	if _, err := run(t, "node", "token", "revoke", "--data-dir", dir, id); err == nil || !strings.Contains(err.Error(), "no join token") {
		t.Fatalf("revoking twice: %v", err)
	}
	for _, bad := range [][]string{{"--ttl", "0s"}, {"--ttl", "200h"}, {"--label", "novalue"}, {"--label", "k=-v"}, {"--label", "k=a", "--label", "k=b"}} {
		if _, err := run(t, append([]string{"node", "token", "create", "--data-dir", dir}, bad...)...); err == nil {
			t.Errorf("%v accepted", bad)
		}
	}
	if _, err := run(t, "node", "join", "--control-plane", "http://x", "--ca-pin", "sha256:00", "--node-id", "n", "--data-dir", t.TempDir()); err == nil || !strings.Contains(err.Error(), "--token") {
		t.Fatalf("join without a token: %v", err)
	}
}
