package contextstore

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

const fuzzHash = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

// specLines splits a fuzz spec into its entries, one a line, of n
// "|"-separated fields each: the last field keeps any further "|", missing
// ones are "", and lines with no kind or no name are skipped, so every
// mutation still parses into entries.
func specLines(spec string, n int) [][]string {
	var out [][]string
	for _, line := range strings.Split(spec, "\n") {
		f := strings.SplitN(line, "|", n)
		if len(f) < 2 || f[0] == "" {
			continue
		}
		for len(f) < n {
			f = append(f, "")
		}
		out = append(out, f)
	}
	return out
}

// tarFromSpec builds a tar from a line-per-entry spec,
// "type|name|linkname|octal mode|body", so the fuzzer mutates members rather
// than tar checksums. unsafeSpec reports a member the rules refuse as unsafe
// on its own: an absolute or ".." name or hard-link target, a device or a
// fifo. (An absolute symlink is allowed: it means a path in the image.)
func tarFromSpec(spec string) (b []byte, unsafeSpec bool) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	climbs := func(n string) bool {
		if strings.HasPrefix(n, "/") {
			return true
		}
		for _, part := range strings.Split(n, "/") {
			if part == ".." {
				return true
			}
		}
		return false
	}
	for _, f := range specLines(spec, 5) {
		mode, _ := strconv.ParseInt(f[3], 8, 64)
		h := &tar.Header{Typeflag: f[0][0], Name: f[1], Linkname: f[2], Mode: mode & 0o7777,
			ModTime: time.Unix(1700000000, 0), Devmajor: 8, Devminor: 0}
		if h.Typeflag == tar.TypeReg {
			h.Size = int64(len(f[4]))
		}
		if tw.WriteHeader(h) != nil {
			continue
		}
		if h.Typeflag == tar.TypeReg {
			tw.Write([]byte(f[4]))
		}
		switch h.Typeflag {
		case tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
			unsafeSpec = true
		case tar.TypeLink:
			unsafeSpec = unsafeSpec || climbs(h.Linkname)
		}
		unsafeSpec = unsafeSpec || climbs(h.Name)
	}
	tw.Close()
	return buf.Bytes(), unsafeSpec
}

// resolveInContext follows p's symlinks component by component, the way the
// kernel would (a missing tail is kept as is), independently of the
// validator's in-archive view, except that an absolute target is a path in
// root, as BuildKit resolves it within the build context: from there on ".."
// stops at root, but before that a relative target may climb out of it.
func resolveInContext(p, root string) string {
	cur, inRoot, hops := "/", false, 0
	pending := strings.Split(filepath.Clean(p), "/")
	for len(pending) > 0 {
		part := pending[0]
		pending = pending[1:]
		switch part {
		case "", ".":
			continue
		case "..":
			if !inRoot || cur != root {
				cur = filepath.Dir(cur)
			}
			continue
		}
		next := filepath.Join(cur, part)
		t, err := os.Readlink(next)
		if err != nil {
			cur = next
			continue
		}
		if hops++; hops > 64 {
			return "/loop" // a loop is never inside
		}
		if filepath.IsAbs(t) {
			cur, inRoot = root, true
		}
		pending = append(strings.Split(t, "/"), pending...)
	}
	return cur
}

func within(p, dir string) bool {
	return p == dir || strings.HasPrefix(p, dir+string(filepath.Separator))
}

// FuzzExtract: Put accepts an archive or refuses it with a typed error
// (unsafe members always with ErrUnsafePath); an accepted archive extracts,
// and extraction touches nothing outside dest/<hash> (not even through an
// absolute symlink), makes no device or fifo, leaves no symlink resolving
// outside the context (an absolute target counts as a path inside it, as in
// the build), and dest/<hash> is 0700 so a setuid file from an upload is not
// reachable by other host users.
func FuzzExtract(f *testing.F) {
	for _, s := range []string{
		"5|app/||755|\n0|app/main.py||644|print(1)\n0|app/run.sh||755|#!/bin/sh",
		"5|.||755|\n0|./a||644|x\n5|d/||700|\n0|d/e||600|y",
		"0|a||644|x\n1|b|a|644|",
		"2|link|target|777|\n0|target||644|t",
		"2|up|..|777|",
		"2|up|sub/../..|777|\n5|sub/||755|",
		"2|a|b|777|\n2|b|../x|777|",
		"2|dir|.|777|\n0|dir/x||644|x",
		"2|abs|/etc/passwd|777|",
		"2|abs|/tmp|777|\n0|abs/x||644|x",
		"2|abs|/|777|\n2|rel|abs/../..|777|",
		"2|a|/x|777|\n2|b|a|777|\n5|b/c/||755|",
		"0|../x||644|x",
		"0|/x||644|x",
		"1|h|../../etc/passwd|644|",
		"3|sda||666|\n6|fifo||644|",
		"0|suid||4755|x",
		"5|ro/||555|\n0|ro/f||444|x",
		"0|a||644|x\n0|a||644|y",
		"0|a||644|x\n5|a/||755|",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, spec string) {
		archive, unsafeSpec := tarFromSpec(spec)
		top := t.TempDir()
		st, err := Open(filepath.Join(top, "store"), 1<<20)
		if err != nil {
			t.Fatal(err)
		}
		err = st.Put(fuzzHash, bytes.NewReader(archive))
		if err != nil {
			if !errors.Is(err, ErrUnsafePath) && !errors.Is(err, ErrBadArchive) && !errors.Is(err, ErrTooLarge) {
				t.Fatalf("Put: untyped error %v", err)
			}
			if unsafeSpec && !errors.Is(err, ErrUnsafePath) && !errors.Is(err, ErrBadArchive) {
				t.Fatalf("Put: unsafe member refused with %v, want ErrUnsafePath", err)
			}
			return
		}
		if unsafeSpec {
			t.Fatalf("Put accepted an unsafe member")
		}
		dest := filepath.Join(top, "dest")
		canary := filepath.Join(top, "canary")
		os.WriteFile(canary, []byte("keep"), 0o644)
		if err := st.Extract(fuzzHash, dest); err != nil {
			t.Fatalf("an accepted archive must extract: %v", err)
		}
		if b, err := os.ReadFile(canary); err != nil || string(b) != "keep" {
			t.Fatalf("canary: %q %v", b, err)
		}
		out := filepath.Join(dest, fuzzHash)
		if fi, err := os.Stat(out); err != nil || fi.Mode().Perm() != 0o700 {
			t.Fatalf("dest/<hash>: %v %v, want mode 0700", fi, err)
		}
		ents, _ := os.ReadDir(dest)
		if len(ents) != 1 {
			t.Fatalf("dest holds %d entries, want only <hash>", len(ents))
		}
		filepath.WalkDir(top, func(p string, d fs.DirEntry, err error) error {
			if err != nil || within(p, filepath.Join(top, "store")) {
				return nil
			}
			if p != top && p != canary && p != dest && !within(p, out) {
				t.Errorf("%s written outside dest/<hash>", p)
			}
			fi, err := d.Info()
			if err != nil {
				return nil
			}
			switch m := fi.Mode(); {
			case m&(fs.ModeDevice|fs.ModeNamedPipe|fs.ModeSocket) != 0:
				t.Errorf("%s has mode %v", p, m)
			case m&fs.ModeSymlink != 0:
				if r := resolveInContext(p, out); !within(r, out) {
					t.Errorf("symlink %s resolves to %s, outside", p, r)
				}
			}
			return nil
		})
	})
}
