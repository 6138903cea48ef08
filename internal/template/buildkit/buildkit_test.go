package buildkit

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/image"
	"github.com/cubicle-dev/cubicle/internal/testenv"
)

// buildkitdBinary finds bin/buildkitd (make build) or builds it once into the
// user cache. A buildkitd that fails to build fails the test: it is a
// dependency in go.mod, so failing to build it is a defect, not a missing
// host feature.
func buildkitdBinary(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("CUBICLE_BUILDKITD"); p != "" {
		return p
	}
	if p, err := filepath.Abs("../../../bin/buildkitd"); err == nil {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		t.Fatalf("no buildkitd and no cache dir to build it into: %v", err)
	}
	p := filepath.Join(cache, "cubicle-test", "buildkitd")
	if _, err := os.Stat(p); err == nil {
		return p
	}
	t.Logf("building buildkitd into %s (a few minutes, once)", p)
	cmd := exec.Command("go", "build", "-o", p, "github.com/moby/buildkit/cmd/buildkitd")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("cannot build buildkitd: %v\n%s", err, out)
	}
	return p
}

// smallRootfs is a busybox-only tree: enough for /bin/sh, echo, cat, false.
func smallRootfs(t *testing.T) string {
	t.Helper()
	bb := testenv.LookPath(t, "busybox")
	dir := t.TempDir()
	for _, d := range []string{"bin", "etc", "tmp", "proc", "sys", "dev"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	b, err := os.ReadFile(bb)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "bin/busybox"), b, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"sh", "echo", "cat", "false", "true", "ls", "wget", "ip"} {
		if err := os.Symlink("busybox", filepath.Join(dir, "bin", n)); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// testNetns makes an empty network namespace (loopback only) for the
// builder, removed at cleanup.
func testNetns(t *testing.T) string {
	t.Helper()
	name := fmt.Sprintf("cubicle-bktest-%d", os.Getpid())
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add: %v: %s", err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("ip", "netns", "del", name).CombinedOutput(); err != nil {
			t.Errorf("ip netns del: %v: %s", err, out)
		}
	})
	return "/run/netns/" + name
}

type env struct {
	store *image.Store
	reg   string // 127.0.0.1:PORT
	d     *Daemon
	root  string
	ctx   string // build context dir
}

func setup(t *testing.T) *env {
	t.Helper()
	testenv.RequireRoot(t, "runc, overlay mounts")
	bin := buildkitdBinary(t)
	st, err := image.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	// The registry takes a password, as serve's does: BuildKit must present
	// it through the build session for every pull and push below.
	ocireg := image.NewRegistry(st)
	ocireg.RequireBasicAuth("cubicle", "s3cret")
	srv := &http.Server{Handler: ocireg}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	reg := ln.Addr().String()
	if resp, err := http.Get("http://" + reg + "/v2/"); err != nil || resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("anonymous registry request: %v %v", resp, err)
	}

	t0 := time.Now()
	if err := st.ImportRootfs(reg+"/cubicle/base:latest", smallRootfs(t)); err != nil {
		t.Fatal(err)
	}
	t.Logf("import small rootfs: %v", time.Since(t0))

	// Short path: unix sockets are limited to 108 bytes.
	root, err := os.MkdirTemp("", "bk-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		UnmountUnder(root)
		os.RemoveAll(root)
	})
	var logger *slog.Logger
	if testing.Verbose() {
		logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	t0 = time.Now()
	d, err := Start(context.Background(), Config{
		Binary:             bin,
		Root:               root,
		NetNS:              testNetns(t),
		InsecureRegistries: []string{reg},
		RegistryAuth:       map[string]Credentials{reg: {Username: "cubicle", Password: "s3cret"}},
		Logger:             logger,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	t.Logf("buildkitd ready in %v: %s %s", time.Since(t0), bin, strings.Join(d.Args(), " "))

	ctxDir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(ctxDir, "ctx"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(ctxDir, "ctx/hello.txt"), []byte("hello from context\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return &env{store: st, reg: reg, d: d, root: root, ctx: ctxDir}
}

func httpGet(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

type logSink struct {
	mu   sync.Mutex
	logs []Log
}

func (s *logSink) add(l Log) {
	s.mu.Lock()
	s.logs = append(s.logs, l)
	s.mu.Unlock()
}

func (s *logSink) find(sub string) (Log, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, l := range s.logs {
		if strings.Contains(l.Message, sub) {
			return l, true
		}
	}
	return Log{}, false
}

func (s *logSink) dump(t *testing.T) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, l := range s.logs {
		t.Logf("  [%s step=%d] %s", l.Level, l.Step, l.Message)
	}
}

func TestBuild(t *testing.T) {
	e := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	df := "FROM " + e.reg + "/cubicle/base:latest\nCOPY ctx/hello.txt /hello.txt\nRUN echo built > /etc/built && cat /hello.txt\n"
	push := e.reg + "/cubicle/tpl_x:bld_1"

	var sink logSink
	t0 := time.Now()
	dgst, err := e.d.Build(ctx, BuildRequest{Dockerfile: []byte(df), ContextDir: e.ctx, Push: push}, sink.add)
	if err != nil {
		sink.dump(t)
		t.Fatal(err)
	}
	t.Logf("first build (cold cache): %v, digest %s", time.Since(t0), dgst)

	desc, err := e.store.Resolve(push)
	if err != nil {
		t.Fatal(err)
	}
	if desc.Digest.String() != dgst {
		t.Fatalf("store has %s, build returned %s", desc.Digest, dgst)
	}
	dest := filepath.Join(t.TempDir(), "rootfs")
	if err := e.store.Unpack(push, dest); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(dest, "etc/built")); err != nil || string(b) != "built\n" {
		t.Errorf("/etc/built = %q, %v", b, err)
	}
	if b, err := os.ReadFile(filepath.Join(dest, "hello.txt")); err != nil || string(b) != "hello from context\n" {
		t.Errorf("/hello.txt = %q, %v", b, err)
	}
	if l, ok := sink.find("hello from context"); !ok || l.Step != 2 {
		sink.dump(t)
		t.Errorf("RUN output line = %+v, %v; want step 2", l, ok)
	}
	if l, ok := sink.find("COPY ctx/hello.txt"); !ok || l.Step != 1 {
		t.Errorf("COPY line = %+v, %v; want step 1", l, ok)
	}

	t.Run("cached", func(t *testing.T) {
		var sink logSink
		t0 := time.Now()
		if _, err := e.d.Build(ctx, BuildRequest{Dockerfile: []byte(df), ContextDir: e.ctx, Push: e.reg + "/cubicle/tpl_x:bld_2"}, sink.add); err != nil {
			t.Fatal(err)
		}
		t.Logf("rebuild (warm cache): %v", time.Since(t0))
		if _, ok := sink.find("CACHED [3/3] RUN"); !ok {
			sink.dump(t)
			t.Error("RUN was not cached on an identical rebuild")
		}
	})

	t.Run("nocache", func(t *testing.T) {
		var sink logSink
		t0 := time.Now()
		if _, err := e.d.Build(ctx, BuildRequest{Dockerfile: []byte(df), ContextDir: e.ctx, NoCache: true, Push: e.reg + "/cubicle/tpl_x:bld_3"}, sink.add); err != nil {
			t.Fatal(err)
		}
		t.Logf("rebuild with NoCache: %v", time.Since(t0))
		if _, ok := sink.find("CACHED [3/3] RUN"); ok {
			t.Error("RUN cached despite NoCache")
		}
		if _, ok := sink.find("hello from context"); !ok {
			sink.dump(t)
			t.Error("RUN did not run again")
		}
	})

	t.Run("failing run", func(t *testing.T) {
		var sink logSink
		bad := "FROM " + e.reg + "/cubicle/base:latest\nRUN echo before\nRUN false\n"
		_, err := e.d.Build(ctx, BuildRequest{Dockerfile: []byte(bad), Push: e.reg + "/cubicle/tpl_x:bad"}, sink.add)
		if !errors.Is(err, ErrBuildFailed) {
			t.Fatalf("err = %v, want ErrBuildFailed", err)
		}
		var be *BuildError
		if !errors.As(err, &be) || be.Step != 2 || be.Instruction != "RUN false" {
			t.Fatalf("BuildError = %+v", be)
		}
		t.Logf("failure: %v", err)
		if !strings.Contains(err.Error(), "RUN false") {
			t.Errorf("message does not name the instruction: %v", err)
		}
		if _, err := e.store.Resolve(e.reg + "/cubicle/tpl_x:bad"); !errors.Is(err, image.ErrNotFound) {
			t.Errorf("failed build was pushed: %v", err)
		}
	})

	t.Run("run as a missing user", func(t *testing.T) {
		bad := "FROM " + e.reg + "/cubicle/base:latest\nUSER ghost\nRUN true\nUSER root\n"
		_, err := e.d.Build(ctx, BuildRequest{Dockerfile: []byte(bad), Push: e.reg + "/cubicle/tpl_x:ghost"}, nil)
		var uu *UnknownUserError
		if !errors.As(err, &uu) || uu.User != "ghost" || !errors.Is(err, ErrBuildFailed) {
			t.Fatalf("err = %v, want an UnknownUserError for ghost", err)
		}
		var be *BuildError
		if !errors.As(err, &be) || be.Step != 2 {
			t.Fatalf("BuildError = %+v, want step 2 (the RUN)", be)
		}
		t.Logf("failure: %v", err)
	})

	t.Run("secret", func(t *testing.T) {
		sec := "FROM " + e.reg + "/cubicle/base:latest\nRUN --mount=type=secret,id=tok cat /run/secrets/tok > /tok\n"
		push := e.reg + "/cubicle/tpl_x:sec"
		if _, err := e.d.Build(ctx, BuildRequest{Dockerfile: []byte(sec), Push: push, Secrets: map[string][]byte{"tok": []byte("s3cret")}}, nil); err != nil {
			t.Fatal(err)
		}
		dest := filepath.Join(t.TempDir(), "rootfs")
		if err := e.store.Unpack(push, dest); err != nil {
			t.Fatal(err)
		}
		if b, _ := os.ReadFile(filepath.Join(dest, "tok")); string(b) != "s3cret" {
			t.Errorf("/tok = %q", b)
		}
	})

	// The builder's boundary (docs/templates.md): buildkitd is an
	// unprivileged host uid, RUN steps map to the same range, and they
	// reach neither the host's loopback (a listener this test serves there)
	// nor the registry relay, which answers buildkitd alone, nor see the
	// host's interfaces.
	t.Run("boundary", func(t *testing.T) {
		uids := testenv.ProcUids(t, e.d.PID())
		want := fmt.Sprint(DefaultUserNSBase)
		for _, u := range uids {
			if u != want {
				t.Fatalf("buildkitd (pid %d) host uids %v, want all %s", e.d.PID(), uids, want)
			}
		}
		hostLn, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		hostSrv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte("HOST-LOOPBACK-SECRET")) })}
		go hostSrv.Serve(hostLn)
		defer hostSrv.Close()
		if b := httpGet(t, "http://"+hostLn.Addr().String()+"/"); b != "HOST-LOOPBACK-SECRET" { // positive control
			t.Fatalf("host listener answers %q", b)
		}
		probe := "FROM " + e.reg + "/cubicle/base:latest\n" +
			"RUN echo uidmap: $(cat /proc/self/uid_map) && " +
			"(wget -O- http://" + hostLn.Addr().String() + "/ ; echo host-rc=$?) && " +
			"(wget -O- http://" + e.reg + "/v2/ ; echo registry-rc=$?) && " +
			"echo links: $(ip -o link | cut -d: -f2) && ls /sys/class/net ; echo sys-rc=$?\n"
		var sink logSink
		if _, err := e.d.Build(ctx, BuildRequest{Dockerfile: []byte(probe), NoCache: true, Push: e.reg + "/cubicle/tpl_x:probe"}, sink.add); err != nil {
			sink.dump(t)
			t.Fatal(err)
		}
		if testing.Verbose() {
			sink.dump(t)
		}
		if _, ok := sink.find("uidmap: 0 " + want + " 65536"); !ok {
			sink.dump(t)
			t.Errorf("RUN step's uid 0 is not host uid %s", want)
		}
		// Not a bare "401": the step's own command line, which the log
		// echoes, holds random ports that may contain it.
		for _, leak := range []string{"HOST-LOOPBACK-SECRET", "host-rc=0", "registry-rc=0", "401 Unauthorized", "Unauthorized", "sys-rc=0"} {
			if l, ok := sink.find(leak); ok {
				sink.dump(t)
				t.Errorf("RUN step output %q shows %q", l.Message, leak)
			}
		}
		l, ok := sink.find("links:")
		if !ok {
			sink.dump(t)
			t.Fatal("no link list")
		}
		ifs, err := net.Interfaces()
		if err != nil {
			t.Fatal(err)
		}
		for _, ifc := range ifs {
			if ifc.Name != "lo" && strings.Contains(l.Message, " "+ifc.Name) {
				t.Errorf("RUN step sees host interface %s: %s", ifc.Name, l.Message)
			}
		}
	})

	t.Run("restart after crash", func(t *testing.T) {
		pid := e.d.PID()
		if pid == 0 {
			t.Fatal("no pid")
		}
		// Our own child: killing it is how a crash looks to the supervisor.
		syscall.Kill(pid, syscall.SIGKILL)
		deadline := time.Now().Add(30 * time.Second)
		for e.d.Starts() < 2 && time.Now().Before(deadline) {
			time.Sleep(50 * time.Millisecond)
		}
		if e.d.Starts() < 2 {
			t.Fatal("not restarted")
		}
		if _, err := e.d.Build(ctx, BuildRequest{Dockerfile: []byte(df), ContextDir: e.ctx, Push: e.reg + "/cubicle/tpl_x:bld_4"}, nil); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("close", func(t *testing.T) {
		pid := e.d.PID()
		if err := e.d.Close(); err != nil {
			t.Fatal(err)
		}
		if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
			t.Errorf("buildkitd pid %d still exists (kill 0: %v)", pid, err)
		}
		if mps, _ := mountsUnder(e.root); len(mps) != 0 {
			t.Errorf("mounts left under %s: %v", e.root, mps)
		}
		if _, err := e.d.Build(ctx, BuildRequest{Dockerfile: []byte(df), Push: push}, nil); !errors.Is(err, ErrNotRunning) {
			t.Errorf("Build after Close: %v", err)
		}
	})
}
