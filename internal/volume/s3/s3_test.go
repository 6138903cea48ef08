package s3

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/volume"
	"github.com/cubicle-dev/cubicle/internal/volume/binary"
	"github.com/cubicle-dev/cubicle/internal/volume/plugintest"
	"github.com/cubicle-dev/cubicle/internal/volume/rpc"
	"github.com/cubicle-dev/cubicle/internal/volume/s3/s3test"
)

// pluginBin is cmd/cubicle-volume-s3 built by TestMain ("" if it failed).
var (
	pluginBin   string
	buildErr    error
	buildOutput []byte
)

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "cubicle-volume-s3-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		goBin = "/usr/local/go/bin/go"
	}
	bin := filepath.Join(dir, "cubicle-volume-s3")
	cmd := exec.Command(goBin, "build", "-o", bin, "github.com/cubicle-dev/cubicle/cmd/cubicle-volume-s3")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if buildOutput, buildErr = cmd.CombinedOutput(); buildErr == nil {
		pluginBin = bin
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

func needBinary(t *testing.T) string {
	t.Helper()
	if pluginBin == "" {
		t.Fatalf("building cmd/cubicle-volume-s3 failed: %v\n%s", buildErr, buildOutput)
	}
	return pluginBin
}

// env is one test's S3 server, node base dir and plugin state dir.
type env struct {
	srv      *s3test.Server
	base     string
	stateDir string
	vars     []string
}

// setup starts versitygw and prepares dirs; cleanups run mounts first,
// then the server, then the dirs.
func setup(t *testing.T) *env {
	t.Helper()
	s3test.RequireS3FS(t)
	e := &env{base: t.TempDir(), stateDir: t.TempDir()}
	e.srv = s3test.Start(t)
	s3test.CleanupMounts(t, e.base)
	// An empty config file, so a host's /etc/cubicle/s3-volume.json
	// cannot leak into the tests: they configure by env only.
	e.vars = append(e.srv.Env(),
		EnvStateDir+"="+e.stateDir,
		EnvMountTimeout+"=20s",
		EnvConfig+"="+emptyConfig(t),
	)
	return e
}

func emptyConfig(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "s3-volume.json")
	if err := os.WriteFile(path, []byte("{}"), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func (e *env) plugin(t *testing.T, extra ...string) *Plugin {
	t.Helper()
	cfg, err := LoadConfig("", append(append([]string{}, e.vars...), extra...))
	if err != nil {
		t.Fatal(err)
	}
	p, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// setenv exports e's config to child processes (binary driver, serve).
func (e *env) setenv(t *testing.T) {
	t.Helper()
	for _, kv := range e.vars {
		k, v, _ := strings.Cut(kv, "=")
		t.Setenv(k, v)
	}
}

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func attach(t *testing.T, p volume.Plugin, base, id string, rc int64, priv string) volume.AttachResult {
	t.Helper()
	res, err := p.Attach(ctxT(t, time.Minute), volume.AttachRequest{
		SandboxID: fmt.Sprintf("sb-%d", rc), Namespace: volume.Namespace, VolumeID: id,
		RefCount: rc, VolumeBaseDir: base, PrivateData: priv,
	})
	if err != nil {
		t.Fatalf("attach %s (refCount=%d): %v", id, rc, err)
	}
	return res
}

func detach(t *testing.T, p volume.Plugin, id string, rc int64, md map[string]string) {
	t.Helper()
	err := p.Detach(ctxT(t, time.Minute), volume.DetachRequest{
		SandboxID: fmt.Sprintf("sb-%d", rc), Namespace: volume.Namespace, VolumeID: id,
		RefCount: rc, Metadata: md,
	})
	if err != nil {
		t.Fatalf("detach %s (refCount=%d): %v", id, rc, err)
	}
}

func create(t *testing.T, p volume.Plugin, id string) volume.CreateResult {
	t.Helper()
	res, err := p.Create(ctxT(t, 30*time.Second), volume.CreateRequest{VolumeID: id, Name: id})
	if err != nil {
		t.Fatalf("create %s: %v", id, err)
	}
	return res
}

func assertGone(t *testing.T, dir string) {
	t.Helper()
	if m, _ := isMounted(dir); m {
		t.Errorf("%s is still mounted", dir)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("mount point %s still exists (stat: %v)", dir, err)
	}
	if pids := s3fsPIDs(dir); len(pids) > 0 {
		t.Errorf("s3fs still running for %s: %v", dir, pids)
	}
}

func TestConformanceDirect(t *testing.T) {
	e := setup(t)
	p := e.plugin(t)
	plugintest.Run(t, p, plugintest.Options{BaseDir: e.base, VolumeID: "direct", ProbeFiles: true})
	assertGone(t, filepath.Join(e.base, "s3-direct"))
	if keys := e.srv.Keys(t, "volumes/direct/"); len(keys) != 0 {
		t.Errorf("objects left after destroy: %v", keys)
	}
}

func TestConformanceBinary(t *testing.T) {
	bin := needBinary(t)
	e := setup(t)
	e.setenv(t)
	plugintest.Run(t, binary.New(bin, time.Minute), plugintest.Options{BaseDir: e.base, VolumeID: "viabinary", ProbeFiles: true})
	assertGone(t, filepath.Join(e.base, "s3-viabinary"))
}

func TestConformanceRPC(t *testing.T) {
	bin := needBinary(t)
	e := setup(t)
	sock := filepath.Join(e.stateDir, "plugin.sock")
	log, err := os.Create(filepath.Join(e.stateDir, "serve.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer log.Close()
	cmd := exec.Command(bin, "serve", "--socket", sock)
	cmd.Env = append(os.Environ(), e.vars...)
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			_ = cmd.Process.Kill()
			<-exited
		}
	})
	dl := time.Now().Add(15 * time.Second)
	for {
		c, err := net.Dial("unix", sock)
		if err == nil {
			c.Close()
			break
		}
		if time.Now().After(dl) {
			out, _ := os.ReadFile(log.Name())
			t.Fatalf("serve did not listen on %s: %v\n%s", sock, err, out)
		}
		time.Sleep(20 * time.Millisecond)
	}
	client, err := rpc.Dial(sock, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	plugintest.Run(t, client, plugintest.Options{BaseDir: e.base, VolumeID: "viarpc", ProbeFiles: true})
	client.Close()
	assertGone(t, filepath.Join(e.base, "s3-viarpc"))

	// SIGTERM is a clean stop.
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-exited:
		stopped = true
		if err != nil {
			out, _ := os.ReadFile(log.Name())
			t.Errorf("serve exited with %v after SIGTERM\n%s", err, out)
		}
	case <-time.After(15 * time.Second):
		t.Error("serve did not stop within 15s of SIGTERM")
	}
}

func TestDataPersistsAcrossDetach(t *testing.T) {
	e := setup(t)
	p := e.plugin(t)
	const id = "persist"
	cr := create(t, p, id)
	if cr.PrivateData != "volumes/persist/" || cr.Token != "" {
		t.Fatalf("create = %+v, want private_data volumes/persist/ and no token", cr)
	}
	// Create is idempotent.
	create(t, p, id)

	start := time.Now()
	a := attach(t, p, e.base, id, 0, cr.PrivateData)
	t.Logf("attach (mount) took %s", time.Since(start).Round(time.Millisecond))
	if want := filepath.Join(e.base, "s3-"+id); a.HostPath != want {
		t.Fatalf("host_path = %q, want %q", a.HostPath, want)
	}
	if a.Metadata["mount_dir"] != a.HostPath || a.Metadata["bucket"] != e.srv.Bucket || a.Metadata["prefix"] != "volumes/persist/" {
		t.Errorf("metadata = %v", a.Metadata)
	}
	if err := os.MkdirAll(filepath.Join(a.HostPath, "sub", "dir"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(a.HostPath, "sub", "dir", "hello.txt"), []byte("hello s3\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	big := strings.Repeat("0123456789abcdef", 1<<16) // 1 MiB
	if err := os.WriteFile(filepath.Join(a.HostPath, "big.bin"), []byte(big), 0o644); err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	detach(t, p, id, 0, a.Metadata)
	t.Logf("detach (unmount) took %s", time.Since(start).Round(time.Millisecond))
	assertGone(t, a.HostPath)

	keys := e.srv.Keys(t, "volumes/persist/")
	if !contains(keys, "volumes/persist/sub/dir/hello.txt") || !contains(keys, "volumes/persist/big.bin") {
		t.Fatalf("objects after detach = %v, want the written files", keys)
	}

	// Second mount of the same volume, without private_data: the
	// configured layout finds the same prefix.
	b := attach(t, p, e.base, id, 0, "")
	got, err := os.ReadFile(filepath.Join(b.HostPath, "sub", "dir", "hello.txt"))
	if err != nil || string(got) != "hello s3\n" {
		t.Fatalf("after re-attach: %q, %v", got, err)
	}
	if got, err := os.ReadFile(filepath.Join(b.HostPath, "big.bin")); err != nil || string(got) != big {
		t.Fatalf("after re-attach big.bin: %d bytes, %v", len(got), err)
	}
	detach(t, p, id, 0, b.Metadata)
	assertGone(t, b.HostPath)
	if err := p.Destroy(ctxT(t, 30*time.Second), volume.DestroyRequest{VolumeID: id}); err != nil {
		t.Fatal(err)
	}
}

func contains(ss []string, s string) bool {
	for _, x := range ss {
		if x == s {
			return true
		}
	}
	return false
}

// Two attaches on one node share the mount; two nodes (two base dirs,
// separate s3fs) see each other's writes through the bucket.
func TestSharedAttach(t *testing.T) {
	e := setup(t)
	p := e.plugin(t)
	const id = "shared"
	cr := create(t, p, id)

	a := attach(t, p, e.base, id, 0, cr.PrivateData)
	b := attach(t, p, e.base, id, 1, cr.PrivateData)
	if a.HostPath != b.HostPath {
		t.Fatalf("refCount=1 attach got %q, first got %q", b.HostPath, a.HostPath)
	}
	if err := os.WriteFile(filepath.Join(a.HostPath, "from-a"), []byte("a"), 0o644); err != nil {
		t.Fatal(err)
	}

	nodeB := t.TempDir()
	s3test.CleanupMounts(t, nodeB)
	other := attach(t, p, nodeB, id, 0, cr.PrivateData)
	if other.HostPath == a.HostPath {
		t.Fatal("second node got the first node's mount")
	}
	if got, err := os.ReadFile(filepath.Join(other.HostPath, "from-a")); err != nil || string(got) != "a" {
		t.Fatalf("node B reads node A's file: %q, %v", got, err)
	}
	if err := os.WriteFile(filepath.Join(other.HostPath, "from-b"), []byte("b"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(filepath.Join(b.HostPath, "from-b")); err != nil || string(got) != "b" {
		t.Fatalf("node A reads node B's file: %q, %v", got, err)
	}

	detach(t, p, id, 1, b.Metadata) // no-op: a still holds it
	if m, _ := isMounted(a.HostPath); !m {
		t.Fatal("detach(refCount=1) unmounted the shared mount")
	}
	detach(t, p, id, 0, a.Metadata)
	assertGone(t, a.HostPath)
	if m, _ := isMounted(other.HostPath); !m {
		t.Fatal("detaching node A unmounted node B")
	}
	detach(t, p, id, 0, other.Metadata)
	assertGone(t, other.HostPath)
	if err := p.Destroy(ctxT(t, 30*time.Second), volume.DestroyRequest{VolumeID: id}); err != nil {
		t.Fatal(err)
	}
}

func TestDestroyRemovesObjects(t *testing.T) {
	e := setup(t)
	p := e.plugin(t)
	for _, id := range []string{"doomed", "kept"} {
		cr := create(t, p, id)
		a := attach(t, p, e.base, id, 0, cr.PrivateData)
		for i := 0; i < 5; i++ {
			dir := filepath.Join(a.HostPath, fmt.Sprintf("d%d", i), "deeper")
			if err := os.MkdirAll(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, "f"), []byte(id), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		detach(t, p, id, 0, a.Metadata)
	}
	if keys := e.srv.Keys(t, "volumes/doomed/"); len(keys) < 5 {
		t.Fatalf("expected objects before destroy, got %v", keys)
	}
	for i := 0; i < 2; i++ { // idempotent
		if err := p.Destroy(ctxT(t, 30*time.Second), volume.DestroyRequest{VolumeID: "doomed"}); err != nil {
			t.Fatalf("destroy #%d: %v", i+1, err)
		}
	}
	if keys := e.srv.Keys(t, "volumes/doomed/"); len(keys) != 0 {
		t.Fatalf("objects left after destroy: %v", keys)
	}
	if keys := e.srv.Keys(t, "volumes/kept/"); len(keys) < 5 {
		t.Fatalf("destroy of another volume removed kept's objects: %v", keys)
	}
	// A never-created volume destroys fine.
	if err := p.Destroy(ctxT(t, 30*time.Second), volume.DestroyRequest{VolumeID: "never"}); err != nil {
		t.Fatal(err)
	}
}

func TestCreateBucket(t *testing.T) {
	e := setup(t)
	p := e.plugin(t, EnvBucket+"=fresh-bucket", EnvCreateBucket+"=true")
	create(t, p, "v")
	c, err := e.srv.Client()
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := c.BucketExists(ctxT(t, 10*time.Second), "fresh-bucket"); err != nil || !ok {
		t.Fatalf("bucket not created: %v %v", ok, err)
	}
	create(t, p, "v") // bucket exists now
	pNo := e.plugin(t, EnvBucket+"=absent-bucket")
	if _, err := pNo.Create(ctxT(t, 10*time.Second), volume.CreateRequest{VolumeID: "v"}); !errors.Is(err, ErrBackend) || !errors.Is(err, volume.ErrPlugin) {
		t.Fatalf("create in a missing bucket without create_bucket: %v, want ErrBackend", err)
	}
}

func TestAttachBadEndpointFailsCleanly(t *testing.T) {
	s3test.RequireS3FS(t)
	base, state := t.TempDir(), t.TempDir()
	s3test.CleanupMounts(t, base)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := l.Addr().String()
	l.Close()
	const timeout = 10 * time.Second
	cfg, err := LoadConfig("", []string{
		EnvEndpoint + "=http://" + dead, EnvBucket + "=b", EnvAccessKey + "=AK", EnvSecretKey + "=SK",
		EnvStateDir + "=" + state, EnvMountTimeout + "=" + timeout.String(),
		EnvConfig + "=" + emptyConfig(t),
	})
	if err != nil {
		t.Fatal(err)
	}
	p, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err = p.Attach(ctxT(t, time.Minute), volume.AttachRequest{
		SandboxID: "sb", Namespace: volume.Namespace, VolumeID: "v", VolumeBaseDir: base,
	})
	took := time.Since(start)
	t.Logf("attach to a dead endpoint failed after %s: %v", took.Round(time.Millisecond), err)
	if !errors.Is(err, ErrMount) || !errors.Is(err, volume.ErrPlugin) {
		t.Fatalf("err = %v, want ErrMount", err)
	}
	if !strings.Contains(err.Error(), "s3fs") {
		t.Errorf("error does not mention s3fs: %v", err)
	}
	if took > timeout+5*time.Second {
		t.Errorf("attach took %s, mount timeout is %s", took, timeout)
	}
	assertGone(t, filepath.Join(base, "s3-v"))
}

func TestAttachBadCredentialsFailsCleanly(t *testing.T) {
	e := setup(t)
	good := e.plugin(t)
	create(t, good, "v")
	p := e.plugin(t, EnvSecretKey+"=wrong-secret")
	_, err := p.Attach(ctxT(t, time.Minute), volume.AttachRequest{
		SandboxID: "sb", Namespace: volume.Namespace, VolumeID: "v", VolumeBaseDir: e.base,
	})
	t.Logf("attach with a wrong secret: %v", err)
	if err == nil {
		log, _ := os.ReadFile(filepath.Join(e.stateDir, "logs", "s3fs-v.log"))
		mi, _ := os.ReadFile("/proc/self/mountinfo")
		t.Logf("s3fs log:\n%s\nmountinfo:\n%s\npids %v", log, mi, s3fsPIDs(filepath.Join(e.base, "s3-v")))
	}
	if !errors.Is(err, ErrMount) {
		t.Fatalf("err = %v, want ErrMount", err)
	}
	assertGone(t, filepath.Join(e.base, "s3-v"))
}

// A plugin restart loses nothing: a live mount is reused by a repeated
// first attach, and a dead one (s3fs killed) is replaced.
func TestAttachRecoversMounts(t *testing.T) {
	e := setup(t)
	p := e.plugin(t)
	cr := create(t, p, "rec")
	a := attach(t, p, e.base, "rec", 0, cr.PrivateData)
	if err := os.WriteFile(filepath.Join(a.HostPath, "f"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	again := attach(t, p, e.base, "rec", 0, cr.PrivateData)
	if again.HostPath != a.HostPath {
		t.Fatalf("re-attach path %q != %q", again.HostPath, a.HostPath)
	}
	if n := countMounts(t, a.HostPath); n != 1 {
		t.Fatalf("%d mounts at %s after a repeated attach, want 1", n, a.HostPath)
	}

	pids := s3fsPIDs(a.HostPath)
	if len(pids) != 1 {
		t.Fatalf("s3fs daemons for %s: %v", a.HostPath, pids)
	}
	_ = syscall.Kill(pids[0], syscall.SIGKILL)
	waitFor(t, 5*time.Second, func() bool { return len(s3fsPIDs(a.HostPath)) == 0 })
	if _, err := os.Stat(filepath.Join(a.HostPath, "f")); err == nil {
		t.Fatal("mount still answers after its s3fs was killed")
	}
	// refCount>0 with a dead mount: mounted again.
	fixed := attach(t, p, e.base, "rec", 1, cr.PrivateData)
	if got, err := os.ReadFile(filepath.Join(fixed.HostPath, "f")); err != nil || string(got) != "x" {
		t.Fatalf("after recovery: %q, %v", got, err)
	}
	if n := countMounts(t, a.HostPath); n != 1 {
		t.Fatalf("%d mounts at %s after recovery, want 1", n, a.HostPath)
	}
	detach(t, p, "rec", 0, fixed.Metadata)
	assertGone(t, a.HostPath)
}

func countMounts(t *testing.T, dir string) int {
	t.Helper()
	ms, err := ReadMounts()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, m := range ms {
		if m.MountPoint == dir && m.FSType == FSType {
			n++
		}
	}
	return n
}

func waitFor(t *testing.T, d time.Duration, cond func() bool) {
	t.Helper()
	dl := time.Now().Add(d)
	for !cond() {
		if time.Now().After(dl) {
			t.Fatalf("condition not met within %s", d)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Detach falls back to a lazy unmount when the mount stays busy.
func TestDetachBusyMountGoesLazy(t *testing.T) {
	e := setup(t)
	p := e.plugin(t, EnvUnmountTimeout+"=1s")
	cr := create(t, p, "busy")
	a := attach(t, p, e.base, "busy", 0, cr.PrivateData)
	f, err := os.Create(filepath.Join(a.HostPath, "open"))
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	detach(t, p, "busy", 0, a.Metadata)
	t.Logf("busy detach took %s", time.Since(start).Round(time.Millisecond))
	if m, _ := isMounted(a.HostPath); m {
		t.Error("still mounted after detach of a busy mount")
	}
	f.Close()
	waitFor(t, 10*time.Second, func() bool { return len(s3fsPIDs(a.HostPath)) == 0 })
	assertGone(t, a.HostPath)
}

func TestDetachEdgeCases(t *testing.T) {
	e := setup(t)
	p := e.plugin(t)
	ctx := ctxT(t, 30*time.Second)
	// Never attached, with and without metadata.
	if err := p.Detach(ctx, volume.DetachRequest{VolumeID: "nothing"}); err != nil {
		t.Fatal(err)
	}
	md := map[string]string{"mount_dir": filepath.Join(e.base, "s3-nothing")}
	if err := p.Detach(ctx, volume.DetachRequest{VolumeID: "nothing", Metadata: md}); err != nil {
		t.Fatal(err)
	}
	// Metadata pointing elsewhere is refused, and the dir is left alone.
	victim := filepath.Join(e.base, "victim")
	if err := os.Mkdir(victim, 0o755); err != nil {
		t.Fatal(err)
	}
	err := p.Detach(ctx, volume.DetachRequest{VolumeID: "nothing", Metadata: map[string]string{"mount_dir": victim}})
	if !errors.Is(err, ErrInvalidRequest) {
		t.Fatalf("detach with foreign mount_dir: %v, want ErrInvalidRequest", err)
	}
	if _, err := os.Stat(victim); err != nil {
		t.Fatal(err)
	}
	// Without metadata a mounted volume is still found and unmounted.
	cr := create(t, p, "nomd")
	a := attach(t, p, e.base, "nomd", 0, cr.PrivateData)
	detach(t, p, "nomd", 0, nil)
	assertGone(t, a.HostPath)
}

func TestInvalidRequests(t *testing.T) {
	e := setup(t)
	p := e.plugin(t)
	ctx := ctxT(t, 30*time.Second)
	for _, id := range []string{"", "../x", "a/b", strings.Repeat("x", 200)} {
		if _, err := p.Create(ctx, volume.CreateRequest{VolumeID: id}); !errors.Is(err, ErrInvalidRequest) {
			t.Errorf("create %q: %v", id, err)
		}
		if err := p.Destroy(ctx, volume.DestroyRequest{VolumeID: id}); !errors.Is(err, ErrInvalidRequest) {
			t.Errorf("destroy %q: %v", id, err)
		}
		if _, err := p.Attach(ctx, volume.AttachRequest{VolumeID: id, VolumeBaseDir: e.base}); !errors.Is(err, ErrInvalidRequest) {
			t.Errorf("attach %q: %v", id, err)
		}
	}
	for _, pd := range []string{"../etc/", "a//b/", "volumes/../x/"} {
		if _, err := p.Attach(ctx, volume.AttachRequest{VolumeID: "v", VolumeBaseDir: e.base, PrivateData: pd}); !errors.Is(err, ErrInvalidRequest) {
			t.Errorf("attach with private_data %q: %v", pd, err)
		}
	}
	if _, err := p.Attach(ctx, volume.AttachRequest{VolumeID: "v", VolumeBaseDir: "relative"}); !errors.Is(err, ErrInvalidRequest) {
		t.Errorf("attach with relative base dir: %v", err)
	}
	// The credentials must never be reachable from a sandbox.
	inside := e.plugin(t, EnvStateDir+"="+filepath.Join(e.base, "state"))
	if _, err := inside.Attach(ctx, volume.AttachRequest{VolumeID: "v", VolumeBaseDir: e.base}); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("attach with state dir inside base dir: %v, want ErrInvalidConfig", err)
	}
	assertGone(t, filepath.Join(e.base, "s3-v"))
}

func TestPasswdFileMode(t *testing.T) {
	e := setup(t)
	p := e.plugin(t)
	cr := create(t, p, "pw")
	a := attach(t, p, e.base, "pw", 0, cr.PrivateData)
	defer detach(t, p, "pw", 0, a.Metadata)
	st, err := os.Stat(filepath.Join(e.stateDir, "passwd-s3fs"))
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o600 {
		t.Errorf("passwd file mode %v, want 0600", st.Mode().Perm())
	}
	// Nothing credential-like under the base dir.
	_ = filepath.WalkDir(e.base, func(path string, d os.DirEntry, err error) error {
		if err == nil && strings.Contains(d.Name(), "passwd") {
			t.Errorf("credentials-like file under base dir: %s", path)
		}
		return nil
	})
}

// An endpoint that accepts connections but never answers: the mount
// timeout bounds Attach, and the half-started s3fs is torn down.
func TestAttachHangingEndpointTimesOut(t *testing.T) {
	s3test.RequireS3FS(t)
	base, state := t.TempDir(), t.TempDir()
	s3test.CleanupMounts(t, base)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		var held []net.Conn
		defer func() {
			for _, c := range held {
				c.Close()
			}
		}()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			held = append(held, c)
		}
	}()
	const timeout = 3 * time.Second
	cfg, err := LoadConfig("", []string{
		EnvEndpoint + "=http://" + l.Addr().String(), EnvBucket + "=b", EnvAccessKey + "=AK", EnvSecretKey + "=SK",
		EnvStateDir + "=" + state, EnvMountTimeout + "=" + timeout.String(),
		EnvConfig + "=" + emptyConfig(t),
	})
	if err != nil {
		t.Fatal(err)
	}
	p, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err = p.Attach(ctxT(t, time.Minute), volume.AttachRequest{
		SandboxID: "sb", Namespace: volume.Namespace, VolumeID: "v", VolumeBaseDir: base,
	})
	took := time.Since(start)
	t.Logf("attach to a hanging endpoint failed after %s: %.300v", took.Round(time.Millisecond), err)
	if !errors.Is(err, ErrMountTimeout) || !errors.Is(err, volume.ErrPluginTimeout) || !errors.Is(err, ErrMount) {
		t.Fatalf("err = %v, want ErrMountTimeout", err)
	}
	if took > timeout+3*time.Second {
		t.Errorf("attach took %s, mount timeout is %s", took, timeout)
	}
	waitFor(t, 5*time.Second, func() bool { return len(s3fsPIDs(filepath.Join(base, "s3-v"))) == 0 })
	assertGone(t, filepath.Join(base, "s3-v"))
}
