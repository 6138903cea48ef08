package oci

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/runtime"
	"github.com/cubicle-dev/cubicle/internal/runtime/runtimetest"
)

// testEnv is one driver with private dirs and cgroup parent; everything it
// made is removed on cleanup.
type testEnv struct {
	d      *Driver
	base   string
	layers []string
}

func newTestEnv(tb testing.TB, rt string) *testEnv {
	tb.Helper()
	if os.Geteuid() != 0 {
		tb.Skip("needs root")
	}
	bin, err := exec.LookPath(rt)
	if err != nil {
		if os.Getenv("CI") == "true" {
			tb.Fatalf("%s not installed (CI=true): %v", rt, err)
		}
		tb.Skipf("%s not installed", rt)
	}
	// Outside /tmp: some gVisor setups refuse bundles/rootfs on tmpfs /tmp.
	base, err := os.MkdirTemp("/var/tmp", "cubicle-test-")
	if err != nil {
		tb.Fatal(err)
	}
	parent := fmt.Sprintf("cubicle-test-%d-%s", os.Getpid(), rt)
	d, err := New(Config{
		Runtime:      rt,
		BinaryPath:   bin,
		StateDir:     filepath.Join(base, "run", rt),
		SandboxDir:   filepath.Join(base, "sandboxes"),
		CgroupParent: parent,
	})
	if errors.Is(err, ErrHostUnsupported) {
		os.RemoveAll(base)
		tb.Skip(err)
	}
	if err != nil {
		os.RemoveAll(base)
		tb.Fatal(err)
	}
	env := &testEnv{d: d, base: base, layers: []string{runtimetest.BusyboxRootfsIn(tb, base)}}
	tb.Cleanup(func() {
		ctx := context.Background()
		// Only containers under our own --root are touched.
		if l, err := d.List(ctx); err == nil {
			for _, i := range l {
				if err := d.Delete(ctx, i.ID); err != nil {
					tb.Errorf("cleanup %s: %v", i.ID, err)
				}
			}
		}
		if err := RemoveCgroupParent(parent); err != nil {
			tb.Errorf("cleanup cgroups: %v", err)
		}
		// runsc keeps a null-netns bind mount in its --root; it is ours.
		if err := unmountUnder(filepath.Join(base, "run")); err != nil {
			tb.Errorf("cleanup state mounts: %v", err)
		}
		if mps, _ := MountsUnder(base); len(mps) > 0 {
			tb.Errorf("mounts left under %s: %v", base, mps)
		} else {
			os.RemoveAll(base)
		}
	})
	return env
}

func TestRuncSuite(t *testing.T) {
	env := newTestEnv(t, "runc")
	runtimetest.RunDriverSuite(t, env.d, env.layers)
}

// crun is optional everywhere (not required in CI).
func TestCrunSuite(t *testing.T) {
	if _, err := exec.LookPath("crun"); err != nil {
		t.Skip("crun not installed")
	}
	env := newTestEnv(t, "crun")
	runtimetest.RunDriverSuite(t, env.d, env.layers)
}

func TestRunscSuite(t *testing.T) {
	env := newTestEnv(t, "runsc")
	runtimetest.RunDriverSuiteWith(t, env.d, env.layers, runtimetest.Options{
		Timeout: 60 * time.Second, ScratchDir: env.base, HostPIDsOverhead: RunscPIDsOverhead,
	})
}

func TestNew(t *testing.T) {
	if _, err := New(Config{Runtime: "docker", StateDir: "/x", SandboxDir: "/y"}); err == nil {
		t.Fatal("New accepted unknown runtime")
	}
	if _, err := New(Config{Runtime: "runc", StateDir: "rel", SandboxDir: "/y"}); err == nil {
		t.Fatal("New accepted relative StateDir")
	}
}

func TestSpecDefaults(t *testing.T) {
	d := &Driver{cfg: Config{Runtime: "runc", CgroupParent: "cubicle"}, cgroupNS: true}
	s := d.buildSpec(runtime.Spec{
		ID: "abc", Args: []string{"/a"}, NetNSPath: "/run/cubicle/netns/abc",
		Mounts:    []runtime.Mount{{Source: "/h", Destination: "/.cubicle/cubicle-agent", ReadOnly: true}},
		Resources: runtime.Resources{CPUCount: 2, MemoryMB: 512, PIDs: 1000},
	}, "/r")
	if s.Linux.CgroupsPath != "/cubicle/abc" {
		t.Errorf("cgroupsPath %q", s.Linux.CgroupsPath)
	}
	if *s.Linux.Resources.CPU.Quota != 200000 || *s.Linux.Resources.CPU.Period != 100000 {
		t.Errorf("cpu %+v", s.Linux.Resources.CPU)
	}
	if *s.Linux.Resources.Memory.Limit != 512<<20 || *s.Linux.Resources.Memory.Swap != 512<<20 {
		t.Errorf("memory %+v", s.Linux.Resources.Memory)
	}
	var netns string
	for _, n := range s.Linux.Namespaces {
		if n.Type == "network" {
			netns = n.Path
		}
	}
	if netns != "/run/cubicle/netns/abc" {
		t.Errorf("netns path %q", netns)
	}
	last := s.Mounts[len(s.Mounts)-1]
	if last.Destination != "/.cubicle/cubicle-agent" || !strings.Contains(strings.Join(last.Options, ","), "ro") {
		t.Errorf("agent mount %+v", last)
	}
	if len(s.Process.Capabilities.Bounding) != 14 {
		t.Errorf("caps %v", s.Process.Capabilities.Bounding)
	}
}

func TestUnescapeMountinfo(t *testing.T) {
	if got := unescapeMountinfo(`/a\040b\134c`); got != `/a b\c` {
		t.Fatalf("got %q", got)
	}
}

// BenchmarkCreateExec measures create -> first PID 1 output -> delete.
func BenchmarkCreateExec(b *testing.B) {
	for _, rt := range []string{"runc", "runsc"} {
		b.Run(rt, func(b *testing.B) {
			env := newTestEnv(b, rt)
			ctx := context.Background()
			var firstOut time.Duration
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				id := runtimetest.NewID(b)
				start := time.Now()
				if _, err := env.d.Create(ctx, runtime.Spec{
					ID: id, Layers: env.layers,
					Args: []string{"/bin/sh", "-c", "echo first-output; exec sleep 3600"},
				}); err != nil {
					env.d.Delete(ctx, id)
					b.Fatal(err)
				}
				deadline := time.Now().Add(30 * time.Second)
				for {
					out, _ := os.ReadFile(env.d.ConsoleLog(id))
					if strings.Contains(string(out), "first-output") {
						break
					}
					if time.Now().After(deadline) {
						env.d.Delete(ctx, id)
						b.Fatalf("no output from PID 1: %q", out)
					}
					time.Sleep(2 * time.Millisecond)
				}
				firstOut += time.Since(start)
				if err := env.d.Delete(ctx, id); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(firstOut.Milliseconds())/float64(b.N), "ms-to-first-output")
		})
	}
}
