package oci

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/cubicle-dev/cubicle/internal/runtime"
	"github.com/cubicle-dev/cubicle/internal/testenv"
)

func TestSeedFiles(t *testing.T) {
	testenv.RequireRoot(t, "chown")
	upper := t.TempDir()
	const owner = 1 << 30 // a user-namespace slot's root
	files := []runtime.File{
		{Path: "/etc/ssl/certs/ca-certificates.crt", Data: []byte("bundle")},
		{Path: "/usr/local/share/ca-certificates/x.crt", Data: []byte("x"), Mode: 0o600},
	}
	if err := seedFiles(upper, files, owner); err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		p := filepath.Join(upper, f.Path)
		b, err := os.ReadFile(p)
		if err != nil || string(b) != string(f.Data) {
			t.Fatalf("%s: %q %v", f.Path, b, err)
		}
		fi, _ := os.Lstat(p)
		want := os.FileMode(0o644)
		if f.Mode != 0 {
			want = os.FileMode(f.Mode)
		}
		if st := fi.Sys().(*syscall.Stat_t); st.Uid != owner || st.Gid != owner || fi.Mode().Perm() != want {
			t.Fatalf("%s: uid %d gid %d mode %v", f.Path, st.Uid, st.Gid, fi.Mode())
		}
	}
	// The directories it made belong to the sandbox's root too, so root
	// inside may change them.
	for _, d := range []string{"etc", "etc/ssl", "etc/ssl/certs", "usr/local/share"} {
		fi, err := os.Lstat(filepath.Join(upper, d))
		if err != nil || fi.Sys().(*syscall.Stat_t).Uid != owner || fi.Mode().Perm() != 0o755 {
			t.Fatalf("%s: %v %v", d, fi, err)
		}
	}
	for _, bad := range []string{"etc/x", "/etc/../../x", "/"} {
		if err := seedFiles(t.TempDir(), []runtime.File{{Path: bad}}, 0); err == nil {
			t.Errorf("path %q accepted", bad)
		}
	}
}
