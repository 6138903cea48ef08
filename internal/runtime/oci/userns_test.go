package oci

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/cubicle-dev/cubicle/internal/runtime"
	"github.com/cubicle-dev/cubicle/internal/runtime/runtimetest"
	"github.com/cubicle-dev/cubicle/internal/testenv"
)

// No two live sandboxes share a uid range; a freed range is reused; a
// restarted driver rebuilds the allocation from the sandbox dirs' owners.
func TestUsernsSlots(t *testing.T) {
	testenv.RequireRoot(t, "chown")
	dir := t.TempDir()
	d := &Driver{cfg: Config{Runtime: "runc", SandboxDir: dir, UserNS: true}, slots: map[string]int{}}
	mk := func(id string) {
		if err := os.Mkdir(filepath.Join(dir, id), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	base := map[string]uint32{}
	for _, id := range []string{"a", "b", "c"} {
		mk(id)
		b, err := d.allocSlot(id)
		if err != nil {
			t.Fatal(err)
		}
		base[id] = b
	}
	if base["a"] == base["b"] || base["b"] == base["c"] || base["a"] == base["c"] {
		t.Fatalf("ranges shared: %v", base)
	}
	for id, b := range base {
		if b < usernsBase || (b-usernsBase)%usernsSize != 0 {
			t.Errorf("%s: base %d not a slot start", id, b)
		}
	}
	os.Remove(filepath.Join(dir, "b"))
	d.freeSlot("b")
	mk("d")
	if b, err := d.allocSlot("d"); err != nil || b != base["b"] {
		t.Fatalf("freed range not reused: %d, %v (want %d)", b, err, base["b"])
	}

	d2 := &Driver{cfg: d.cfg, slots: map[string]int{}}
	if err := d2.loadSlots(); err != nil {
		t.Fatal(err)
	}
	if len(d2.slots) != 3 || d2.slots["a"] != d.slots["a"] || d2.slots["d"] != d.slots["d"] {
		t.Fatalf("reloaded slots %v, want %v", d2.slots, d.slots)
	}
	mk("e")
	if b, err := d2.allocSlot("e"); err != nil || b == base["a"] || b == base["c"] || b == base["b"] {
		t.Fatalf("after reload a live range was handed out again: %d, %v", b, err)
	}
}

// The spec for a user-namespaced sandbox: runc joins the namespace the
// driver made (by path) and is started in the sandbox's netns, which the
// spec then leaves out; runsc makes the namespace from the mappings for
// the sentry and gofer and keeps its own /sys and the netns path.
func TestSpecUserns(t *testing.T) {
	spec := runtime.Spec{ID: "abc", Args: []string{"/a"}, NetNSPath: "/run/cubicle/netns/abc"}
	ns := func(s *specs.Spec, typ specs.LinuxNamespaceType) (specs.LinuxNamespace, bool) {
		for _, n := range s.Linux.Namespaces {
			if n.Type == typ {
				return n, true
			}
		}
		return specs.LinuxNamespace{}, false
	}
	base := slotBase(3)
	for _, rt := range []string{"runc", "runsc"} {
		d := &Driver{cfg: Config{Runtime: rt, CgroupParent: "cubicle", SandboxDir: "/d", UserNS: true}}
		s, err := d.buildSpec(spec, "/r", base)
		if err != nil {
			t.Fatal(err)
		}
		if len(s.Linux.UIDMappings) != 1 || s.Linux.UIDMappings[0].HostID != base || s.Linux.UIDMappings[0].Size != usernsSize {
			t.Errorf("%s: uid mappings %+v", rt, s.Linux.UIDMappings)
		}
		user, ok := ns(s, specs.UserNamespace)
		netns, hasNet := ns(s, specs.NetworkNamespace)
		var sysBind bool
		for _, m := range s.Mounts {
			sysBind = sysBind || (m.Destination == "/sys" && m.Type == "bind")
		}
		switch rt {
		case "runc":
			if !ok || user.Path != "/d/abc/userns" {
				t.Errorf("runc: user namespace %+v, want joined at /d/abc/userns", user)
			}
			if hasNet || s.Annotations[annotationNetns] != spec.NetNSPath {
				t.Errorf("runc: netns entry %v, annotation %q; want none and the path", hasNet, s.Annotations[annotationNetns])
			}
			if len(s.Process.Rlimits) != 0 {
				t.Errorf("runc: rlimits %+v in the spec; runc cannot set them in this namespace", s.Process.Rlimits)
			}
		case "runsc":
			if !ok || user.Path != "" {
				t.Errorf("runsc: user namespace %+v, want one made from the mappings", user)
			}
			if !hasNet || netns.Path != spec.NetNSPath {
				t.Errorf("runsc: netns %+v", netns)
			}
			if sysBind {
				t.Error("runsc: the host's /sys is bound in")
			}
		}
	}
}

// What root reads back for a sandbox (the mounts it stages again, the
// bundle it runs, the console log it appends to, the disk image it
// mounts) lives in a root-only dir, never in the sandbox's own dir, which
// its host uid owns. Acting as that uid, a mounts.json planted in its dir
// does not change what root binds in when the stopped sandbox boots again,
// and the root-only dir cannot be written.
func TestPrivateStateRootOnly(t *testing.T) {
	env := newTestEnvWith(t, "runc", true)
	d := env.d
	ctx := context.Background()
	orig, secret := t.TempDir(), t.TempDir()
	for dir, name := range map[string]string{orig: "orig", secret: "secret"} {
		if err := os.Chmod(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	id := runtimetest.NewID(t)
	t.Cleanup(func() { d.Delete(context.Background(), id) })
	if _, err := d.Create(ctx, runtime.Spec{ID: id, Layers: env.layers, Args: []string{"/bin/sleep", "3600"},
		Mounts:    []runtime.Mount{{Source: orig, Destination: "/mnt/x"}},
		Resources: runtime.Resources{DiskMB: 16}}); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{filepath.Join(d.cfg.SandboxDir, privateDir), d.priv(id)} {
		fi, err := os.Lstat(p)
		if err != nil {
			t.Fatal(err)
		}
		if st := fi.Sys().(*syscall.Stat_t); !fi.IsDir() || st.Uid != 0 || st.Gid != 0 || fi.Mode().Perm() != 0o700 {
			t.Errorf("%s: %v uid %d gid %d; want a root-owned 0700 dir", p, fi.Mode(), st.Uid, st.Gid)
		}
	}
	for _, name := range []string{"mounts.json", "bundle/config.json", "console.log", diskImage} {
		if _, err := os.Stat(filepath.Join(d.priv(id), name)); err != nil {
			t.Errorf("%s not in the root-only dir: %v", name, err)
		}
		if _, err := os.Lstat(filepath.Join(d.dir(id), name)); !os.IsNotExist(err) {
			t.Errorf("%s in the sandbox-owned dir: %v", name, err)
		}
	}
	fi, err := os.Stat(d.dir(id))
	if err != nil {
		t.Fatal(err)
	}
	uid := fi.Sys().(*syscall.Stat_t).Uid
	if uid < usernsBase {
		t.Fatalf("sandbox dir owner %d, want the sandbox's host uid", uid)
	}
	asSandbox := func(script string, stdin []byte) error {
		cmd := exec.Command("/bin/sh", "-c", script)
		cmd.Stdin = bytes.NewReader(stdin)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: uid}}
		out, err := cmd.CombinedOutput()
		if err != nil {
			return fmt.Errorf("%v: %s", err, out)
		}
		return nil
	}
	fake, _ := json.Marshal([]runtime.Mount{{Source: secret, Destination: "/mnt/x"}})
	if err := asSandbox("cd "+d.dir(id)+" && rm -f mounts.json && cat > mounts.json", fake); err != nil {
		t.Fatalf("the sandbox's uid cannot write its own dir: %v", err)
	}
	if err := asSandbox("touch "+filepath.Join(d.priv(id), "x"), nil); err == nil {
		t.Errorf("the sandbox's uid wrote into the root-only dir")
	}
	if err := asSandbox("ls "+filepath.Join(d.cfg.SandboxDir, privateDir), nil); err == nil {
		t.Errorf("the sandbox's uid listed the root-only dir")
	}

	if err := d.Stop(ctx, id); err != nil {
		t.Fatal(err)
	}
	if err := d.Resume(ctx, id); err != nil {
		t.Fatal(err)
	}
	ents, err := os.ReadDir(filepath.Join(d.dir(id), "m", "0"))
	if err != nil {
		t.Fatal(err)
	}
	if len(ents) != 1 || ents[0].Name() != "orig" {
		t.Fatalf("after a restage root bound in %v; want the original mount (orig), not what the sandbox's uid named", ents)
	}
}

// A sandbox dir of the layout before privateDir (state beside the rootfs)
// has its state moved to its private dir when the driver starts; a
// symlink in its place is left alone, not followed.
func TestMigrateState(t *testing.T) {
	base := t.TempDir()
	sb := filepath.Join(base, "sandboxes")
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(sb, privateDir), 0o700))
	d := &Driver{cfg: Config{Runtime: "runc", SandboxDir: sb}}
	id := "abc123"
	must(os.MkdirAll(filepath.Join(d.dir(id), "bundle"), 0o755))
	must(os.WriteFile(filepath.Join(d.dir(id), "bundle", "config.json"), []byte("{}"), 0o600))
	must(os.WriteFile(filepath.Join(d.dir(id), "mounts.json"), []byte("[]"), 0o600))
	must(os.WriteFile(filepath.Join(d.dir(id), "stopped"), nil, 0o600))
	must(os.Symlink("/etc/passwd", filepath.Join(d.dir(id), "console.log")))
	must(d.migrateState())
	for _, n := range []string{"bundle/config.json", "mounts.json", "stopped"} {
		if _, err := os.Stat(filepath.Join(d.priv(id), n)); err != nil {
			t.Errorf("%s not moved: %v", n, err)
		}
		if _, err := os.Lstat(filepath.Join(d.dir(id), n)); !os.IsNotExist(err) {
			t.Errorf("%s still in the sandbox dir: %v", n, err)
		}
	}
	if _, err := os.Lstat(filepath.Join(d.priv(id), "console.log")); !os.IsNotExist(err) {
		t.Errorf("a planted symlink was moved into the private dir: %v", err)
	}
	if !d.pausedOnDisk(id) {
		t.Error("the stopped marker is not seen after the move")
	}
	must(d.migrateState()) // nothing left to do
}

// A user-namespaced sandbox's upper dir is stored 0-based (written
// through an idmapped view of its disk): what root and uid 1000 write in
// the sandbox is uid 0 and 1000 on its disk, inside it they are still
// theirs, and a snapshot of it needs no shift.
func TestUpperStoredZeroBased(t *testing.T) {
	t.Run("view", func(t *testing.T) { testUpperStored(t, false) })
	// A kernel whose overlayfs takes no idmapped upper stores host uids,
	// and the snapshot shifts them back.
	t.Run("fallback", func(t *testing.T) { testUpperStored(t, true) })
}

func testUpperStored(t *testing.T, fallback bool) {
	env := newTestEnvOpts(t, "runc", envOpts{userns: true, reflink: true})
	d := env.d
	d.noUpperView = fallback
	ctx := context.Background()
	out := filepath.Join(env.base, "out")
	if err := os.Mkdir(out, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(out, 0o777); err != nil {
		t.Fatal(err)
	}
	id := runtimetest.NewID(t)
	t.Cleanup(func() { d.Delete(context.Background(), id) })
	script := `echo r > /by-root && echo u > /by-user && chown 1000:1000 /by-user && rm /etc/passwd &&
ls -ln /by-root /by-user > /out/ls && echo ok > /out/done; exec sleep 3600`
	if _, err := d.Create(ctx, runtime.Spec{ID: id, Layers: env.layers, Args: []string{"/bin/sh", "-c", script},
		Mounts:    []runtime.Mount{{Source: out, Destination: "/out"}},
		Resources: runtime.Resources{CPUCount: 1, MemoryMB: 64, PIDs: 16, DiskMB: 32}}); err != nil {
		t.Fatal(err)
	}
	runtimetest.WaitFile(t, filepath.Join(out, "done"), 30*time.Second)
	if _, err := os.Stat(d.upperIdmapped(id)); (err == nil) == fallback {
		t.Fatalf("0-based marker: %v (fallback %v)", err, fallback)
	}
	var shift uint32
	if fallback {
		d.mu.Lock()
		shift = slotBase(d.slots[id])
		d.mu.Unlock()
	}
	for name, want := range map[string]uint32{"by-root": shift, "by-user": shift + 1000} {
		var st syscall.Stat_t
		if err := syscall.Lstat(filepath.Join(d.UpperDir(id), name), &st); err != nil {
			t.Fatal(err)
		}
		if st.Uid != want || st.Gid != want {
			t.Errorf("%s on disk: uid %d gid %d, want %d", name, st.Uid, st.Gid, want)
		}
	}
	ls, _ := os.ReadFile(filepath.Join(out, "ls"))
	if f := strings.Fields(string(ls)); len(f) < 12 || f[2] != "0" || f[11] != "1000" {
		t.Errorf("inside the sandbox: %q, want root's file 0 and the user's 1000", ls)
	}
	snap := filepath.Join(env.base, "snap")
	if _, err := d.Snapshot(ctx, id, snap, false); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := d.DeleteSnapshot(context.Background(), snap); err != nil {
			t.Error(err)
		}
	})
	var st syscall.Stat_t
	if err := syscall.Lstat(filepath.Join(snap, "rootfs", "by-user"), &st); err != nil || st.Uid != 1000 {
		t.Errorf("snapshot layer's by-user: uid %d, %v; want 1000", st.Uid, err)
	}
	if fi, err := os.Lstat(filepath.Join(snap, "rootfs", "etc", "passwd")); err != nil || fi.Mode()&os.ModeCharDevice == 0 {
		t.Errorf("snapshot layer lost the whiteout of /etc/passwd: %v %v", fi, err)
	}
}
