package integration

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/cubicle-dev/cubicle/internal/clusterpki"
	"github.com/cubicle-dev/cubicle/internal/node/nodegrpc"
	"github.com/cubicle-dev/cubicle/internal/nodejoin"
	"github.com/cubicle-dev/cubicle/internal/secret"
	"github.com/cubicle-dev/cubicle/internal/store"
	"github.com/cubicle-dev/cubicle/internal/store/sqlite"
)

// TestNodeRun: `cubicle node run` beside a real `cubicle serve
// --tls-self-signed`, on loopback, with its own data dir, bridge, pool, nft
// table and cgroup parent. Without a join it fails clearly; joined, it
// registers its addresses and capacity and heartbeats; its gRPC services
// answer the control plane's certificate and refuse another node's; a
// second join of its ID is 409, also for an ID joined but not registered;
// SIGTERM ends it cleanly. Forgotten while it runs, its heartbeats get 401
// and it stays out; joined again with a new token, it registers.
func TestNodeRun(t *testing.T) {
	s, _ := startTLSServer(t, "cubicle.test")
	cp := "https://" + s.listenOn
	cubicle := func(args ...string) (string, error) {
		out, err := exec.Command(filepath.Join(binDir, "cubicle"), args...).CombinedOutput()
		return string(out), err
	}
	token := func() (tok, pin string) { return joinToken(t, s, "--label", "zone=a") }
	// The node's own host resources, cleaned up like a server's.
	nd := newNodeHost(t, "r")
	nodeDir := nd.DataDir
	grpcAddr, dataAddr := freeListenAddr(t), freeListenAddr(t)
	for dataAddr == grpcAddr {
		dataAddr = freeListenAddr(t)
	}
	runArgs := []string{"node", "run", "--data-dir", nodeDir, "--listen", grpcAddr, "--data-listen", dataAddr,
		"--images-dir", imagesDir(t), "--bridge", nd.Bridge, "--pool", freePool(), "--cgroup-parent", nd.Cgroup,
		"--agent-bin", filepath.Join(binDir, "cubicle-agent"), "--lxcfs=false"}

	// Not joined: a clear error, before anything touches the host.
	if out, err := cubicle(runArgs...); err == nil || !strings.Contains(out, "run `cubicle node join` first") {
		t.Fatalf("node run without a join: %v\n%s", err, out)
	}
	if _, err := os.Stat(filepath.Join("/run/cubicle", nd.Bridge)); err == nil {
		t.Fatal("node run without a join touched the host")
	}

	tok, pin := token()
	if out, err := cubicle("node", "join", "--control-plane", cp, "--token", tok, "--ca-pin", pin, "--node-id", "node-a",
		"--data-dir", nodeDir, "--address", "127.0.0.1"); err != nil {
		t.Fatalf("join: %v\n%s", err, out)
	}
	// startRun starts `node run`; its clean-up kills it (by PID) if the
	// test did not stop it. Its logs are read while it runs.
	startRun := func() (*exec.Cmd, chan error, *lockedBuffer) {
		t.Helper()
		return startNodeRun(t, runArgs)
	}
	// stopRun sends SIGTERM and checks the clean path.
	stopRun := func(run *exec.Cmd, exited chan error, logs *lockedBuffer) {
		t.Helper()
		stopAt := time.Now()
		run.Process.Signal(syscall.SIGTERM)
		select {
		case err := <-exited:
			if err != nil {
				t.Fatalf("node run after SIGTERM: %v\n%s", err, logs.String())
			}
			exited <- nil // for the clean-up
			t.Logf("SIGTERM to exit: %v", time.Since(stopAt).Round(time.Millisecond))
		case <-time.After(30 * time.Second):
			t.Fatalf("node run did not exit on SIGTERM\n%s", logs.String())
		}
		if !strings.Contains(logs.String(), "sandboxes left running for re-adoption") {
			t.Fatalf("node run's stop was not the clean path:\n%s", logs.String())
		}
	}
	started := time.Now()
	run, exited, logs := startRun()

	st, err := sqlite.Open(filepath.Join(s.DataDir, "cubicle.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ctx := context.Background()
	// The row appears with what the node reported, and the token's label.
	var row *store.Node
	for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if row, err = st.GetNode(ctx, "node-a"); err == nil {
			break
		}
		select {
		case err := <-exited:
			t.Fatalf("node run exited: %v\n%s", err, logs.String())
		default:
		}
	}
	if row == nil {
		t.Fatalf("node-a never registered: %v\n%s", err, logs.String())
	}
	t.Logf("node run start to registered row: %v", time.Since(started).Round(time.Millisecond))
	if row.Address != grpcAddr || row.DataAddress != dataAddr || row.Capacity.MilliCPU <= 0 || row.Capacity.MemoryMiB <= 0 ||
		row.Capacity.DiskMiB <= 0 || row.Runtime != "runc" || row.Labels["zone"] != "a" || len(row.VolumeDrivers) == 0 {
		t.Fatalf("registered row: %+v", row)
	}
	// It heartbeats (every 5 s).
	first := row.HeartbeatAt
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(250 * time.Millisecond) {
		if row, err = st.GetNode(ctx, "node-a"); err == nil && row.HeartbeatAt.After(first) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("heartbeat never advanced past %v: %+v %v", first, row, err)
		}
	}

	// The node's gRPC services: the control plane's identity is served,
	// another node's certificate (same CA) is refused.
	key, err := secret.LoadKey(filepath.Join(s.DataDir, "secrets.key"))
	if err != nil {
		t.Fatal(err)
	}
	sx, err := secret.New(st, key)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := clusterpki.LoadOrCreateCA(ctx, st, sx)
	if err != nil {
		t.Fatal(err)
	}
	cpCert, err := ca.IssueControlPlane(time.Now())
	if err != nil {
		t.Fatal(err)
	}
	info := func(cert tls.Certificate) (string, error) {
		conn, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(credentials.NewTLS(clusterpki.ControlPlaneClientConfig(cert, ca.Cert, "node-a"))))
		if err != nil {
			return "", err
		}
		defer conn.Close()
		cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		in, err := nodegrpc.NewClient(conn).Info(cctx)
		return in.ID, err
	}
	infoStart := time.Now()
	if id, err := info(*cpCert); err != nil || id != "node-a" {
		t.Fatalf("Info with the control plane's certificate: %q, %v", id, err)
	}
	t.Logf("first gRPC Info over mTLS (dial, handshake, call): %v", time.Since(infoStart).Round(time.Microsecond))
	tok2, _ := token()
	otherDir := t.TempDir()
	if out, err := cubicle("node", "join", "--control-plane", cp, "--token", tok2, "--ca-pin", pin, "--node-id", "node-b",
		"--data-dir", otherDir, "--address", "127.0.0.1"); err != nil {
		t.Fatalf("join node-b: %v\n%s", err, out)
	}
	other, err := tls.LoadX509KeyPair(filepath.Join(otherDir, nodejoin.CertFile), filepath.Join(otherDir, nodejoin.KeyFile))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := info(other); err == nil {
		t.Fatal("node-a's gRPC services answered node-b's certificate")
	}

	// node-a is registered: joining with its ID again is 409, and the
	// token is not spent.
	tok3, _ := token()
	if out, err := cubicle("node", "join", "--control-plane", cp, "--token", tok3, "--ca-pin", pin, "--node-id", "node-a",
		"--data-dir", t.TempDir()); err == nil || !strings.Contains(out, "409") || !strings.Contains(out, "cubicle node forget node-a") {
		t.Fatalf("second join of node-a: %v\n%s", err, out)
	}
	if toks, _ := st.ListJoinTokens(ctx); len(toks) == 0 || !toks[len(toks)-1].UsedAt.IsZero() {
		t.Fatal("the token refused with 409 was spent")
	}

	// node-b joined but never registered: its ID is taken all the same
	// (409, token not spent) until `cubicle node forget node-b`.
	tok4, _ := token()
	joinB := func() (string, error) {
		return cubicle("node", "join", "--control-plane", cp, "--token", tok4, "--ca-pin", pin, "--node-id", "node-b",
			"--data-dir", t.TempDir(), "--address", "127.0.0.1")
	}
	if out, err := joinB(); err == nil || !strings.Contains(out, "409") {
		t.Fatalf("second join of node-b (joined, not registered): %v\n%s", err, out)
	}
	if toks, _ := st.ListJoinTokens(ctx); len(toks) == 0 || !toks[len(toks)-1].UsedAt.IsZero() {
		t.Fatal("the token refused with 409 for node-b was spent")
	}
	if out, err := cubicle("node", "forget", "node-b", "--data-dir", s.DataDir); err != nil {
		t.Fatalf("forget node-b (joined, not registered): %v\n%s", err, out)
	}
	if out, err := joinB(); err != nil {
		t.Fatalf("join node-b after its forget: %v\n%s", err, out)
	}

	// Forget node-a while it runs (it holds no sandboxes): its certificate
	// is revoked, so its heartbeats get 401 naming the forget, and it
	// does not register again.
	if out, err := cubicle("node", "forget", "node-a", "--data-dir", s.DataDir); err != nil {
		t.Fatalf("forget node-a: %v\n%s", err, out)
	}
	forgotAt := time.Now()
	for deadline := time.Now().Add(30 * time.Second); strings.Count(logs.String(), "node node-a was forgotten") < 2; time.Sleep(250 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("node-a's heartbeats were not refused as forgotten:\n%s", logs.String())
		}
	}
	t.Logf("forget to the second refused heartbeat: %v", time.Since(forgotAt).Round(time.Millisecond))
	if !strings.Contains(logs.String(), "answered 401") {
		t.Fatalf("the refusal was not a 401:\n%s", logs.String())
	}
	if row, err := st.GetNode(ctx, "node-a"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("forgotten node-a registered again: %+v %v", row, err)
	}

	// SIGTERM: a clean exit.
	stopRun(run, exited, logs)

	// Join again with a new token (the operator removes the old identity
	// first: join refuses a data dir that holds one), then run: it
	// registers with the new certificate.
	for _, f := range []string{nodejoin.CertFile, nodejoin.KeyFile, nodejoin.CAFile, nodejoin.InfoFile} {
		if err := os.Remove(filepath.Join(nodeDir, f)); err != nil {
			t.Fatal(err)
		}
	}
	tok5, _ := token()
	if out, err := cubicle("node", "join", "--control-plane", cp, "--token", tok5, "--ca-pin", pin, "--node-id", "node-a",
		"--data-dir", nodeDir, "--address", "127.0.0.1"); err != nil {
		t.Fatalf("re-join node-a after its forget: %v\n%s", err, out)
	}
	run, exited, logs = startRun()
	row = nil
	for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if row, err = st.GetNode(ctx, "node-a"); err == nil {
			break
		}
		select {
		case err := <-exited:
			t.Fatalf("re-joined node run exited: %v\n%s", err, logs.String())
		default:
		}
	}
	if row == nil || row.Address != grpcAddr {
		t.Fatalf("re-joined node-a did not register: %+v %v\n%s", row, err, logs.String())
	}
	stopRun(run, exited, logs)
}

// lockedBuffer is a bytes.Buffer a process writes while the test reads it.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
