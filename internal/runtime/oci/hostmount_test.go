package oci

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/cubicle-dev/cubicle/internal/hostmount"
	"github.com/cubicle-dev/cubicle/internal/runtime"
	"github.com/cubicle-dev/cubicle/internal/testenv"
)

// A host mount is staged, idmapped, from the directory reached without a
// symlink; a path that turned into a symlink after the control plane
// checked it (a sandbox swapped it) is refused and nothing is mounted.
func TestStageHostMountFollowsNoSymlink(t *testing.T) {
	testenv.RequireRoot(t, "mounts")
	dir := t.TempDir()
	d := &Driver{cfg: Config{Runtime: "runc", SandboxDir: filepath.Join(dir, "sb"), UserNS: true}, slots: map[string]int{}}
	id := "hostmounttest0000000"
	for _, p := range []string{d.dir(id), d.priv(id), filepath.Join(d.dir(id), "m")} {
		if err := os.MkdirAll(p, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { _ = unmountUnder(filepath.Join(d.dir(id), "m")) })
	prefix := filepath.Join(dir, "shared")
	secret := filepath.Join(dir, "secret")
	for _, p := range []string{filepath.Join(prefix, "data"), secret} {
		if err := os.MkdirAll(p, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	os.WriteFile(filepath.Join(prefix, "data", "marker"), []byte("shared"), 0o644)
	os.WriteFile(filepath.Join(secret, "marker"), []byte("secret"), 0o644)
	ns, err := newUserns(usernsBase, usernsSize)
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()

	staged, err := d.stageMounts(id, ns, []runtime.Mount{{Source: filepath.Join(prefix, "data"), Destination: "/mnt/data", Under: prefix}})
	if err != nil {
		t.Fatal(err)
	}
	if staged[0].Under != "" || staged[0].Source != filepath.Join(d.dir(id), "m", "0") {
		t.Fatalf("staged %+v", staged[0])
	}
	b, err := os.ReadFile(filepath.Join(staged[0].Source, "marker"))
	if err != nil || string(b) != "shared" {
		t.Fatalf("staged mount reads %q %v", b, err)
	}
	var st syscall.Stat_t
	if err := syscall.Stat(filepath.Join(staged[0].Source, "marker"), &st); err != nil || st.Uid != usernsBase {
		t.Fatalf("marker owner through the staged mount: %d %v, want %d (idmapped)", st.Uid, err, usernsBase)
	}
	if err := unmountUnder(filepath.Join(d.dir(id), "m")); err != nil {
		t.Fatal(err)
	}

	// Checked as a directory, then swapped for a link to a secret.
	if err := os.Rename(filepath.Join(prefix, "data"), filepath.Join(prefix, "data.old")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(secret, filepath.Join(prefix, "data")); err != nil {
		t.Fatal(err)
	}
	_, err = d.stageMounts(id, ns, []runtime.Mount{{Source: filepath.Join(prefix, "data"), Destination: "/mnt/data", Under: prefix}})
	if !errors.Is(err, hostmount.ErrSymlink) || !errors.Is(err, ErrInvalidSpec) {
		t.Fatalf("swapped for a symlink: %v", err)
	}
	if _, err := os.Stat(filepath.Join(d.dir(id), "m", "0", "marker")); err == nil {
		t.Fatal("the secret was mounted")
	}
}
