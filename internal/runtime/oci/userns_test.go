package oci

import (
	"os"
	"path/filepath"
	"testing"

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
