package image

import (
	"archive/tar"
	"bytes"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// layerFromSpec builds a layer tar from a line-per-entry spec,
// "type|name|linkname|octal mode|body", so the fuzzer mutates entries rather
// than tar checksums. It reports whether some name or hard-link target
// climbs out of the root, which must then be refused with ErrUnsafePath.
func layerFromSpec(spec string) (layer []byte, escapes bool) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, line := range strings.Split(spec, "\n") {
		f := strings.SplitN(line, "|", 5)
		if len(f) < 2 || f[0] == "" {
			continue
		}
		for len(f) < 5 {
			f = append(f, "")
		}
		mode, _ := strconv.ParseInt(f[3], 8, 64)
		h := &tar.Header{Typeflag: f[0][0], Name: f[1], Linkname: f[2], Mode: mode & 0o7777,
			ModTime: time.Unix(1700000000, 0), Devmajor: 1, Devminor: 3}
		if h.Typeflag == tar.TypeReg {
			h.Size = int64(len(f[4]))
		}
		if tw.WriteHeader(h) != nil {
			continue
		}
		if h.Typeflag == tar.TypeReg {
			tw.Write([]byte(f[4]))
		}
		climbs := func(n string) bool {
			_, err := cleanEntry(n)
			return errors.Is(err, ErrUnsafePath)
		}
		// An entry for the root itself ("", ".", "./") is skipped unread.
		root := false
		if rel, err := cleanEntry(h.Name); err == nil && rel == "" {
			root = true
		}
		if climbs(h.Name) || (h.Typeflag == tar.TypeLink && !root && climbs(h.Linkname)) {
			escapes = true
		}
	}
	tw.Close()
	return buf.Bytes(), escapes
}

// snapshotTree maps every path under dir to its type and mode.
func snapshotTree(t *testing.T, dir string) map[string]fs.FileMode {
	t.Helper()
	out := map[string]fs.FileMode{}
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		if fi, err := d.Info(); err == nil {
			out[p] = fi.Mode()
		}
		return nil
	})
	return out
}

// FuzzApplyLayer: whatever a layer holds, applying it changes nothing
// outside the root, leaves no device node, and a name that climbs out is
// refused with ErrUnsafePath.
func FuzzApplyLayer(f *testing.F) {
	for _, s := range []string{
		"5|etc/||755|\n0|etc/passwd||644|root:x:0:0\n0|etc/shadow||640|root:*:1",
		"5|usr/||755|\n5|usr/lib/||755|\n2|lib|usr/lib|777|\n0|lib/libc.so||755|ELF",
		"0|bin/sudo||4755|setuid\n1|bin/sudo2|bin/sudo|4755|",
		"0|etc/.wh.gone||644|\n5|opq/||755|\n0|opq/.wh..wh..opq||644|\n0|opq/new||644|x",
		"2|up|..|777|\n0|up/escape||644|x",
		"2|abs|/etc|777|\n0|abs/passwd||644|x",
		"0|../escape||644|x",
		"0|/etc/abs||644|x",
		"1|hard|../../etc/passwd|644|",
		"3|dev/sda||666|\n4|dev/loop||666|\n6|fifo||644|",
		"0|.wh...||644|",
		"0|a/.wh..||644|",
		"5|./||755|\n0|./x||644|y",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, spec string) {
		layer, escapes := layerFromSpec(spec)
		top := t.TempDir()
		// root sits two levels down so that any escape still lands inside
		// the test's own temp dir.
		outer := filepath.Join(top, "outer")
		root := filepath.Join(outer, "root")
		if err := os.MkdirAll(root, 0o755); err != nil {
			t.Fatal(err)
		}
		for _, p := range []string{filepath.Join(top, "canary"), filepath.Join(outer, "canary")} {
			if err := os.WriteFile(p, []byte("keep"), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		before := snapshotTree(t, top)
		err := applyLayer(root, bytes.NewReader(layer))
		if escapes && !errors.Is(err, ErrUnsafePath) {
			t.Fatalf("escaping entry: err = %v, want ErrUnsafePath", err)
		}
		after := snapshotTree(t, top)
		for p, m := range before {
			if p == root || strings.HasPrefix(p, root+string(filepath.Separator)) {
				continue
			}
			if am, ok := after[p]; !ok || am != m {
				t.Fatalf("%s changed outside the root (%v -> %v, present %v)", p, m, am, ok)
			}
		}
		for p, m := range after {
			inRoot := p == root || strings.HasPrefix(p, root+string(filepath.Separator))
			if _, ok := before[p]; !ok && !inRoot {
				t.Fatalf("%s created outside the root", p)
			}
			if m&fs.ModeDevice != 0 {
				t.Fatalf("%s is a device node", p)
			}
		}
		for _, c := range []string{filepath.Join(top, "canary"), filepath.Join(outer, "canary")} {
			if b, err := os.ReadFile(c); err != nil || string(b) != "keep" {
				t.Fatalf("%s: %q %v", c, b, err)
			}
		}
	})
}
