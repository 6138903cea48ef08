package snapstore

import (
	"archive/tar"
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/cubicle-dev/cubicle/internal/testenv"
)

// A package is written by a node, and a node may be compromised: unpack
// refuses every entry that would land outside its part, write through a
// symlink, link to a file it did not make, make a real device or carry an
// xattr a snapshot never keeps, and writes nothing outside dst.
func TestUnpackRefusesHostilePackages(t *testing.T) {
	testenv.RequireRoot(t, "mknod")
	outside := t.TempDir()
	victim := filepath.Join(outside, "victim")
	if err := os.WriteFile(victim, []byte("untouched"), 0o644); err != nil {
		t.Fatal(err)
	}
	dir := func(name string) *tar.Header { return &tar.Header{Name: name, Typeflag: tar.TypeDir, Mode: 0o755} }
	file := func(name string) *tar.Header {
		return &tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o644, Size: 1}
	}
	cases := map[string][]*tar.Header{
		"dotdot":            {dir("./"), file("../victim")},
		"absolute":          {dir("./"), file(victim)},
		"through a symlink": {dir("./"), {Name: "l", Typeflag: tar.TypeSymlink, Linkname: outside}, file("l/victim")},
		"parent not made":   {dir("./"), file("nodir/x")},
		"hard link out":     {dir("./"), {Name: "h", Typeflag: tar.TypeLink, Linkname: victim}},
		"hard link up":      {dir("./"), {Name: "h", Typeflag: tar.TypeLink, Linkname: "../victim"}},
		"device":            {dir("./"), {Name: "null", Typeflag: tar.TypeChar, Mode: 0o666, Devmajor: 1, Devminor: 3}},
		"block device":      {dir("./"), {Name: "sda", Typeflag: tar.TypeBlock, Mode: 0o666, Devmajor: 8}},
		"xattr":             {dir("./"), {Name: "f", Typeflag: tar.TypeReg, Mode: 0o644, Size: 1, PAXRecords: map[string]string{xattrPAX + "trusted.overlay.origin": "x"}}},
		"twice":             {dir("./"), file("f"), file("f")},
		"xattr on a fifo":   {dir("./"), {Name: "p", Typeflag: tar.TypeFifo, Mode: 0o644, PAXRecords: map[string]string{xattrPAX + "user.x": "x"}}},
	}
	for name, hdrs := range cases {
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		for _, h := range hdrs {
			h.Format = tar.FormatPAX
			if err := tw.WriteHeader(h); err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			if h.Size > 0 {
				tw.Write(bytes.Repeat([]byte("x"), int(h.Size)))
			}
		}
		tw.Close()
		dst := filepath.Join(t.TempDir(), "part")
		if err := os.Mkdir(dst, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := unpack(&buf, dst); !errors.Is(err, ErrBadPackage) {
			t.Fatalf("%s: %v, want ErrBadPackage", name, err)
		}
		if b, _ := os.ReadFile(victim); string(b) != "untouched" {
			t.Fatalf("%s: wrote outside: %q", name, b)
		}
		if left, _ := os.ReadDir(outside); len(left) != 1 {
			t.Fatalf("%s: made files outside: %v", name, left)
		}
	}
}
