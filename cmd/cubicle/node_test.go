package main

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/lease"
	"github.com/cubicle-dev/cubicle/internal/store"
	"github.com/cubicle-dev/cubicle/internal/store/postgres/pgtest"
	"github.com/cubicle-dev/cubicle/internal/store/sqlite"
)

// seedNodes registers two nodes in a data dir's SQLite store, with one
// live and one killed sandbox on "local" and a reservation on "n2".
func seedNodes(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	st, err := sqlite.Open(filepath.Join(dir, "cubicle.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ctx := context.Background()
	for _, n := range []*store.Node{
		{ID: "local", Runtime: "runc", Capacity: store.Capacity{MilliCPU: 2000, MemoryMiB: 4096}},
		{ID: "n2", Address: "10.0.0.7:7443", Runtime: "runsc", Capacity: store.Capacity{MilliCPU: 8000, MemoryMiB: 16384, DiskMiB: 50000},
			Labels: map[string]string{"zone": "b"}, Accelerators: `[{"id":"gpu0"}]`, HeartbeatAt: time.Now().Add(-time.Minute)},
	} {
		if err := st.RegisterNode(ctx, n); err != nil {
			t.Fatal(err)
		}
	}
	now := time.Now()
	for i, state := range []store.SandboxState{store.StateRunning, store.StateKilled} {
		sb := &store.Sandbox{ID: strings.Repeat(string(rune('a'+i)), 20), TemplateID: "base", State: state, Node: "local", StartedAt: now, EndAt: now.Add(time.Hour)}
		if err := st.CreateSandbox(ctx, sb); err != nil {
			t.Fatal(err)
		}
	}
	if err := st.SetAllocatable(ctx, "n2", store.Capacity{MilliCPU: 8000, MemoryMiB: 16384}); err != nil {
		t.Fatal(err)
	}
	if err := st.ReserveCapacity(ctx, "sb-x", "n2", store.Capacity{MilliCPU: 1500, MemoryMiB: 2048}, func(_, _ store.Capacity) error { return nil }); err != nil {
		t.Fatal(err)
	}
	return dir
}

func TestNodeListTableAndJSON(t *testing.T) {
	dir := seedNodes(t)
	out, err := run(t, "node", "list", "--data-dir", dir)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], "ID") {
		t.Fatalf("node list:\n%s", out)
	}
	for _, want := range []string{"local", "(in-process)", "runc", "4096", "ready"} {
		if !strings.Contains(lines[1], want) {
			t.Errorf("local's line lacks %q: %s", want, lines[1])
		}
	}
	for _, want := range []string{"n2", "10.0.0.7:7443", "runsc", "8", "16384", "50000", "1.5/2048", "1m0s ago"} {
		if !strings.Contains(lines[2], want) {
			t.Errorf("n2's line lacks %q: %s", want, lines[2])
		}
	}
	out, err = run(t, "node", "list", "--json", "--data-dir", dir)
	if err != nil {
		t.Fatal(err)
	}
	var rows []nodeRow
	if err := json.Unmarshal([]byte(out), &rows); err != nil {
		t.Fatalf("--json: %v\n%s", err, out)
	}
	if len(rows) != 2 || rows[0].ID != "local" || rows[0].Sandboxes != 1 || rows[0].Capacity.MilliCPU != 2000 ||
		rows[1].Committed != (store.Capacity{MilliCPU: 1500, MemoryMiB: 2048}) || rows[1].Labels["zone"] != "b" ||
		compact(t, rows[1].Accelerators) != `[{"id":"gpu0"}]` || rows[1].HeartbeatAge < 59 {
		t.Fatalf("--json rows: %+v", rows)
	}
}

func TestNodeCordonDrainUncordonForget(t *testing.T) {
	dir := seedNodes(t)
	status := func(id string) string {
		t.Helper()
		out, err := run(t, "node", "list", "--json", "--data-dir", dir)
		if err != nil {
			t.Fatal(err)
		}
		var rows []nodeRow
		if err := json.Unmarshal([]byte(out), &rows); err != nil {
			t.Fatal(err)
		}
		for _, r := range rows {
			if r.ID == id {
				return map[[2]bool]string{{false, false}: "ready", {true, false}: "cordoned", {true, true}: "draining"}[[2]bool{r.Cordoned, r.Draining}]
			}
		}
		return "absent"
	}
	for _, step := range []struct{ cmd, want string }{
		{"cordon", "cordoned"}, {"drain", "draining"}, {"cordon", "draining"}, {"uncordon", "ready"},
	} {
		out, err := run(t, "node", step.cmd, "n2", "--data-dir", dir)
		if err != nil || !strings.Contains(out, "node n2") {
			t.Fatalf("node %s n2: %q %v", step.cmd, out, err)
		}
		if got := status("n2"); got != step.want {
			t.Fatalf("after %s: %s, want %s", step.cmd, got, step.want)
		}
	}
	for _, cmd := range []string{"cordon", "uncordon", "drain", "forget"} {
		_, err := run(t, "node", cmd, "ghost", "--data-dir", dir)
		if err == nil || !strings.Contains(err.Error(), `no node "ghost" is registered`) {
			t.Fatalf("node %s of an unknown node: %v", cmd, err)
		}
	}
	if _, err := run(t, "node", "cordon", "--data-dir", dir); err == nil {
		t.Fatal("cordon without an ID succeeded")
	}
	_, err := run(t, "node", "forget", "local", "--data-dir", dir)
	if err == nil || !strings.Contains(err.Error(), "still holds 1 live sandboxes") {
		t.Fatalf("forget a node with a live sandbox: %v", err)
	}
	if got := status("local"); got != "ready" {
		t.Fatalf("a refused forget changed local: %s", got)
	}
	if out, err := run(t, "node", "forget", "n2", "--data-dir", dir); err != nil || !strings.Contains(out, "forgotten") {
		t.Fatalf("forget n2: %q %v", out, err)
	}
	if got := status("n2"); got != "absent" {
		t.Fatalf("n2 after forget: %s", got)
	}
}

func compact(t *testing.T, b []byte) string {
	t.Helper()
	var out bytes.Buffer
	if err := json.Compact(&out, b); err != nil {
		t.Fatal(err)
	}
	return out.String()
}

// `node forget` declares a node dead. On PostgreSQL an embedded serve
// holds its node ID's claim (lease.Claim, "node/<id>") for its whole
// life: while it does, the node is alive, and forget is refused naming
// that (a forget would drop the volume references of its killed
// sandboxes that it still holds, and free its ID for a join). Once the
// serve is gone, the claim is free and forget goes ahead.
func TestNodeForgetRefusesAClaimedEmbeddedNode(t *testing.T) {
	ctx := context.Background()
	dsn, err := pgtest.StartT(t).NewDatabase(ctx)
	if err != nil {
		t.Fatal(err)
	}
	st, err := openStore(ctx, "", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if err := st.RegisterNode(ctx, &store.Node{ID: "local", Runtime: "runc", Capacity: store.Capacity{MilliCPU: 2000, MemoryMiB: 4096}}); err != nil {
		t.Fatal(err)
	}
	pl, err := lease.NewPostgres(dsn, time.Second, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	claim, err := pl.Claim(ctx, "node/local")
	if err != nil {
		t.Fatal(err)
	}
	_, err = run(t, "node", "forget", "local", "--store", dsn)
	if err == nil || !strings.Contains(err.Error(), "runs node local") {
		claim.Close()
		t.Fatalf("forget a node an embedded serve runs: %v", err)
	}
	if _, err := st.GetNode(ctx, "local"); err != nil {
		t.Fatalf("a refused forget removed the row: %v", err)
	}
	claim.Close()
	if out, err := run(t, "node", "forget", "local", "--store", dsn); err != nil || !strings.Contains(out, "forgotten") {
		t.Fatalf("forget once the serve is gone: %q %v", out, err)
	}
	// The forget released the claim it took: a serve starts again.
	again, err := pl.Claim(ctx, "node/local")
	if err != nil {
		t.Fatalf("claim after the forget: %v", err)
	}
	again.Close()
}

// On SQLite the claim is a file lock in the data dir (serve takes it for
// its embedded node): held, forget is refused and changes nothing; free,
// it goes ahead.
func TestNodeForgetRefusesAClaimedEmbeddedNodeOnSQLite(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	st, err := openStore(ctx, dir, "")
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if err := st.RegisterNode(ctx, &store.Node{ID: "local", Runtime: "runc", Capacity: store.Capacity{MilliCPU: 2000, MemoryMiB: 4096}}); err != nil {
		t.Fatal(err)
	}
	release, err := lease.ClaimFile(nodeClaimFile(dir, "local"), nodeClaim("local"))
	if err != nil {
		t.Fatal(err)
	}
	_, err = run(t, "node", "forget", "local", "--data-dir", dir)
	if err == nil || !strings.Contains(err.Error(), "runs node local") {
		release()
		t.Fatalf("forget a node an embedded serve runs: %v", err)
	}
	if _, err := st.GetNode(ctx, "local"); err != nil {
		t.Fatalf("a refused forget removed the row: %v", err)
	}
	release()
	if out, err := run(t, "node", "forget", "local", "--data-dir", dir); err != nil || !strings.Contains(out, "forgotten") {
		t.Fatalf("forget once the serve is gone: %q %v", out, err)
	}
	again, err := lease.ClaimFile(nodeClaimFile(dir, "local"), nodeClaim("local"))
	if err != nil {
		t.Fatalf("claim after the forget: %v", err)
	}
	again()
}
