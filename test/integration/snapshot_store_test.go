package integration

import (
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cubicle-dev/cubicle/internal/volume/s3/s3test"
)

// serve --snapshot-store: a bad URL or missing credentials stop serve
// before it touches the host, naming the flag; a good one serves, and the
// embedded node's snapshots (paths, not references) stay local: creates
// from them work as before and nothing is uploaded.
func TestSnapshotStoreServe(t *testing.T) {
	gw := s3test.Start(t)
	storeURL := "s3://" + gw.Bucket + "?endpoint=" + url.QueryEscape(gw.Endpoint) + "&region=" + gw.Region + "&pathStyle=true"
	creds := []string{"CUBICLE_SNAPSHOT_S3_ACCESS_KEY=" + gw.AccessKey, "CUBICLE_SNAPSHOT_S3_SECRET_KEY=" + gw.SecretKey}
	for _, c := range []struct {
		url  string
		env  []string
		want string
	}{
		{"s3://b/with/path", creds, "no path"},
		{storeURL, nil, "CUBICLE_SNAPSHOT_S3_ACCESS_KEY"},
	} {
		data := t.TempDir()
		cmd := exec.Command(filepath.Join(binDir, "cubicle"), "serve", "--data-dir", data, "--listen", freeListenAddr(t),
			"--metrics-listen", "off", "--snapshot-store", c.url)
		cmd.Env = append(os.Environ(), c.env...)
		out, err := cmd.CombinedOutput()
		// The error itself, not a usage text that lists every flag.
		if err == nil || !strings.Contains(string(out), "--snapshot-store: snapstore: invalid snapshot store") || !strings.Contains(string(out), c.want) {
			t.Fatalf("serve --snapshot-store %s: %v, want an error naming %s:\n%s", c.url, err, c.want, out)
		}
		if ents, _ := os.ReadDir(data); len(ents) != 0 {
			t.Fatalf("a refused serve wrote %v", ents)
		}
	}

	s := startServerEnv(t, creds, "--snapshot-store", storeURL)
	src := s.create(map[string]any{"templateID": "base"})
	s.mustRun(src, "echo kept > /home/user/state")
	sn := s.snapshotOf(t, src, "")
	from := s.create(map[string]any{"templateID": sn.SnapshotID})
	if out := s.mustRun(from, "cat /home/user/state"); out != "kept\n" {
		t.Fatalf("from snapshot: %q", out)
	}
	if keys := gw.Keys(t, ""); len(keys) != 0 {
		t.Fatalf("the embedded node's snapshot was uploaded: %v", keys)
	}
}
