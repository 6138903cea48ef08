package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
)

// snapFake answers the snapshot routes and records "METHOD URI BODY".
type snapFake struct {
	mu      sync.Mutex
	calls   []string
	deleted map[string]bool
}

func (f *snapFake) seen(t *testing.T, want string) {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, c := range f.calls {
		if c == want {
			return
		}
	}
	t.Errorf("no call %q in %q", want, f.calls)
}

func newSnapFake(t *testing.T) *snapFake {
	f := &snapFake{deleted: map[string]bool{}}
	snap := func(id, sb string) string {
		return fmt.Sprintf(`{"snapshotID":%q,"names":["n-%s"],"sandboxID":%q,"kind":"filesystem","sizeBytes":2097152,"createdAt":"2025-01-02T03:04:05Z","templateID":"base"}`, id, id, sb)
	}
	fail := func(w http.ResponseWriter, st int, code, msg string) {
		w.WriteHeader(st)
		fmt.Fprintf(w, `{"code":%d,"message":%q,"error_code":%q}`, st, msg, code)
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		f.mu.Lock()
		defer f.mu.Unlock()
		f.calls = append(f.calls, strings.TrimSpace(r.Method+" "+r.URL.RequestURI()+" "+string(body)))
		switch {
		case r.Method == "POST" && r.URL.Path == "/sandboxes/sb1/snapshots":
			w.WriteHeader(201)
			fmt.Fprint(w, snap("snap_1", "sb1"))
		case r.Method == "POST" && r.URL.Path == "/sandboxes/sb1/fork":
			w.WriteHeader(201)
			fmt.Fprint(w, `[{"sandbox":{"sandboxID":"f1","templateID":"snap_f","envdAccessToken":"t"}},{"error":{"code":429,"message":"team sandbox limit reached"}}]`)
		case r.Method == "POST" && r.URL.Path == "/sandboxes/sb2/fork":
			w.WriteHeader(201)
			fmt.Fprint(w, `[{"sandbox":{"sandboxID":"f1","templateID":"snap_f"}},{"sandbox":{"sandboxID":"f2","templateID":"snap_f"}}]`)
		case r.Method == "POST" && r.URL.Path == "/sandboxes/sb1/rollback":
			fmt.Fprint(w, `{"sandboxID":"sb1","snapshotID":"snap_1","status":"success"}`)
		case r.Method == "POST" && r.URL.Path == "/sandboxes/sb1/pause":
			w.WriteHeader(204)
		case r.Method == "GET" && r.URL.Path == "/snapshots" && r.URL.Query().Get("nextToken") == "":
			w.Header().Set("X-Next-Token", "p2")
			fmt.Fprint(w, "["+snap("snap_2", "sb1")+"]")
		case r.Method == "GET" && r.URL.Path == "/snapshots":
			fmt.Fprint(w, "["+snap("snap_1", "sb1")+"]")
		case r.Method == "GET" && r.URL.Path == "/snapshots/snap_1":
			fmt.Fprint(w, snap("snap_1", "sb1"))
		case r.Method == "DELETE" && r.URL.Path == "/templates/snap_1" && !f.deleted["snap_1"]:
			f.deleted["snap_1"] = true
			w.WriteHeader(204)
		default:
			fail(w, 404, "snapshot_not_found", "not found")
		}
	}))
	t.Cleanup(srv.Close)
	t.Setenv("CUBICLE_API_URL", srv.URL)
	t.Setenv("CUBICLE_API_KEY", "k")
	return f
}

func TestSandboxSnapshotForkRollbackPause(t *testing.T) {
	f := newSnapFake(t)
	out, err := run(t, "sandbox", "snapshot", "sb1", "--name", "n-snap_1")
	if err != nil || strings.TrimSpace(out) != "snap_1" {
		t.Fatalf("snapshot: %q %v", out, err)
	}
	f.seen(t, `POST /sandboxes/sb1/snapshots {"name":"n-snap_1"}`)
	out, err = run(t, "sandbox", "snapshot", "sb1", "--json")
	var info map[string]any
	if err != nil || json.Unmarshal([]byte(out), &info) != nil || info["snapshotID"] != "snap_1" || info["kind"] != "filesystem" {
		t.Fatalf("snapshot --json: %q %v", out, err)
	}
	f.seen(t, `POST /sandboxes/sb1/snapshots {}`)

	out, err = run(t, "sandbox", "fork", "sb2", "--count", "2", "--timeout", "1m")
	if err != nil || out != "f1\nf2\n" {
		t.Fatalf("fork: %q %v", out, err)
	}
	f.seen(t, `POST /sandboxes/sb2/fork {"count":2,"timeout":60}`)
	// A failed fork is reported and fails the command after the others print.
	out, err = run(t, "sandbox", "fork", "sb1", "--count", "2")
	if err == nil || !strings.Contains(err.Error(), "1 of 2 forks failed") || !strings.Contains(out, "f1\n") || !strings.Contains(out, "fork 2:") || !strings.Contains(out, "limit reached") {
		t.Fatalf("partial fork: %q %v", out, err)
	}
	out, err = run(t, "sandbox", "fork", "sb1", "--count", "2", "--json")
	var forks []map[string]any
	if err == nil || json.Unmarshal([]byte(out), &forks) != nil || len(forks) != 2 || forks[0]["sandboxID"] != "f1" || forks[1]["code"] != 429.0 {
		t.Fatalf("fork --json: %q %v", out, err)
	}
	if _, err := run(t, "sandbox", "fork", "sb1", "--count", "0"); err == nil {
		t.Fatal("--count 0 accepted")
	}

	if out, err := run(t, "sandbox", "rollback", "sb1", "snap_1"); err != nil || !strings.Contains(out, "sb1 rolled back to snap_1") {
		t.Fatalf("rollback: %q %v", out, err)
	}
	f.seen(t, `POST /sandboxes/sb1/rollback {"snapshotID":"snap_1"}`)
	if _, err := run(t, "sandbox", "rollback", "sb1"); err == nil {
		t.Fatal("rollback without SNAPSHOT accepted")
	}

	if out, err := run(t, "sandbox", "pause", "sb1", "--memory=false"); err != nil || !strings.Contains(out, "files only") {
		t.Fatalf("pause --memory=false: %q %v", out, err)
	}
	f.seen(t, `POST /sandboxes/sb1/pause {"memory":false}`)
	if out, err := run(t, "sandbox", "pause", "sb1"); err != nil || out != "sb1 paused\n" {
		t.Fatalf("pause: %q %v", out, err)
	}
	f.seen(t, `POST /sandboxes/sb1/pause {}`)
}

func TestSnapshotListGetDelete(t *testing.T) {
	f := newSnapFake(t)
	out, err := run(t, "snapshot", "list", "--sandbox", "sb1", "--limit", "1")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], "ID") || !strings.Contains(lines[1], "snap_2") || !strings.Contains(lines[1], "2.0 MiB") ||
		!strings.Contains(lines[1], "filesystem") || !strings.Contains(lines[2], "--next-token p2") {
		t.Fatalf("one page:\n%s", out)
	}
	f.seen(t, "GET /snapshots?limit=1&sandboxID=sb1")
	out, err = run(t, "snapshot", "list", "--sandbox", "sb1", "--limit", "1", "--all", "--json")
	var arr []map[string]any
	if err != nil || json.Unmarshal([]byte(out), &arr) != nil || len(arr) != 2 || arr[0]["snapshotID"] != "snap_2" || arr[1]["snapshotID"] != "snap_1" {
		t.Fatalf("--all --json: %q %v", out, err)
	}
	f.seen(t, "GET /snapshots?limit=1&nextToken=p2&sandboxID=sb1")
	if out, err := run(t, "snapshot", "list", "--next-token", "p2"); err != nil || !strings.Contains(out, "snap_1") || strings.Contains(out, "snap_2") {
		t.Fatalf("--next-token: %q %v", out, err)
	}

	if out, err := run(t, "snapshot", "get", "snap_1"); err != nil || !strings.Contains(out, `"snapshotID": "snap_1"`) {
		t.Fatalf("get: %q %v", out, err)
	}
	if _, err := run(t, "snapshot", "get", "nope"); err == nil {
		t.Fatal("get of a missing snapshot succeeded")
	}

	out, err = run(t, "snapshot", "delete", "snap_1", "snap_1")
	if err == nil || out != "snap_1\n" || !strings.Contains(err.Error(), "no such snapshot: snap_1") {
		t.Fatalf("delete twice: %q %v", out, err)
	}
	f.seen(t, "DELETE /templates/snap_1")
}
