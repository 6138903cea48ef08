package integration

import (
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/testenv"
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
	return testenv.DirNames(t, filepath.Join(s.DataDir, "snapshots"))
}

// Snapshots, filesystem-paused sandboxes and deleted-but-used snapshot
// files survive a crash of the server (and a snapshot whose layer mount a
// reboot took down is mounted again); the reconciler then removes files
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
	// On the reflink disk store (serve's default here) the layer is a
	// clone of the sandbox's disk, mounted; a reboot takes the mount
	// down and the node mounts it again when the layer is next used.
	layer := filepath.Join(s.DataDir, "snapshots", sn.SnapshotID)
	if _, err := os.Stat(filepath.Join(layer, "layer-disk")); err != nil {
		t.Fatalf("the snapshot's layer is not a clone of the disk: %v", err)
	}
	if err := syscall.Unmount(filepath.Join(layer, "rootfs"), syscall.MNT_DETACH); err != nil {
		t.Fatal(err)
	}
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

// What a hostile sandbox leaves for its snapshot: a 3 GiB file with no
// blocks (`truncate`, a few bytes written in the middle) in a 1 GiB disk,
// and a directory chain whose full path is past PATH_MAX. The snapshot
// takes a few blocks of the host's disk, not 3 GB; the deep chain does
// not fail it; a sandbox from it sees the file at its apparent size with
// its data, and the deep file. On runc and runsc.
func TestSnapshotSparseAndDeep(t *testing.T) {
	for _, rt := range []string{"runc", "runsc"} {
		t.Run(rt, func(t *testing.T) {
			if rt == "runsc" {
				requireRunsc(t)
			}
			s := startServer(t, "--runtime", rt)
			c := s.create(map[string]any{"templateID": "base"})
			// Two chains of 12 names of 200 bytes, one moved to the bottom
			// of the other: /home/user/x/<12>/y/<12>/f is 4,850 bytes long,
			// and no step names a path past PATH_MAX (nor needs a long
			// getcwd, which bash asserts on under gVisor).
			const chain = `n=$(printf 'd%.0s' $(seq 200)); p=$n; for i in $(seq 11); do p=$p/$n; done; `
			s.mustRun(c, chain+`mkdir -p /home/user/x/$p /home/user/y/$p && echo deep > /home/user/y/$p/f && mv /home/user/y /home/user/x/$p/y`)
			s.mustRun(c, "truncate -s 3G /home/user/sparse && printf mid | dd of=/home/user/sparse bs=1 seek=1073741824 conv=notrunc status=none")
			if out := s.mustRun(c, "df -k --output=size /home/user | tail -1"); atoi(out) > 1<<20 {
				t.Fatalf("the sandbox's disk is %s KiB, want at most 1 GiB", out)
			}

			start := time.Now()
			sn := s.snapshotOf(t, c, "")
			t.Logf("%s snapshot: %d bytes in %v", sn.Kind, sn.SizeBytes, time.Since(start))
			// runsc's also holds the memory image of a 256 MiB sandbox.
			limit := int64(64 << 20)
			if rt == "runsc" {
				limit += 256 << 20
			}
			if sn.SizeBytes <= 0 || sn.SizeBytes > limit {
				t.Errorf("snapshot size %d bytes, want at most %d", sn.SizeBytes, limit)
			}
			var st syscall.Stat_t
			if err := syscall.Stat(filepath.Join(s.DataDir, "snapshots", sn.SnapshotID, "rootfs", "home", "user", "sparse"), &st); err != nil {
				t.Fatal(err)
			}
			if st.Size != 3<<30 || st.Blocks*512 > 1<<20 {
				t.Fatalf("the snapshot's copy of the sparse file: size %d, %d bytes on the host; want 3 GiB and a few blocks", st.Size, st.Blocks*512)
			}

			child := s.create(map[string]any{"templateID": sn.SnapshotID})
			if out := s.mustRun(child, "stat -c %s /home/user/sparse; dd if=/home/user/sparse bs=1 skip=1073741824 count=3 status=none"); out != "3221225472\nmid" {
				t.Errorf("sparse file from the snapshot: %q", out)
			}
			// find walks by descriptor and -execdir reads it as ./f: no path
			// past PATH_MAX is named (a rename out of the snapshot's layer
			// would be EXDEV, and mv's copy then walks full paths).
			if out := s.mustRun(child, `find /home/user/x -name f -printf '%d ' -execdir cat {} \;`); out != "26 deep\n" {
				t.Errorf("deep file from the snapshot: %q", out)
			}
			for _, sb := range []created{c, child} {
				s.do("DELETE", "/sandboxes/"+sb.SandboxID, nil, nil)
			}
		})
	}
}

// A snapshot (or fork) that does not fit is refused with 507 in e2b's
// shape, naming why, and leaves nothing: no snapshot dir, no row, the
// sandbox running as before. Here the snapshot store is a 16 MiB tmpfs and
// the sandbox holds 24 MiB of real data in its 1 GiB disk (its disk size
// is the other bound; see TestSnapshotRefusedLeavesNothing and
// TestCopyLayerLimit). On runc and runsc (whose memory image, written
// first, fits; the layer's copy is what is refused).
func TestSnapshotTooLargeRefused(t *testing.T) {
	for _, rt := range []string{"runc", "runsc"} {
		t.Run(rt, func(t *testing.T) {
			if rt == "runsc" {
				requireRunsc(t)
			}
			snapshotTooLarge(t, rt)
		})
	}
}

func snapshotTooLarge(t *testing.T, rt string) {
	s := newServer(t, nil, "--runtime", rt)
	store := filepath.Join(s.DataDir, "snapshots")
	if err := os.Mkdir(store, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount("tmpfs", store, "tmpfs", 0, "size=16m,mode=0700"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Unmount(store, syscall.MNT_DETACH) }) // before the server's leak check
	s.start()
	c := s.create(map[string]any{"templateID": "base"})
	s.mustRun(c, "head -c 24M /dev/urandom > /home/user/blob && sync")

	for _, req := range []struct {
		path string
		body map[string]any
	}{{"/sandboxes/" + c.SandboxID + "/snapshots", map[string]any{"name": "big"}}, {"/sandboxes/" + c.SandboxID + "/fork", map[string]any{"count": 2}}} {
		st, _, body := s.raw("POST", req.path, req.body)
		var e struct {
			Code      int    `json:"code"`
			Message   string `json:"message"`
			ErrorCode string `json:"error_code"`
		}
		if err := json.Unmarshal(body, &e); err != nil || st != http.StatusInsufficientStorage || e.Code != st ||
			!strings.Contains(e.Message, "free") || e.ErrorCode != "snapshot_too_large" || strings.Contains(e.Message, s.DataDir) {
			t.Fatalf("POST %s: %d %s; want 507 snapshot_too_large naming the free space, no host path", req.path, st, body)
		}
		t.Logf("POST %s: %s", req.path, e.Message)
	}
	if d := snapshotDirs(t, s); len(d) != 0 {
		t.Errorf("left in the store: %v", d)
	}
	var list []snapshotInfo
	if st := s.do("GET", "/snapshots", nil, &list); st != http.StatusOK || len(list) != 0 {
		t.Errorf("snapshots after the refusals: %d %+v", st, list)
	}
	var fs syscall.Statfs_t
	if err := syscall.Statfs(store, &fs); err != nil || fs.Blocks-fs.Bfree > 16 {
		t.Errorf("the store holds %d blocks after the refusals (%v)", fs.Blocks-fs.Bfree, err)
	}
	if out := s.mustRun(c, "wc -c < /home/user/blob"); strings.TrimSpace(out) != "25165824" {
		t.Errorf("the sandbox after the refusals: %q", out)
	}
}
