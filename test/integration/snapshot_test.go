package integration

import (
	"net/http"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

type snapshotInfo struct {
	SnapshotID string   `json:"snapshotID"`
	Names      []string `json:"names"`
	Kind       string   `json:"kind"`
	SizeBytes  int64    `json:"sizeBytes"`
	SandboxID  string   `json:"sandboxID"`
}

func (s *server) snapshotOf(t *testing.T, c created, name string) snapshotInfo {
	t.Helper()
	var sn snapshotInfo
	body := map[string]any{}
	if name != "" {
		body["name"] = name
	}
	if st := s.do("POST", "/sandboxes/"+c.SandboxID+"/snapshots", body, &sn); st != http.StatusCreated {
		t.Fatalf("snapshot %s: %d; logs:\n%s", c.SandboxID, st, s.logs)
	}
	return sn
}

func snapshotDirs(t *testing.T, s *server) []string {
	t.Helper()
	ents, err := os.ReadDir(filepath.Join(s.DataDir, "snapshots"))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out
}

// Snapshots, filesystem-paused sandboxes and deleted-but-used snapshot
// files survive a crash of the server; the reconciler then removes files
// no row references and a deleted snapshot's once its last user is gone.
func TestSnapshotRestart(t *testing.T) {
	s := startServer(t)
	src := s.create(map[string]any{"templateID": "base"})
	s.mustRun(src, "echo kept > /home/user/state")
	sn := s.snapshotOf(t, src, "before-crash")
	if sn.Kind != "filesystem" || sn.SizeBytes <= 0 {
		t.Fatalf("snapshot: %+v", sn)
	}
	// A sandbox from a snapshot that is then deleted: its files must stay.
	gone := s.snapshotOf(t, src, "")
	child := s.create(map[string]any{"templateID": gone.SnapshotID})
	if st := s.do("DELETE", "/templates/"+gone.SnapshotID, nil, nil); st != http.StatusNoContent {
		t.Fatalf("delete snapshot: %d", st)
	}
	// A filesystem pause.
	fsPaused := s.create(map[string]any{"templateID": "base"})
	s.mustRun(fsPaused, "echo mine > /home/user/fs")
	if st := s.do("POST", "/sandboxes/"+fsPaused.SandboxID+"/pause", map[string]bool{"memory": false}, nil); st != http.StatusNoContent {
		t.Fatalf("filesystem pause: %d", st)
	}

	s.stop(syscall.SIGKILL)
	// Left by a crash between a node snapshot and its row.
	orphan := filepath.Join(s.DataDir, "snapshots", "snap_00000000deadbeef")
	if err := os.MkdirAll(filepath.Join(orphan, "rootfs"), 0o700); err != nil {
		t.Fatal(err)
	}
	s.start()

	var list []snapshotInfo
	if st := s.do("GET", "/snapshots", nil, &list); st != 200 || len(list) != 1 || list[0].SnapshotID != sn.SnapshotID || list[0].Names[0] != "before-crash" {
		t.Fatalf("snapshots after restart: %d %+v", st, list)
	}
	again := s.create(map[string]any{"templateID": "before-crash"})
	if out := s.mustRun(again, "cat /home/user/state"); out != "kept\n" {
		t.Fatalf("from snapshot after restart: %q", out)
	}
	if out := s.mustRun(child, "cat /home/user/state"); out != "kept\n" {
		t.Fatalf("child of a deleted snapshot after restart: %q", out)
	}
	var detail map[string]any
	if s.do("GET", "/sandboxes/"+fsPaused.SandboxID, nil, &detail); detail["state"] != "paused" {
		t.Fatalf("filesystem-paused sandbox after restart: %v", detail["state"])
	}
	if st := s.do("POST", "/v2/sandboxes/"+fsPaused.SandboxID+"/connect", map[string]any{}, nil); st != http.StatusCreated {
		t.Fatalf("resume after restart: %d; logs:\n%s", st, s.logs)
	}
	if out := s.mustRun(fsPaused, "cat /home/user/fs"); out != "mine\n" {
		t.Fatalf("filesystem pause lost files: %q", out)
	}

	// The orphan goes at once (the first reconcile); the deleted snapshot
	// only after its last sandbox.
	waitDirs := func(want int) []string {
		t.Helper()
		deadline := time.Now().Add(45 * time.Second)
		for {
			d := snapshotDirs(t, s)
			if len(d) == want || time.Now().After(deadline) {
				return d
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	if d := waitDirs(2); len(d) != 2 {
		t.Fatalf("snapshot dirs = %v, want the live and the in-use deleted one", d)
	}
	// One snapshot exists; the bytes count the in-use deleted one too.
	s.requireMetrics(t, "cubicle_snapshots 1\n", "cubicle_snapshot_bytes ")
	s.do("DELETE", "/sandboxes/"+child.SandboxID, nil, nil)
	if d := waitDirs(1); len(d) != 1 || d[0] != sn.SnapshotID {
		t.Fatalf("snapshot dirs = %v, want only %s", d, sn.SnapshotID)
	}
	for _, c := range []created{src, again, fsPaused} {
		s.do("DELETE", "/sandboxes/"+c.SandboxID, nil, nil)
	}
	s.do("DELETE", "/templates/"+sn.SnapshotID, nil, nil)
	if d := waitDirs(0); len(d) != 0 {
		t.Fatalf("snapshot dirs left: %v", d)
	}
}

// A team's snapshot limit answers 429 in e2b's shape; a template that
// snapshots stack on cannot be deleted under them.
func TestSnapshotLimitsAndGuards(t *testing.T) {
	s := startServer(t, "--max-snapshots-per-team", "2")
	tpl, st, logs := s.buildTemplate(t, "snapbase", map[string]any{"fromTemplate": "base"})
	if st.Status != "ready" {
		t.Fatalf("build: %+v %v", st, logs)
	}
	c := s.create(map[string]any{"templateID": "snapbase"})
	a := s.snapshotOf(t, c, "")
	b := s.snapshotOf(t, c, "")
	errShape(t, s, "POST", "/sandboxes/"+c.SandboxID+"/snapshots", map[string]any{}, http.StatusTooManyRequests)
	// Forks' internal snapshots are not held to it.
	var forks []map[string]any
	if code := s.do("POST", "/sandboxes/"+c.SandboxID+"/fork", map[string]any{"count": 1}, &forks); code != http.StatusCreated || len(forks) != 1 || forks[0]["sandbox"] == nil {
		t.Fatalf("fork at the snapshot limit: %d %v", code, forks)
	}
	s.do("DELETE", "/sandboxes/"+c.SandboxID, nil, nil)
	s.do("DELETE", "/sandboxes/"+forks[0]["sandbox"].(map[string]any)["sandboxID"].(string), nil, nil)
	errShape(t, s, "DELETE", "/templates/"+tpl.TemplateID, nil, http.StatusConflict)
	for _, sn := range []snapshotInfo{a, b} {
		if code := s.do("DELETE", "/templates/"+sn.SnapshotID+":default", nil, nil); code != http.StatusNoContent {
			t.Fatalf("delete %s: %d", sn.SnapshotID, code)
		}
	}
	errShape(t, s, "DELETE", "/snapshots/"+a.SnapshotID, nil, http.StatusNotFound)
	if code := s.do("DELETE", "/templates/"+tpl.TemplateID, nil, nil); code != http.StatusNoContent {
		t.Fatalf("delete template once its snapshots are gone: %d", code)
	}
}
