package integration

import (
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/testenv"
	"github.com/cubicle-dev/cubicle/internal/volume/s3/s3test"
)

// requireS3 starts a real versitygw, or fails in CI where scripts/install
// must have provided it and s3fs.
func requireS3(t *testing.T) *s3test.Server {
	t.Helper()
	_, gwErr := s3test.VersityGW()
	_, fsErr := exec.LookPath("s3fs")
	if gwErr != nil || fsErr != nil {
		testenv.Skipf(t, "versitygw or s3fs missing: %v %v", gwErr, fsErr)
	}
	return s3test.Start(t)
}

// The S3 plugin end to end through the server, as a binary plugin (driver
// s3) and as an rpc plugin (driver s3rpc, a gRPC server on a Unix socket),
// against a real S3 server, mounted in sandboxes with s3fs.
func TestVolumeS3BinaryAndRPC(t *testing.T) {
	gw := requireS3(t)
	dir, err := os.MkdirTemp("/var/tmp", "cubicle-it-s3-")
	if err != nil {
		t.Fatal(err)
	}
	base := filepath.Join(dir, "base")
	t.Cleanup(func() {
		s3test.CleanupMounts(t, base)
		os.RemoveAll(dir)
	})
	plugin := filepath.Join(binDir, "cubicle-volume-s3")
	env := append(gw.Env(), "CUBICLE_S3_STATE_DIR="+filepath.Join(dir, "state"))

	sock := filepath.Join(dir, "s3.sock")
	rpcSrv := exec.Command(plugin, "serve", "--socket", sock)
	rpcSrv.Env = append(os.Environ(), env...)
	rpcLog, _ := os.Create(filepath.Join(dir, "rpc.log"))
	rpcSrv.Stdout, rpcSrv.Stderr = rpcLog, rpcLog
	if err := rpcSrv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		rpcSrv.Process.Kill()
		rpcSrv.Wait()
	})

	yaml := fmt.Sprintf("volume_plugins:\n  - name: s3\n    type: binary\n    binary_path: %s\n  - name: s3rpc\n    type: rpc\n    socket_path: %s\n  - name: local\n    type: local\n", plugin, sock)
	toml := fmt.Sprintf("[storage]\n  volume_plugin_base_dir = %q\n[[storage.volume_plugins]]\n  name = \"s3\"\n  type = \"binary\"\n  binary_path = %q\n[[storage.volume_plugins]]\n  name = \"s3rpc\"\n  type = \"rpc\"\n  socket_path = %q\n[[storage.volume_plugins]]\n  name = \"local\"\n  type = \"local\"\n", base, plugin, sock)
	os.WriteFile(filepath.Join(dir, "control.yaml"), []byte(yaml), 0o644)
	os.WriteFile(filepath.Join(dir, "node.toml"), []byte(toml), 0o644)
	s := startServerEnv(t, env, "--volume-config", filepath.Join(dir, "control.yaml"), "--node-config", filepath.Join(dir, "node.toml"))

	// Default driver is the first entry: s3.
	bv := s.createVolume(t, map[string]any{"name": "s3bin"})
	if bv.Driver != "s3" {
		t.Fatalf("default driver: %+v", bv)
	}
	rv := s.createVolume(t, map[string]any{"name": "s3grpc", "driver": "s3rpc"})
	mounts := []any{map[string]any{"name": "s3bin", "path": "/bin-vol"}, map[string]any{"name": "s3grpc", "path": "/rpc-vol"}}
	start := time.Now()
	a := s.create(map[string]any{"templateID": "base", "volumeMounts": mounts})
	t.Logf("create with two S3 volumes: %v", time.Since(start))
	b := s.create(map[string]any{"templateID": "base", "volumeMounts": mounts})
	s.mustRun(a, "echo via-binary > /bin-vol/f.txt && echo via-rpc > /rpc-vol/g.txt && mkdir -p /bin-vol/dir && echo deep > /bin-vol/dir/h")
	if out := s.mustRun(b, "cat /bin-vol/f.txt /rpc-vol/g.txt /bin-vol/dir/h"); out != "via-binary\nvia-rpc\ndeep\n" {
		t.Fatalf("B reads A's writes through s3fs: %q", out)
	}
	if m := s3test.FUSEMountsUnder(base); len(m) != 2 {
		t.Fatalf("want one s3fs mount per volume on the node, got %v", m)
	}
	s.kill(t, a.SandboxID)
	s.kill(t, b.SandboxID)
	if m := s3test.FUSEMountsUnder(base); len(m) != 0 {
		t.Fatalf("s3fs mounts left after the last detach: %v", m)
	}
	// The objects are in the bucket, under the volume's prefix.
	for _, p := range []string{"volumes/s3bin/f.txt", "volumes/s3grpc/g.txt", "volumes/s3bin/dir/h"} {
		if _, err := os.Stat(filepath.Join(gw.Root, gw.Bucket, p)); err != nil {
			t.Fatalf("object %s not in the backend: %v", p, err)
		}
	}
	// The volume-content API reads it without any sandbox.
	if st, body := contentReq(t, s, "GET", "/volumecontent/s3grpc/file?path=/g.txt", rv.Token, nil); st != http.StatusOK || body != "via-rpc\n" {
		t.Fatalf("volume content over s3: %d %q", st, body)
	}
	if st, _ := contentReq(t, s, "PUT", "/volumecontent/s3bin/file?path=/from-api.txt", bv.Token, strings.NewReader("api")); st != http.StatusCreated {
		t.Fatalf("put over s3: %d", st)
	}
	c := s.create(map[string]any{"templateID": "base", "volumeMounts": mounts})
	if out := s.mustRun(c, "cat /bin-vol/f.txt /bin-vol/from-api.txt"); out != "via-binary\napi" {
		t.Fatalf("new sandbox: %q", out)
	}
	s.kill(t, c.SandboxID)
	for _, id := range []string{"s3bin", "s3grpc"} {
		if st := s.do("DELETE", "/volumes/"+id, nil, nil); st != http.StatusNoContent {
			t.Fatalf("delete %s: %d", id, st)
		}
	}
	if _, err := os.Stat(filepath.Join(gw.Root, gw.Bucket, "volumes", "s3bin", "f.txt")); !os.IsNotExist(err) {
		t.Fatalf("destroy left objects: %v", err)
	}
	if m := s3test.FUSEMountsUnder(base); len(m) != 0 {
		t.Fatalf("s3fs mounts left: %v", m)
	}
}
