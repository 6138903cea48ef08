package oci

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/cubicle-dev/cubicle/internal/diskstore"
	"github.com/cubicle-dev/cubicle/internal/diskstore/diskstoretest"
	"github.com/cubicle-dev/cubicle/internal/runtime"
	"github.com/cubicle-dev/cubicle/internal/runtime/runtimetest"
	"github.com/cubicle-dev/cubicle/internal/testenv"
)

// testEnv is one driver with private dirs and cgroup parent; everything it
// made is removed on cleanup.
type testEnv struct {
	d      *Driver
	base   string
	layers []string
}

func newTestEnv(tb testing.TB, rt string) *testEnv {
	return newTestEnvWith(tb, rt, false)
}

func newTestEnvWith(tb testing.TB, rt string, userns bool) *testEnv {
	tb.Helper()
	return newTestEnvOpts(tb, rt, envOpts{userns: userns})
}

// envOpts: userns as Config.UserNS; reflink gives the driver a reflink
// disk store (serve's default) instead of an image formatted per create.
type envOpts struct{ userns, reflink bool }

func newTestEnvOpts(tb testing.TB, rt string, o envOpts) *testEnv {
	tb.Helper()
	userns := o.userns
	testenv.RequireRoot(tb, "runc, cgroups, mounts")
	bin := testenv.LookPath(tb, rt)
	// Outside /tmp: some gVisor setups refuse bundles/rootfs on tmpfs /tmp.
	base, err := os.MkdirTemp("/var/tmp", "cubicle-test-")
	if err != nil {
		tb.Fatal(err)
	}
	// As a data dir is: traversable, so runc in a user namespace gets in.
	if err := os.Chmod(base, 0o711); err != nil {
		tb.Fatal(err)
	}
	parent := fmt.Sprintf("cubicle-test-%d-%s", os.Getpid(), rt)
	var disks *diskstore.Store
	if o.reflink {
		disks = diskstoretest.Open(tb, base)
	}
	d, err := New(Config{
		Disks:        disks,
		Runtime:      rt,
		BinaryPath:   bin,
		StateDir:     filepath.Join(base, "run", rt),
		SandboxDir:   filepath.Join(base, "sandboxes"),
		CgroupParent: parent,
		UserNS:       userns,
	})
	if errors.Is(err, ErrHostUnsupported) {
		// CI's hosts support every runtime the suites run (runc with and
		// without user namespaces, runsc, crun); elsewhere this is a host
		// limit, not a defect.
		if disks != nil {
			diskstoretest.Close(tb, disks)
		}
		os.RemoveAll(base)
		testenv.Skip(tb, err)
	}
	if err != nil {
		if disks != nil {
			diskstoretest.Close(tb, disks)
		}
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
		if disks != nil {
			diskstoretest.Close(tb, disks)
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

// The same suite with each sandbox in a user namespace of its own.
func TestRuncUsernsSuite(t *testing.T) {
	env := newTestEnvOpts(t, "runc", envOpts{userns: true, reflink: true})
	runtimetest.RunDriverSuiteWith(t, env.d, env.layers, runtimetest.Options{UserNS: true})
}

func TestRunscSuite(t *testing.T) {
	env := newTestEnv(t, "runsc")
	runtimetest.RunDriverSuiteWith(t, env.d, env.layers, runtimetest.Options{
		Timeout: 60 * time.Second, ScratchDir: env.base, HostPIDsOverhead: RunscPIDsOverhead,
	})
}

// The same with the sentry and gofer in a user namespace mapped to the
// sandbox's unprivileged range (serve's default). gVisor shows the
// application its own identity map, so the suite's uid_map check is the
// no-userns one; TestRunscUsernsSentry checks the host side.
func TestRunscUsernsSuite(t *testing.T) {
	env := newTestEnvOpts(t, "runsc", envOpts{userns: true, reflink: true})
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
	s, err := d.buildSpec(runtime.Spec{
		ID: "abc", Args: []string{"/a"}, NetNSPath: "/run/cubicle/netns/abc",
		Mounts:    []runtime.Mount{{Source: "/h", Destination: "/.cubicle/cubicle-agent", ReadOnly: true}},
		Resources: runtime.Resources{CPUCount: 2, MemoryMB: 512, PIDs: 1000},
	}, "/r", 0)
	if err != nil {
		t.Fatal(err)
	}
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
	if len(s.Process.Capabilities.Bounding) != 13 || slices.Contains(s.Process.Capabilities.Bounding, "CAP_NET_RAW") {
		t.Errorf("caps %v", s.Process.Capabilities.Bounding)
	}
	// An allow-list: unknown syscalls (io_uring today) fall to EPERM.
	sc := s.Linux.Seccomp
	if sc.DefaultAction != specs.ActErrno || sc.DefaultErrnoRet == nil || *sc.DefaultErrnoRet != 1 {
		t.Errorf("seccomp default %v %v, want ERRNO(EPERM)", sc.DefaultAction, sc.DefaultErrnoRet)
	}
	for _, r := range sc.Syscalls {
		if r.Action == specs.ActAllow && (slices.Contains(r.Names, "io_uring_setup") || slices.Contains(r.Names, "unshare") || slices.Contains(r.Names, "mount")) {
			t.Errorf("seccomp allows %v", r.Names)
		}
	}
}

func TestSpecDevices(t *testing.T) {
	d := &Driver{cfg: Config{Runtime: "runc", CgroupParent: "cubicle"}}
	s, err := d.buildSpec(runtime.Spec{
		ID: "abc", Args: []string{"/a"},
		Devices: []runtime.Device{
			{Path: "/dev/nvidia0", Type: 'c', Major: 195, Minor: 0},
			{Path: "/dev/sdz", Type: 'b', Major: 8, Minor: 3, FileMode: 0o600, UID: 1000, GID: 44},
		},
	}, "/r", 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Linux.Devices) != 2 {
		t.Fatalf("devices %+v", s.Linux.Devices)
	}
	d0, d1 := s.Linux.Devices[0], s.Linux.Devices[1]
	if d0.Path != "/dev/nvidia0" || d0.Type != "c" || d0.Major != 195 || d0.Minor != 0 || *d0.FileMode != 0o666 || *d0.UID != 0 {
		t.Errorf("dev0 %+v", d0)
	}
	if d1.Type != "b" || d1.Major != 8 || d1.Minor != 3 || *d1.FileMode != 0o600 || *d1.UID != 1000 || *d1.GID != 44 {
		t.Errorf("dev1 %+v", d1)
	}
	rules := s.Linux.Resources.Devices
	if rules[0].Allow || rules[0].Access != "rwm" {
		t.Fatalf("first rule is not deny-all: %+v", rules[0])
	}
	var found int
	for _, r := range rules[1:] {
		if r.Allow && r.Access == "rwm" && ((r.Type == "c" && *r.Major == 195 && *r.Minor == 0) || (r.Type == "b" && *r.Major == 8 && *r.Minor == 3)) {
			found++
		}
	}
	if found != 2 {
		t.Errorf("allow rules for the devices missing: %+v", rules)
	}
}

func TestCreateInvalidDevices(t *testing.T) {
	base := t.TempDir()
	for _, rt := range []string{"runc", "runsc"} {
		d := &Driver{cfg: Config{Runtime: rt, SandboxDir: base, StateDir: base, CommandTimeout: time.Second}}
		for _, dev := range []runtime.Device{
			{Path: "dev/x", Type: 'c', Major: 1, Minor: 7},
			{Path: "/etc/x", Type: 'c', Major: 1, Minor: 7},
			{Path: "/dev/../etc/x", Type: 'c', Major: 1, Minor: 7},
			{Path: "/dev/x", Type: 'p', Major: 1, Minor: 7},
			{Path: "/dev/x", Major: 1, Minor: 7},
		} {
			_, err := d.Create(context.Background(), runtime.Spec{ID: "abc", Layers: []string{"/l"}, Args: []string{"/a"}, Devices: []runtime.Device{dev}})
			want := ErrInvalidSpec
			if rt == "runsc" {
				want = runtime.ErrUnsupported
			}
			if !errors.Is(err, want) {
				t.Errorf("%s: Create(%+v) = %v, want %v", rt, dev, err, want)
			}
		}
		if ents, _ := os.ReadDir(base); len(ents) != 0 {
			t.Fatalf("%s: refused Create left %d entries", rt, len(ents))
		}
	}
	if (&Driver{cfg: Config{Runtime: "runsc"}}).SupportsDevices() || !(&Driver{cfg: Config{Runtime: "runc"}}).SupportsDevices() ||
		!(&Driver{cfg: Config{Runtime: "crun"}}).SupportsDevices() {
		t.Error("SupportsDevices: want runc/crun true, runsc false")
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
