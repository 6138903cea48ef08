package oci

import (
	"context"
	"os"
	"path/filepath"
	"reflect"
	goruntime "runtime"
	"slices"
	"strings"
	"testing"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/cubicle-dev/cubicle/internal/runtime"
	"github.com/cubicle-dev/cubicle/internal/runtime/runtimetest"
	"github.com/cubicle-dev/cubicle/internal/testenv"
)

// runsc gets Docker's profile with only what gVisor cannot enforce as
// written changed: clone3's ENOSYS becomes a no-tracer TRACE, and ptrace
// may not ask for seccomp events. Every other rule is the same.
func TestRunscSeccompMatchesDefault(t *testing.T) {
	def, err := DefaultSeccomp()
	if err != nil {
		t.Fatal(err)
	}
	gv, err := RunscSeccomp()
	if err != nil {
		t.Fatal(err)
	}
	if gv.DefaultAction != def.DefaultAction || !reflect.DeepEqual(gv.DefaultErrnoRet, def.DefaultErrnoRet) ||
		!reflect.DeepEqual(gv.Architectures, def.Architectures) {
		t.Errorf("runsc profile header differs: %+v", gv)
	}
	strip := func(p *specs.LinuxSeccomp) (rest []specs.LinuxSyscall, clone3 []specs.LinuxSyscall, ptrace []specs.LinuxSyscall) {
		for _, s := range p.Syscalls {
			switch {
			case slices.Equal(s.Names, []string{"clone3"}):
				clone3 = append(clone3, s)
			case slices.Contains(s.Names, "ptrace"):
				ptrace = append(ptrace, s)
				if s.Names = slices.DeleteFunc(slices.Clone(s.Names), func(n string) bool { return n == "ptrace" }); len(s.Names) > 0 {
					rest = append(rest, s)
				}
			default:
				rest = append(rest, s)
			}
		}
		return
	}
	defRest, defClone3, defPtrace := strip(def)
	gvRest, gvClone3, gvPtrace := strip(gv)
	if !reflect.DeepEqual(defRest, gvRest) {
		t.Errorf("runsc profile changes rules other than clone3 and ptrace")
	}
	if len(defClone3) != 1 || defClone3[0].Action != specs.ActErrno || defClone3[0].ErrnoRet == nil || *defClone3[0].ErrnoRet != 38 {
		t.Errorf("runc clone3 rule %+v, want ERRNO(ENOSYS)", defClone3)
	}
	if len(gvClone3) != 1 || gvClone3[0].Action != specs.ActTrace || gvClone3[0].ErrnoRet != nil {
		t.Errorf("runsc clone3 rule %+v, want TRACE", gvClone3)
	}
	if len(defPtrace) != 1 || len(defPtrace[0].Args) != 0 {
		t.Fatalf("Docker's ptrace rule changed: %+v", defPtrace)
	}
	// Each request number from 0 to 0x4300 is allowed unless it can turn on
	// PTRACE_O_TRACESECCOMP, and then only without that bit.
	allowed := func(req, data uint64) bool {
		for _, r := range gvPtrace {
			ok := r.Action == specs.ActAllow
			for _, a := range r.Args {
				v := req
				if a.Index == 3 {
					v = data
				}
				switch a.Op {
				case specs.OpEqualTo:
					ok = ok && v == a.Value
				case specs.OpLessThan:
					ok = ok && v < a.Value
				case specs.OpGreaterThan:
					ok = ok && v > a.Value
				case specs.OpMaskedEqual:
					ok = ok && v&a.Value == a.ValueTwo
				default:
					t.Fatalf("unexpected op %v", a.Op)
				}
			}
			if ok {
				return true
			}
		}
		return false
	}
	for req := uint64(0); req < 0x4300; req++ {
		seizeOrSet := req == ptraceSetOptions || req == ptraceSeize
		if !allowed(req, 0x1) {
			t.Fatalf("ptrace(%#x) refused", req)
		}
		if got := allowed(req, ptraceOTraceSeccomp|0x1); got == seizeOrSet {
			t.Fatalf("ptrace(%#x, data with TRACESECCOMP) allowed=%v", req, got)
		}
	}
	for _, s := range gv.Syscalls {
		if s.ErrnoRet != nil && *s.ErrnoRet != 1 {
			t.Errorf("runsc rule %v keeps errnoRet %d, which runsc turns into EPERM", s.Names, *s.ErrnoRet)
		}
	}

	// The driver hands each runtime its own.
	for rt, want := range map[string]*specs.LinuxSeccomp{"runc": def, "crun": def, "runsc": gv} {
		d := &Driver{cfg: Config{Runtime: rt, CgroupParent: "cubicle"}}
		s, err := d.buildSpec(runtime.Spec{ID: "abc", Args: []string{"/a"}}, "/r", 0)
		if err != nil {
			t.Fatal(err)
		}
		if s.Linux.Seccomp != want {
			t.Errorf("%s: spec carries the wrong seccomp profile", rt)
		}
	}
}

// A profile runsc would silently weaken is refused, not passed on.
func TestForGVisorRefusesWhatRunscCannotKeep(t *testing.T) {
	u := func(v uint) *uint { return &v }
	for name, p := range map[string]*specs.LinuxSeccomp{
		"defaultErrnoRet": {DefaultAction: specs.ActErrno, DefaultErrnoRet: u(13)},
		"errnoRet EACCES": {DefaultAction: specs.ActErrno, Syscalls: []specs.LinuxSyscall{{Names: []string{"bpf"}, Action: specs.ActErrno, ErrnoRet: u(13)}}},
		"own TRACE":       {DefaultAction: specs.ActErrno, Syscalls: []specs.LinuxSyscall{{Names: []string{"bpf"}, Action: specs.ActTrace}}},
		"ptrace with args": {DefaultAction: specs.ActErrno, Syscalls: []specs.LinuxSyscall{{Names: []string{"ptrace"}, Action: specs.ActAllow,
			Args: []specs.LinuxSeccompArg{{Index: 0, Value: 0, Op: specs.OpEqualTo}}}}},
	} {
		if _, err := forGVisor(p); err == nil {
			t.Errorf("%s: forGVisor accepted %+v", name, p)
		}
	}
}

// gVisor ignores set-ID bits unless told otherwise; sudo needs them.
func TestRunscGlobalArgs(t *testing.T) {
	d := &Driver{cfg: Config{Runtime: "runsc", StateDir: "/s", RunscFlags: []string{"--allow-suid=false"}}}
	a := d.globalArgs()
	i, j := slices.Index(a, "--allow-suid"), slices.Index(a, "--allow-suid=false")
	if !slices.Contains(a, "--oci-seccomp") || i < 0 || j < i {
		t.Errorf("runsc args %v: want --oci-seccomp and --allow-suid, RunscFlags last", a)
	}
	if a := (&Driver{cfg: Config{Runtime: "runc", StateDir: "/s"}}).globalArgs(); slices.Contains(a, "--allow-suid") {
		t.Errorf("runc args %v", a)
	}
}

// On the real base image (glibc 2.36: threads start with clone3), as root
// and as user: Python threads start, sudo works, a setuid copy of id
// elevates in the rootfs but not from a nosuid bind mount.
func TestBaseImageThreadsAndSetuid(t *testing.T) {
	images := os.Getenv("CUBICLE_IMAGES_DIR")
	if images == "" {
		images = "/var/lib/cubicle/images"
	}
	base := filepath.Join(images, "base", "rootfs")
	if _, err := os.Stat(filepath.Join(base, "usr", "bin", "python3")); err != nil {
		testenv.Skipf(t, "base image not installed under %s (scripts/install builds it)", images)
	}
	const script = `
py='import threading; t=threading.Thread(target=print, args=("ok",)); t.start(); t.join()'
asuser() { setpriv --reuid=1000 --regid=1000 --clear-groups "$@"; }
python3 -c "$py" > /out/threads.root 2>&1
asuser python3 -c "$py" > /out/threads.user 2>&1
asuser sudo -n id -u > /out/sudo 2>/out/sudo.err
for d in /usr/local/bin /tmp; do cp /usr/bin/id $d/id-suid && chmod 4755 $d/id-suid; done
asuser /usr/local/bin/id-suid -u > /out/suid.rootfs 2>&1
asuser /tmp/id-suid -u > /out/suid.tmp 2>&1
asuser /vol/id-suid -u > /out/suid.nosuid 2>&1
echo done > /out/done
exec sleep 3600
`
	for _, c := range []struct {
		name, rt string
		userns   bool
	}{{"runc", "runc", false}, {"runc-userns", "runc", true}, {"runsc", "runsc", false}, {"runsc-userns", "runsc", true}} {
		t.Run(c.name, func(t *testing.T) {
			env := newTestEnvWith(t, c.rt, c.userns)
			out, vol := filepath.Join(env.base, "out"), filepath.Join(env.base, "vol")
			for _, d := range []string{out, vol} {
				if err := os.Mkdir(d, 0o777); err != nil {
					t.Fatal(err)
				}
				os.Chmod(d, 0o777)
			}
			idBin, err := os.ReadFile(filepath.Join(base, "usr", "bin", "id"))
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(vol, "id-suid"), idBin, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(filepath.Join(vol, "id-suid"), 0o4755); err != nil {
				t.Fatal(err)
			}
			id := runtimetest.NewID(t)
			ctx := context.Background()
			_, err = env.d.Create(ctx, runtime.Spec{
				ID: id, Layers: []string{base}, Args: []string{"/bin/bash", "-c", script},
				Mounts:    []runtime.Mount{{Source: out, Destination: "/out"}, {Source: vol, Destination: "/vol"}},
				Resources: runtime.Resources{MemoryMB: 256, PIDs: 256},
			})
			t.Cleanup(func() { env.d.Delete(context.Background(), id) })
			if err != nil {
				t.Fatalf("Create: %v", err)
			}
			deadline := time.Now().Add(60 * time.Second)
			for {
				if _, err := os.Stat(filepath.Join(out, "done")); err == nil {
					break
				}
				if time.Now().After(deadline) {
					log, _ := os.ReadFile(env.d.ConsoleLog(id))
					t.Fatalf("script did not finish: %s", log)
				}
				time.Sleep(50 * time.Millisecond)
			}
			read := func(name string) string {
				b, _ := os.ReadFile(filepath.Join(out, name))
				return strings.TrimSpace(string(b))
			}
			for f, want := range map[string]string{
				"threads.root": "ok", "threads.user": "ok", // clone3 -> ENOSYS -> clone
				"sudo":        "0",    // setuid honoured on the rootfs
				"suid.rootfs": "0",    // a set-ID file the sandbox made itself
				"suid.tmp":    "0",    // /tmp too (runsc binds it separately)
				"suid.nosuid": "1000", // bind mounts are nosuid
			} {
				if got := read(f); got != want {
					t.Errorf("%s = %q, want %q (sudo stderr: %q)", f, got, want, read("sudo.err"))
				}
			}
		})
	}
}

// The profile lists x86_64 and the 32-bit ABI, and x32 only where the
// kernel runs x32 syscalls (each listed architecture is compiled by runc
// at every sandbox start).
func TestSeccompArchitectures(t *testing.T) {
	if goruntime.GOARCH != "amd64" {
		t.Skip("the architecture list is checked on amd64 hosts, which CI is")
	}
	p, err := DefaultSeccomp()
	if err != nil {
		t.Fatal(err)
	}
	want := []specs.Arch{specs.ArchX86_64, specs.ArchX86}
	if x32Runs() {
		want = append(want, specs.ArchX32)
	}
	if !slices.Equal(p.Architectures, want) {
		t.Fatalf("architectures %v, want %v (x32 runs here: %v)", p.Architectures, want, x32Runs())
	}
}
