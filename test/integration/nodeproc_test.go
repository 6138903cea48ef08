package integration

import (
	"crypto/rand"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// joinToken makes a join token on s's control plane (extra: more `node
// token create` flags) and returns it with the CA pin it printed.
func joinToken(t *testing.T, s *server, extra ...string) (tok, pin string) {
	t.Helper()
	out, err := exec.Command(filepath.Join(binDir, "cubicle"), append([]string{"node", "token", "create", "--data-dir", s.DataDir}, extra...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("token create: %v\n%s", err, out)
	}
	for _, l := range strings.Split(string(out), "\n") {
		if v, ok := strings.CutPrefix(l, "token: "); ok {
			tok = v
		}
		if v, ok := strings.CutPrefix(l, "ca-pin: "); ok {
			pin = v
		}
	}
	if tok == "" || !strings.HasPrefix(pin, "sha256:") {
		t.Fatalf("token create printed:\n%s", out)
	}
	return tok, pin
}

// newNodeHost is the host resources of one `cubicle node run` process (a
// data dir under /var/tmp, bridge cn<tag><rand>, cgroup parent
// cubicle-it-n<tag><rand>), cleaned up like a server's, the check for
// leftovers included.
func newNodeHost(t *testing.T, tag string) *server {
	t.Helper()
	b := make([]byte, 3)
	rand.Read(b)
	suffix := hex.EncodeToString(b)
	nodeDir, err := os.MkdirTemp("/var/tmp", "cubicle-it-node-")
	if err != nil {
		t.Fatal(err)
	}
	nd := &server{t: t, DataDir: nodeDir, Bridge: "cn" + tag + suffix, Cgroup: "cubicle-it-n" + tag + suffix, seen: map[string]bool{}}
	t.Cleanup(func() {
		nd.forceClean()
		exec.Command("ip", "link", "del", nd.Bridge).Run()
		exec.Command("nft", "delete", "table", "inet", "cubicle_"+nd.Bridge).Run()
		exec.Command("nft", "delete", "table", "bridge", "cubicle_"+nd.Bridge).Run()
		unmountUnder(nd.DataDir)
		unmountUnder(filepath.Join("/run/cubicle", nd.Bridge))
		os.RemoveAll(filepath.Join("/run/cubicle", nd.Bridge))
		os.RemoveAll(nd.DataDir)
		if left := nd.infraLeftovers(); len(left) > 0 {
			t.Errorf("node run left host state behind:\n  %s", strings.Join(left, "\n  "))
		}
	})
	return nd
}

// startNodeRun starts `cubicle <args>` (a `node run`); its clean-up kills
// it (by PID) if the test did not stop it, and logs its output when the
// test failed. Its logs are read while it runs.
func startNodeRun(t *testing.T, args []string) (*exec.Cmd, chan error, *lockedBuffer) {
	t.Helper()
	logs := &lockedBuffer{}
	run := exec.Command(filepath.Join(binDir, "cubicle"), args...)
	run.Stdout, run.Stderr = logs, logs
	if err := run.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- run.Wait() }()
	t.Cleanup(func() {
		select {
		case <-exited:
		default:
			run.Process.Kill()
			<-exited
		}
		if t.Failed() {
			t.Logf("node run logs:\n%s", logs.String())
		}
	})
	return run, exited, logs
}
