package oci

import (
	"os"
	"path/filepath"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/cubicle-dev/cubicle/internal/runtime"
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
