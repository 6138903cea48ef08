package integration

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strings"
	"syscall"
	"testing"
)

type sizedVolume struct {
	VolumeID string `json:"volumeID"`
	Token    string `json:"token"`
	Size     int64  `json:"size"`
}

// A volume holds its size: a sandbox writing past it gets ENOSPC, the
// volume-content API answers 507, and what was written before is intact,
// across a serve restart too. Sizes above the server maximum are a 400,
// and a team's volume byte quota refuses a create over it with a 429.
func TestVolumeSize(t *testing.T) {
	s := startServer(t, "--volume-size-mb", "32", "--max-volume-size-mb", "64")
	var small sizedVolume
	if st := s.do("POST", "/volumes", map[string]any{"name": "small", "size": 16 << 20}, &small); st != 201 || small.Size != 16<<20 {
		t.Fatalf("create a 16 MiB volume: %d %+v", st, small)
	}
	t.Cleanup(func() { s.do("DELETE", "/volumes/small", nil, nil) })
	var def sizedVolume
	if st := s.do("POST", "/volumes", map[string]any{"name": "dflt"}, &def); st != 201 || def.Size != 32<<20 {
		t.Fatalf("create without a size (as e2b does): %d %+v, want the 32 MiB default", st, def)
	}
	if st := s.do("DELETE", "/volumes/dflt", nil, nil); st != 204 {
		t.Fatalf("delete: %d", st)
	}
	for _, c := range []struct {
		size any
		want string
	}{
		{128 << 20, "above the server maximum of 64 MiB"},
		{0, "must be a positive number of bytes"},
		{1000, "not a whole number of MiB"},
	} {
		e := wantStatus(t, s, "POST", "/volumes", map[string]any{"name": "bad", "size": c.size}, 400)
		if !strings.Contains(e.Message, c.want) {
			t.Fatalf("size %v: %q, want it to say %q", c.size, e.Message, c.want)
		}
	}

	// A sandbox fills it: ENOSPC, and the file written first survives.
	c := s.create(map[string]any{"templateID": "base", "volumeMounts": []any{map[string]any{"name": "small", "path": "/v"}}})
	s.mustRun(c, "echo precious > /v/keep && sync")
	_, stderr, code, err := s.run(c, "dd if=/dev/zero of=/v/fill bs=1M count=32 conv=fsync")
	if err != nil || code == 0 || !strings.Contains(stderr, "No space left on device") {
		t.Fatalf("writing 32 MiB into a 16 MiB volume: code %d err %v stderr %q; want ENOSPC", code, err, stderr)
	}
	if out := s.mustRun(c, "cat /v/keep; df -m /v | tail -1 | awk '{print $2}'"); !strings.HasPrefix(out, "precious\n") {
		t.Fatalf("after the volume filled: %q", out)
	}
	// The sandbox's own disk is another filesystem: it still has room.
	s.mustRun(c, "dd if=/dev/zero of=/tmp/x bs=1M count=4 2>/dev/null && rm /tmp/x")

	// Through the volume-content API: a full volume is a 507 and the failed
	// upload leaves nothing behind; with room again, an upload past the
	// size is still a 507, and a small one works.
	put := func(path string, n int) (int, string) {
		return contentReq(t, s, "PUT", "/volumecontent/"+small.VolumeID+"/file?path="+path+"&force=true", small.Token, bytes.NewReader(make([]byte, n)))
	}
	if st, body := put("/more", 1<<20); st != http.StatusInsufficientStorage || !strings.Contains(body, "no space left") {
		t.Fatalf("upload into a full volume: %d %s, want 507", st, body)
	}
	s.mustRun(c, "rm /v/fill")
	if st, body := put("/big", 20<<20); st != http.StatusInsufficientStorage {
		t.Fatalf("20 MiB upload into a 16 MiB volume: %d %s, want 507", st, body)
	}
	var e map[string]any
	st, body := put("/big", 20<<20)
	if json.Unmarshal([]byte(body), &e) != nil || e["message"] == nil || e["code"] == nil || st != 507 {
		t.Fatalf("507 body is not {code, message}: %s", body)
	}
	if st, _ := put("/ok", 1<<20); st != 201 {
		t.Fatalf("1 MiB upload with room: %d", st)
	}
	if out := s.mustRun(c, "ls -A /v | sort | tr '\\n' ' '; cat /v/keep"); out != "keep ok precious\n" {
		t.Fatalf("volume after the failed uploads: %q, want keep and ok only", out)
	}
	s.kill(t, c.SandboxID)

	// Across a serve restart the image is mounted again on the next attach.
	s.stop(syscall.SIGTERM)
	s.start()
	c2 := s.create(map[string]any{"templateID": "base", "volumeMounts": []any{map[string]any{"name": "small", "path": "/v"}}})
	if out := s.mustRun(c2, "cat /v/keep"); out != "precious\n" {
		t.Fatalf("after a restart: %q", out)
	}
	if _, stderr, code, _ := s.run(c2, "dd if=/dev/zero of=/v/fill bs=1M count=32 conv=fsync"); code == 0 || !strings.Contains(stderr, "No space left on device") {
		t.Fatalf("after a restart the size is not enforced: code %d %q", code, stderr)
	}
	s.kill(t, c2.SandboxID)

	// The team's byte quota.
	s.cli(t, "team", "create", "vq", "--max-volume-mb", "40")
	q := s.as(t, s.cli(t, "apikey", "create", "--team", "vq"))
	var first sizedVolume
	if st := q.do("POST", "/volumes", map[string]any{"name": "a"}, &first); st != 201 {
		t.Fatalf("32 MiB within a 40 MiB quota: %d", st)
	}
	t.Cleanup(func() { q.do("DELETE", "/volumes/"+first.VolumeID, nil, nil) })
	st, h, raw := q.raw("POST", "/volumes", map[string]any{"name": "b", "size": 16 << 20})
	var qe apiErr
	json.Unmarshal(raw, &qe)
	if st != 429 || qe.Code != 429 || qe.Message != "team quota exceeded: volume MiB (40)" || h.Get("Retry-After") == "" {
		t.Fatalf("48 MiB over a 40 MiB quota: want 429 with Retry-After, got %d %s", st, raw)
	}
	if st := q.do("POST", "/volumes", map[string]any{"name": "c", "size": 8 << 20}, nil); st != 201 {
		t.Fatalf("40 MiB within a 40 MiB quota: %d", st)
	}
	q.do("DELETE", "/volumes/c", nil, nil)
}

// With a free-space reserve no create can fit, sandbox and volume creates
// are refused with 507 and the reason, and leave nothing behind.
func TestDiskReserve(t *testing.T) {
	s := startServer(t, "--disk-reserve", "100%")
	for _, c := range []struct {
		path string
		body map[string]any
		what string
	}{
		{"/sandboxes", map[string]any{"templateID": "base"}, "a 1024 MiB sandbox disk"},
		{"/volumes", map[string]any{"name": "v"}, "a 1024 MiB volume"},
	} {
		e := wantStatus(t, s, "POST", c.path, c.body, http.StatusInsufficientStorage)
		if !strings.Contains(e.Message, "cannot hold "+c.what) || !strings.Contains(e.Message, "--disk-reserve") {
			t.Fatalf("POST %s: %q, want the reason", c.path, e.Message)
		}
	}
	if ids := listedSandboxIDs(t, s, "/v2/sandboxes"); len(ids) != 0 {
		t.Fatalf("a refused create left sandboxes: %v", ids)
	}
	var vs []any
	if st := s.do("GET", "/volumes", nil, &vs); st != 200 || len(vs) != 0 {
		t.Fatalf("a refused create left volumes: %d %v", st, vs)
	}
}
