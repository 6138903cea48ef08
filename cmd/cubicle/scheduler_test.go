package main

import (
	"encoding/json"
	"strings"
	"testing"
)

// `cubicle scheduler policy`: set compiles first (a bad expression is
// refused with the compiler's message and nothing is stored), list shows
// what is stored, delete removes it and says when there is nothing.
func TestSchedulerPolicyCommands(t *testing.T) {
	dir := t.TempDir()
	out, err := run(t, "team", "create", "--data-dir", dir, "acme")
	if err != nil {
		t.Fatal(err)
	}
	teamID := strings.TrimSpace(out)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"template", "base", "--filter", "node.cpu"}, "evaluates to double, want bool"},
		{[]string{"template", "base", "--score", "nodes.warm"}, "undeclared reference to 'nodes'"},
		{[]string{"template", "base"}, "needs a filter or a score"},
		{[]string{"team", "t_missing", "--filter", "true"}, `no team "t_missing"`},
		{[]string{"cluster", "x", "--filter", "true"}, "want team or template"},
	} {
		_, err := run(t, append([]string{"scheduler", "policy", "set", "--data-dir", dir}, c.args...)...)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Fatalf("set %v: %v, want an error naming %q", c.args, err, c.want)
		}
	}
	if out, err := run(t, "scheduler", "policy", "list", "--data-dir", dir); err != nil || strings.Count(out, "\n") != 1 {
		t.Fatalf("refused policies were stored: %q %v", out, err)
	}
	if _, err := run(t, "scheduler", "policy", "set", "--data-dir", dir, "template", "base", "--filter", `node.labels["zone"] == "a"`); err != nil {
		t.Fatal(err)
	}
	if _, err := run(t, "scheduler", "policy", "set", "--data-dir", dir, "team", teamID, "--score", "node.free_cpu"); err != nil {
		t.Fatal(err)
	}
	out, err = run(t, "scheduler", "policy", "list", "--data-dir", dir, "--json")
	if err != nil {
		t.Fatal(err)
	}
	var rows []map[string]any
	if err := json.Unmarshal([]byte(out), &rows); err != nil || len(rows) != 2 || rows[0]["target"] != teamID ||
		rows[0]["score"] != "node.free_cpu" || rows[1]["filter"] != `node.labels["zone"] == "a"` {
		t.Fatalf("list --json: %s %v", out, err)
	}
	if _, err := run(t, "scheduler", "policy", "delete", "--data-dir", dir, "template", "base"); err != nil {
		t.Fatal(err)
	}
	if _, err := run(t, "scheduler", "policy", "delete", "--data-dir", dir, "template", "base"); err == nil || !strings.Contains(err.Error(), "no placement policy") {
		t.Fatalf("second delete: %v", err)
	}
	out, err = run(t, "scheduler", "policy", "list", "--data-dir", dir)
	if err != nil || !strings.Contains(out, teamID) || strings.Contains(out, "base") {
		t.Fatalf("list after delete: %q %v", out, err)
	}
}

// serve refuses an unknown --schedule before it touches the host.
func TestServeRefusesUnknownSchedule(t *testing.T) {
	_, err := run(t, "serve", "--data-dir", t.TempDir(), "--schedule", "random")
	if err == nil || !strings.Contains(err.Error(), "--schedule") || !strings.Contains(err.Error(), `"binpack"`) {
		t.Fatalf("serve --schedule random: %v", err)
	}
}
