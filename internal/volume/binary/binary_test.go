package binary_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cubicle-dev/cubicle/internal/testenv"
	"github.com/cubicle-dev/cubicle/internal/volume"
	"github.com/cubicle-dev/cubicle/internal/volume/binary"
	"github.com/cubicle-dev/cubicle/internal/volume/internal/mountinfo"
	"github.com/cubicle-dev/cubicle/internal/volume/local"
	"github.com/cubicle-dev/cubicle/internal/volume/pluginmain"
	"github.com/cubicle-dev/cubicle/internal/volume/plugintest"
)

// rootEnv makes this test binary act as a binary plugin (pluginmain over
// the local plugin) when a wrapper script re-executes it.
const rootEnv = "CUBICLE_TEST_LOCAL_PLUGIN_ROOT"

func TestMain(m *testing.M) {
	if root := os.Getenv(rootEnv); root != "" {
		os.Exit(pluginmain.RunBinary(context.Background(), os.Args[1:], os.Stdout, os.Stderr, local.New(root)))
	}
	os.Exit(m.Run())
}

func script(t *testing.T, name string) string {
	t.Helper()
	p, err := filepath.Abs(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

var bg = context.Background()

func attachReq(base string) volume.AttachRequest {
	return volume.AttachRequest{SandboxID: "sb", Namespace: volume.Namespace, VolumeID: "v", VolumeBaseDir: base}
}

func TestGoPluginConformance(t *testing.T) {
	testenv.RequireRoot(t, "the local plugin bind-mounts")
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	root, base, dir := t.TempDir(), t.TempDir(), t.TempDir()
	t.Cleanup(func() { unmountUnder(t, base) })
	wrapper := filepath.Join(dir, "local-plugin")
	body := fmt.Sprintf("#!/bin/sh\n%s=%q exec %q \"$@\"\n", rootEnv, root, self)
	if err := os.WriteFile(wrapper, []byte(body), 0o755); err != nil {
		t.Fatal(err)
	}
	plugintest.Run(t, binary.New(wrapper, 10*time.Second), plugintest.Options{BaseDir: base, ProbeFiles: true})
}

func TestShellPluginConformance(t *testing.T) {
	plugintest.Run(t, binary.New(script(t, "dirplugin.sh"), 5*time.Second), plugintest.Options{BaseDir: t.TempDir(), ProbeFiles: true})
}

func TestArgs(t *testing.T) {
	argsFile := filepath.Join(t.TempDir(), "args")
	t.Setenv("ARGS_FILE", argsFile)
	d := binary.New(script(t, "args.sh"), 5*time.Second)
	check := func(want ...string) {
		t.Helper()
		b, err := os.ReadFile(argsFile)
		if err != nil {
			t.Fatal(err)
		}
		if got := strings.Split(strings.TrimSuffix(string(b), "\n"), "\n"); strings.Join(got, "|") != strings.Join(want, "|") {
			t.Errorf("argv\n got %q\nwant %q", got, want)
		}
	}
	res, err := d.Create(bg, volume.CreateRequest{VolumeID: "v1", Name: "my vol"})
	if err != nil || res.Token != "tk" || res.PrivateData != "pd" {
		t.Fatalf("create: %+v %v", res, err)
	}
	check("--op", "create", "--volume-id", "v1", "--name", "my vol")

	if err := d.Destroy(bg, volume.DestroyRequest{VolumeID: "v1"}); err != nil {
		t.Fatal(err)
	}
	check("--op", "destroy", "--volume-id", "v1")

	ar := volume.AttachRequest{SandboxID: "sb-1", Namespace: "cubicle", VolumeID: "v1", RefCount: 0, VolumeBaseDir: "/data/v"}
	att, err := d.Attach(bg, ar)
	if err != nil || att.HostPath != "/x" || att.Metadata["k"] != "v" {
		t.Fatalf("attach: %+v %v", att, err)
	}
	check("--op", "attach", "--sandbox-id", "sb-1", "--namespace", "cubicle", "--volume-id", "v1", "--ref-count", "0", "--volume-base-dir", "/data/v")
	ar.RefCount, ar.PrivateData = 2, "volumes/v1/"
	if _, err := d.Attach(bg, ar); err != nil {
		t.Fatal(err)
	}
	check("--op", "attach", "--sandbox-id", "sb-1", "--namespace", "cubicle", "--volume-id", "v1", "--ref-count", "2", "--volume-base-dir", "/data/v", "--private-data", "volumes/v1/")

	err = d.Detach(bg, volume.DetachRequest{SandboxID: "sb-1", Namespace: "cubicle", VolumeID: "v1", RefCount: 1, Metadata: map[string]string{"mount_dir": "/data/v/x"}})
	if err != nil {
		t.Fatal(err)
	}
	check("--op", "detach", "--sandbox-id", "sb-1", "--namespace", "cubicle", "--volume-id", "v1", "--ref-count", "1", "--metadata", `{"mount_dir":"/data/v/x"}`)
	if err := d.Detach(bg, volume.DetachRequest{SandboxID: "s", VolumeID: "v"}); err != nil {
		t.Fatal(err)
	}
	check("--op", "detach", "--sandbox-id", "s", "--namespace", "", "--volume-id", "v", "--ref-count", "0", "--metadata", `{}`)
}

func TestCrash(t *testing.T) {
	_, err := binary.New(script(t, "crash.sh"), 5*time.Second).Create(bg, volume.CreateRequest{VolumeID: "v"})
	if !errors.Is(err, volume.ErrPlugin) {
		t.Fatalf("got %v", err)
	}
	if !strings.Contains(err.Error(), "SIGSEGV") || !strings.Contains(err.Error(), "about to crash") {
		t.Errorf("crash not described: %v", err)
	}
}

func TestFailStderrTail(t *testing.T) {
	err := binary.New(script(t, "fail.sh"), 5*time.Second).Destroy(bg, volume.DestroyRequest{VolumeID: "v"})
	if !errors.Is(err, volume.ErrPlugin) {
		t.Fatalf("got %v", err)
	}
	msg := err.Error()
	if !strings.Contains(msg, "exit status 3") || !strings.Contains(msg, "backend exploded: bucket missing") {
		t.Errorf("message: %v", msg)
	}
	if strings.Contains(msg, "noise line 0 ") || len(msg) > 3<<10 {
		t.Errorf("message holds more than the stderr tail (%d bytes)", len(msg))
	}
}

func TestErrorField(t *testing.T) {
	_, err := binary.New(script(t, "errfield.sh"), 5*time.Second).Create(bg, volume.CreateRequest{VolumeID: "v"})
	if !errors.Is(err, volume.ErrPlugin) || !strings.Contains(err.Error(), "quota exceeded") {
		t.Errorf("exit 0 + error field: %v", err)
	}
	err = binary.New(script(t, "errexit.sh"), 5*time.Second).Destroy(bg, volume.DestroyRequest{VolumeID: "v"})
	if !errors.Is(err, volume.ErrPlugin) || !strings.Contains(err.Error(), "volume is busy") || !strings.Contains(err.Error(), "exit status 1") {
		t.Errorf("exit 1 + error field: %v", err)
	}
}

func TestProtocolErrors(t *testing.T) {
	for _, s := range []string{"garbage.sh", "empty.sh", "huge.sh"} {
		err := binary.New(script(t, s), 5*time.Second).Destroy(bg, volume.DestroyRequest{VolumeID: "v"})
		if !errors.Is(err, volume.ErrProtocol) {
			t.Errorf("%s: got %v, want ErrProtocol", s, err)
		}
	}
	// Log lines before the answer are tolerated.
	res, err := binary.New(script(t, "logline.sh"), 5*time.Second).Create(bg, volume.CreateRequest{VolumeID: "v"})
	if err != nil || res.Token != "t" || res.PrivateData != "p" {
		t.Errorf("logline: %+v %v", res, err)
	}
	// Not executable / missing.
	if err := binary.New("/nonexistent/plugin", time.Second).Destroy(bg, volume.DestroyRequest{VolumeID: "v"}); !errors.Is(err, volume.ErrPlugin) {
		t.Errorf("missing binary: %v", err)
	}
}

func TestTimeoutKillsGroup(t *testing.T) {
	base := t.TempDir()
	start := time.Now()
	_, err := binary.New(script(t, "slow.sh"), time.Second).Attach(bg, attachReq(base))
	elapsed := time.Since(start)
	if !errors.Is(err, volume.ErrPluginTimeout) {
		t.Fatalf("got %v, want ErrPluginTimeout", err)
	}
	if !strings.Contains(err.Error(), "did not answer within 1s") {
		t.Errorf("message: %v", err)
	}
	if elapsed < 900*time.Millisecond || elapsed > 3*time.Second {
		t.Errorf("returned after %s, want ~1s", elapsed)
	}
	for _, f := range []string{"sh.pid", "sleep.pid"} {
		assertGone(t, readPid(t, filepath.Join(base, f)))
	}
}

func TestContextDeadline(t *testing.T) {
	base := t.TempDir()
	ctx, cancel := context.WithTimeout(bg, 300*time.Millisecond)
	defer cancel()
	_, err := binary.New(script(t, "slow.sh"), time.Minute).Attach(ctx, attachReq(base))
	if !errors.Is(err, volume.ErrPluginTimeout) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("got %v", err)
	}
	assertGone(t, readPid(t, filepath.Join(base, "sleep.pid")))

	ctx, cancel = context.WithCancel(bg)
	time.AfterFunc(200*time.Millisecond, cancel)
	_, err = binary.New(script(t, "slow.sh"), time.Minute).Attach(ctx, attachReq(base))
	if !errors.Is(err, context.Canceled) || errors.Is(err, volume.ErrPluginTimeout) {
		t.Fatalf("cancel: got %v", err)
	}
	assertGone(t, readPid(t, filepath.Join(base, "sleep.pid")))
}

func TestDaemonHoldingStdout(t *testing.T) {
	base := t.TempDir()
	t.Cleanup(func() {
		if pid, err := os.ReadFile(filepath.Join(base, "daemon.pid")); err == nil {
			if n, err := strconv.Atoi(strings.TrimSpace(string(pid))); err == nil {
				_ = syscall.Kill(n, syscall.SIGKILL)
				assertGone(t, n)
			}
		}
	})
	start := time.Now()
	res, err := binary.New(script(t, "daemon.sh"), 10*time.Second).Attach(bg, attachReq(base))
	if err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("attach waited %s for the daemon", d)
	}
	if res.HostPath != filepath.Join(base, "d") {
		t.Errorf("host_path %q", res.HostPath)
	}
	// The daemon must still be running: success must not kill the group.
	pid := readPid(t, filepath.Join(base, "daemon.pid"))
	if err := syscall.Kill(pid, 0); err != nil {
		t.Errorf("daemon was killed: %v", err)
	}
}

func TestConformanceViolations(t *testing.T) {
	r := plugintest.Check(bg, binary.New(script(t, "bigprivate.sh"), 5*time.Second), plugintest.Options{BaseDir: t.TempDir()})
	if r.OK() || !strings.Contains(strings.Join(r.Violations, "\n"), "private_data of 2000 bytes") {
		t.Errorf("2000-byte private_data not reported:\n%s", r)
	}
	r = plugintest.Check(bg, binary.New(script(t, "outside.sh"), 5*time.Second), plugintest.Options{BaseDir: t.TempDir()})
	if r.OK() || !strings.Contains(strings.Join(r.Violations, "\n"), "not inside volume_base_dir") {
		t.Errorf("host_path outside base not reported:\n%s", r)
	}
	r = plugintest.Check(bg, binary.New(script(t, "crash.sh"), 5*time.Second), plugintest.Options{BaseDir: t.TempDir()})
	if r.OK() || !strings.Contains(r.String(), "create failed") || !strings.Contains(r.String(), "destroy (cleanup)") {
		t.Errorf("crashing plugin:\n%s", r)
	}
}

func readPid(t *testing.T, path string) int {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// assertGone waits for pid to be gone; a zombie awaiting its reaper counts.
func assertGone(t *testing.T, pid int) {
	t.Helper()
	deadline := time.Now().Add(3 * time.Second)
	for {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			return
		}
		if f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:])); len(f) > 0 && f[0] == "Z" {
			return
		}
		if time.Now().After(deadline) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
			t.Errorf("process %d still running", pid)
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func unmountUnder(t *testing.T, dir string) {
	mps, err := mountinfo.Under(dir)
	if err != nil {
		t.Error(err)
	}
	for _, mp := range mps {
		t.Errorf("left mounted: %s", mp)
		_ = unix.Unmount(mp, unix.MNT_DETACH)
	}
}
