package integration

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/store"
	"github.com/cubicle-dev/cubicle/internal/store/sqlite"
)

// TestNodePullsBuiltinFromControlPlane: a pure control plane with
// --publish-builtins whose images dir holds only mini publishes it as
// builtin/mini:<recipe hash>; a joined `cubicle node run` whose images dir
// is empty boots a sandbox of template mini from it (pulled by digest over
// the cluster's mTLS), and the sandbox row names the image by digest. The
// images API refuses to replace or delete builtin/* (403).
func TestNodePullsBuiltinFromControlPlane(t *testing.T) {
	src := filepath.Join(imagesDir(t), "mini")
	recipe, err := os.ReadFile(filepath.Join(src, ".recipe-sha256"))
	if err != nil {
		t.Fatalf("mini image: %v", err)
	}
	cpImages, err := os.MkdirTemp("/var/tmp", "cubicle-it-builtins-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(cpImages) })
	if out, err := exec.Command("cp", "-a", src, filepath.Join(cpImages, "mini")).CombinedOutput(); err != nil {
		t.Fatalf("copy mini: %v\n%s", err, out)
	}
	s, _ := startTLSServer(t, "cubicle.test", "--embedded-node=false", "--buildkitd", "off", "--publish-builtins", "--images-dir", cpImages)

	// Published in the background: listed in the image store.
	wantRef := "builtin/mini:" + strings.TrimSpace(string(recipe))
	published := time.Now()
	var digest string
	for deadline := time.Now().Add(2 * time.Minute); digest == ""; time.Sleep(100 * time.Millisecond) {
		var entries []struct{ Ref, Digest string }
		if code := s.do("GET", "/images", nil, &entries); code == 200 {
			for _, e := range entries {
				if e.Ref == wantRef {
					digest = e.Digest
				}
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s never published: %v; logs:\n%s", wantRef, entries, s.logs)
		}
	}
	t.Logf("serve start to mini published: %v", time.Since(published).Round(time.Millisecond))
	// The built-ins' repositories are serve's: an admin can neither
	// replace nor delete what nodes boot.
	errShape(t, s, "POST", "/images?ref=builtin/mini:other", "not a tar", 403)
	errShape(t, s, "POST", "/images?ref=localhost:5000/builtin/base", "not a tar", 403)
	errShape(t, s, "DELETE", "/images?ref="+wantRef, nil, 403)

	// A node with an empty images dir.
	cubicle := func(args ...string) (string, error) {
		out, err := exec.Command(filepath.Join(binDir, "cubicle"), args...).CombinedOutput()
		return string(out), err
	}
	tok, pin := joinToken(t, s)
	nd := newNodeHost(t, "b")
	nodeDir := nd.DataDir
	nodeImages := filepath.Join(nodeDir, "images")
	if err := os.MkdirAll(nodeImages, 0o700); err != nil {
		t.Fatal(err)
	}
	if out, err := cubicle("node", "join", "--control-plane", "https://"+s.listenOn, "--token", tok, "--ca-pin", pin,
		"--node-id", "node-bi", "--data-dir", nodeDir, "--address", "127.0.0.1"); err != nil {
		t.Fatalf("join: %v\n%s", err, out)
	}
	grpcAddr, dataAddr := freeListenAddr(t), freeListenAddr(t)
	for dataAddr == grpcAddr {
		dataAddr = freeListenAddr(t)
	}
	run, exited, logs := startNodeRun(t, []string{"node", "run", "--data-dir", nodeDir, "--listen", grpcAddr, "--data-listen", dataAddr,
		"--images-dir", nodeImages, "--bridge", nd.Bridge, "--pool", freePool(), "--cgroup-parent", nd.Cgroup,
		"--agent-bin", filepath.Join(binDir, "cubicle-agent"), "--lxcfs=false"})

	st, err := sqlite.Open(filepath.Join(s.DataDir, "cubicle.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ctx := context.Background()
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if _, err := st.GetNode(ctx, "node-bi"); err == nil {
			break
		}
		select {
		case err := <-exited:
			t.Fatalf("node run exited (it must start without a base image): %v\n%s", err, logs.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("node-bi never registered\n%s", logs.String())
		}
	}

	// A sandbox of the built-in template mini, on the node without it.
	created := time.Now()
	c := s.create(map[string]any{"templateID": "mini"})
	t.Logf("create from mini with the pull: %v", time.Since(created).Round(time.Millisecond))
	nd.seen[c.SandboxID] = true
	if got := s.mustRun(c, "echo from-$(hostname >/dev/null; echo mini)"); strings.TrimSpace(got) != "from-mini" {
		t.Fatalf("command output %q", got)
	}
	row, err := st.GetSandbox(ctx, c.SandboxID)
	if err != nil {
		t.Fatal(err)
	}
	if row.Node != "node-bi" || row.Image != "builtin/mini@"+digest {
		t.Fatalf("sandbox row: node %q image %q; want node-bi and builtin/mini@%s", row.Node, row.Image, digest)
	}
	if _, err := os.Stat(filepath.Join(nodeImages, "mini")); err == nil {
		t.Fatal("the node's images dir gained a mini dir: it should have pulled into its cache")
	}
	if _, err := os.Stat(filepath.Join(nodeDir, "image-cache", strings.TrimPrefix(digest, "sha256:"), "rootfs")); err != nil {
		t.Fatalf("the pulled image is not in the node's cache: %v", err)
	}
	if ents, err := os.ReadDir(nodeImages); err != nil || len(ents) != 0 {
		t.Fatalf("the node wrote into its images dir: %v %v", ents, err)
	}
	// The node reports the pulled built-in as template mini.
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(250 * time.Millisecond) {
		n, err := st.GetNode(ctx, "node-bi")
		if err == nil && slices.Contains(n.Templates, "mini") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("node-bi's templates never named mini: %+v %v", n, err)
		}
	}

	if code := s.do("DELETE", "/sandboxes/"+c.SandboxID, nil, nil); code != 204 {
		t.Fatalf("kill: %d", code)
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if sb, err := st.GetSandbox(ctx, c.SandboxID); err != nil || sb.State == store.StateKilled {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("sandbox never killed")
		}
	}
	run.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-exited:
		exited <- err // for the clean-up
	case <-time.After(30 * time.Second):
		t.Fatalf("node run did not exit on SIGTERM\n%s", logs.String())
	}
}
