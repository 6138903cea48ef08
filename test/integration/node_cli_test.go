package integration

import (
	"encoding/json"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// The in-process node registers itself at serve start; `cubicle node
// cordon local` makes creates answer 429 naming the cordon, and
// `uncordon` lets them through again.
func TestNodeCordonRefusesCreates(t *testing.T) {
	s := startServer(t)
	cli := func(args ...string) string {
		t.Helper()
		out, err := exec.Command(filepath.Join(binDir, "cubicle"), append(args, "--data-dir", s.DataDir)...).CombinedOutput()
		if err != nil {
			t.Fatalf("cubicle %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	var rows []struct {
		ID       string `json:"id"`
		Runtime  string `json:"runtime"`
		Cordoned bool   `json:"cordoned"`
		Capacity struct {
			MilliCPU  int64 `json:"milliCPU"`
			MemoryMiB int64 `json:"memoryMiB"`
		} `json:"capacity"`
	}
	if err := json.Unmarshal([]byte(cli("node", "list", "--json")), &rows); err != nil {
		t.Fatal(err)
	}
	if len(rows) != 1 || rows[0].ID != "local" || rows[0].Runtime == "" || rows[0].Capacity.MilliCPU < 1000 || rows[0].Capacity.MemoryMiB < 256 {
		t.Fatalf("registered nodes: %+v", rows)
	}
	cli("node", "cordon", "local")
	st, _, body := s.raw("POST", "/v2/sandboxes", map[string]any{"templateID": "base"})
	var e struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	}
	if err := json.Unmarshal(body, &e); err != nil || st != http.StatusTooManyRequests || e.Code != http.StatusTooManyRequests || !strings.Contains(e.Message, "cordoned") {
		t.Fatalf("create on a cordoned node: %d %s, want 429 naming cordoned", st, body)
	}
	cli("node", "uncordon", "local")
	c := s.create(map[string]any{"templateID": "base"})
	if out := s.mustRun(c, "echo ok"); out != "ok\n" {
		t.Fatalf("sandbox after uncordon: %q", out)
	}
	if out := cli("node", "list"); !strings.Contains(out, "local") || !strings.Contains(out, "ready") {
		t.Fatalf("node list:\n%s", out)
	}
	cmd := exec.Command(filepath.Join(binDir, "cubicle"), "node", "forget", "local", "--data-dir", s.DataDir)
	// The serve holds its node's claim (a file lock on SQLite): the node
	// is alive, whatever its sandboxes.
	if out, err := cmd.CombinedOutput(); err == nil || !strings.Contains(string(out), "runs node local") {
		t.Fatalf("forget the node of a running serve: %v\n%s", err, out)
	}
}
