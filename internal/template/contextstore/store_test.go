package contextstore

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

const (
	h1 = "5d9e391ef8265bdbf5dab1e924668ade1282d8450786c7b0ae91d5dd5405e8c8"
	h2 = "3883a9605d900d6c2e8844fb119d9d39c36c6cb9f8debaa0f75b63b6199438b9"
)

var mtime = time.Date(2026, 11, 12, 10, 0, 0, 0, time.UTC)

type ent struct {
	name string
	typ  byte
	body string
	link string
	mode int64
	uid  int
}

func mkTar(t *testing.T, ents ...ent) []byte {
	t.Helper()
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for _, e := range ents {
		h := &tar.Header{Name: e.name, Typeflag: e.typ, Linkname: e.link, Mode: e.mode, ModTime: mtime, Uid: e.uid, Gid: e.uid}
		if h.Typeflag == 0 {
			h.Typeflag = tar.TypeReg
		}
		if h.Mode == 0 {
			h.Mode = 0o644
			if h.Typeflag == tar.TypeDir {
				h.Mode = 0o755
			}
		}
		if h.Typeflag == tar.TypeReg {
			h.Size = int64(len(e.body))
		}
		if h.Typeflag == tar.TypeXGlobalHeader {
			h = &tar.Header{Typeflag: tar.TypeXGlobalHeader, Name: "pax_global_header", PAXRecords: map[string]string{"comment": "x"}}
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if h.Size > 0 {
			if _, err := tw.Write([]byte(e.body)); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

func gz(t *testing.T, b []byte) []byte {
	t.Helper()
	var out bytes.Buffer
	zw := gzip.NewWriter(&out)
	zw.Write(b)
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return out.Bytes()
}

func open(t *testing.T, max int64) (*Store, string) {
	t.Helper()
	dir := t.TempDir()
	s, err := Open(dir, max)
	if err != nil {
		t.Fatal(err)
	}
	return s, dir
}

// assertEmpty checks that a failed Put left no file behind, partial or not.
func assertEmpty(t *testing.T, s *Store, dir, hash string) {
	t.Helper()
	if s.Has(hash) {
		t.Fatal("Has = true after failed Put")
	}
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		t.Errorf("left behind %s", e.Name())
	}
}

func simpleTar(t *testing.T) []byte {
	return mkTar(t, ent{name: "app/", typ: tar.TypeDir}, ent{name: "app/main.py", body: "print('hi')\n"})
}

func TestOpenDefaults(t *testing.T) {
	s, _ := open(t, 0)
	if s.maxBytes != DefaultMaxBytes || DefaultMaxBytes != 512<<20 {
		t.Fatalf("maxBytes = %d", s.maxBytes)
	}
}

func TestPutGzipAndPlain(t *testing.T) {
	s, _ := open(t, 0)
	plain := simpleTar(t)
	if s.Has(h1) {
		t.Fatal("Has before Put")
	}
	if err := s.Put(h1, bytes.NewReader(gz(t, plain))); err != nil {
		t.Fatalf("gzip Put: %v", err)
	}
	other := mkTar(t, ent{name: "req.txt", body: "flask\n"})
	if err := s.Put(h2, bytes.NewReader(other)); err != nil {
		t.Fatalf("plain Put: %v", err)
	}
	for hash, want := range map[string][]byte{h1: plain, h2: other} {
		if !s.Has(hash) {
			t.Fatalf("Has(%s) = false", hash)
		}
		got, err := os.ReadFile(s.Path(hash))
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("stored bytes differ for %s (err %v)", hash, err)
		}
	}
}

// The e2b JS SDK tars with node-tar (gzip, cwd = context dir, noDirRecurse)
// over the sorted relative paths: copy('app', ...) uploads "app/" then
// "app/main.py", ustar headers with the uploader's uid/gid and names.
func TestSDKNodeTarUpload(t *testing.T) {
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	hdrs := []*tar.Header{
		{Name: "app/", Typeflag: tar.TypeDir, Mode: 0o755, Uid: 501, Gid: 20, Uname: "dev", Gname: "staff", ModTime: mtime, Format: tar.FormatUSTAR},
		{Name: "app/main.py", Typeflag: tar.TypeReg, Mode: 0o644, Uid: 501, Gid: 20, Uname: "dev", Gname: "staff", ModTime: mtime, Size: 9, Format: tar.FormatUSTAR},
	}
	for i, h := range hdrs {
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if i == 1 {
			tw.Write([]byte("print(1)\n"))
		}
	}
	tw.Close()
	body := gz(t, b.Bytes())
	if body[0] != 0x1f || body[1] != 0x8b {
		t.Fatal("not gzip")
	}

	s, _ := open(t, 0)
	if err := s.Put(h1, bytes.NewReader(body)); err != nil {
		t.Fatal(err)
	}
	if !s.Has(h1) {
		t.Fatal("not present after upload")
	}
	dest := t.TempDir()
	if err := s.Extract(h1, dest); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(filepath.Join(dest, h1, "app", "main.py"))
	if err != nil || string(got) != "print(1)\n" {
		t.Fatalf("main.py = %q, %v", got, err)
	}
	fi, _ := os.Stat(filepath.Join(dest, h1, "app"))
	if !fi.IsDir() || fi.Mode().Perm() != 0o755 {
		t.Fatalf("app mode %v", fi.Mode())
	}
}

func TestPutBadArchive(t *testing.T) {
	good := simpleTar(t)
	noEnd := good[:len(good)-1024] // cut at a member boundary
	for _, tc := range []struct {
		name string
		body []byte
	}{
		{"empty", nil},
		{"text", []byte("hello, world\n")},
		{"random block", bytes.Repeat([]byte{0xde, 0xad, 0xbe, 0xef}, 1024)},
		{"zip", append([]byte("PK\x03\x04"), make([]byte, 600)...)},
		{"gzip of text", gz(t, []byte(strings.Repeat("not a tar ", 100)))},
		{"gzip magic only", []byte{0x1f, 0x8b}},
		{"truncated gzip", gz(t, good)[:40]},
		{"truncated tar mid member", good[:700]},
		{"tar without end marker", noEnd},
		{"gzip tar without end marker", gz(t, noEnd)},
		{"junk after end marker", append(append([]byte{}, good...), []byte("trailing junk")...)},
		{"corrupt gzip crc", func() []byte {
			b := gz(t, good)
			b[len(b)-8] ^= 0xff
			return b
		}()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, dir := open(t, 0)
			err := s.Put(h1, bytes.NewReader(tc.body))
			if !errors.Is(err, ErrBadArchive) {
				t.Fatalf("err = %v, want ErrBadArchive", err)
			}
			assertEmpty(t, s, dir, h1)
		})
	}
}

func TestPutAcceptsRecordPadding(t *testing.T) {
	// GNU tar pads the archive to a 10 KiB record with zeros.
	good := simpleTar(t)
	padded := append(append([]byte{}, good...), make([]byte, 10240-len(good)%10240)...)
	s, _ := open(t, 0)
	if err := s.Put(h1, bytes.NewReader(gz(t, padded))); err != nil {
		t.Fatal(err)
	}
	// An empty archive is still a valid tar.
	if err := s.Put(h2, bytes.NewReader(mkTar(t))); err != nil {
		t.Fatal(err)
	}
}

func TestPutConflict(t *testing.T) {
	s, _ := open(t, 0)
	a := simpleTar(t)
	b := mkTar(t, ent{name: "app/main.py", body: "print('other')\n"})
	if err := s.Put(h1, bytes.NewReader(a)); err != nil {
		t.Fatal(err)
	}
	if err := s.Put(h1, bytes.NewReader(b)); !errors.Is(err, ErrConflict) {
		t.Fatalf("different bytes: err = %v", err)
	}
	// Same decompressed bytes, whether or not gzipped, are accepted.
	if err := s.Put(h1, bytes.NewReader(a)); err != nil {
		t.Fatalf("same bytes: %v", err)
	}
	if err := s.Put(h1, bytes.NewReader(gz(t, a))); err != nil {
		t.Fatalf("same bytes gzipped: %v", err)
	}
	got, _ := os.ReadFile(s.Path(h1))
	if !bytes.Equal(got, a) {
		t.Fatal("conflicting Put changed the stored tar")
	}
	ents, _ := os.ReadDir(filepath.Dir(s.Path(h1)))
	if len(ents) != 1 {
		t.Fatalf("dir has %d entries", len(ents))
	}
}

func TestPutTooLarge(t *testing.T) {
	big := mkTar(t, ent{name: "big.bin", body: strings.Repeat("x", 64<<10)})
	for _, tc := range []struct {
		name string
		body []byte
	}{
		{"plain", big},
		{"gzip bomb", gz(t, big)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, dir := open(t, 16<<10)
			if len(tc.body) > 16<<10 && tc.name == "gzip bomb" {
				t.Fatal("compressed body should be small")
			}
			err := s.Put(h1, bytes.NewReader(tc.body))
			if !errors.Is(err, ErrTooLarge) {
				t.Fatalf("err = %v", err)
			}
			assertEmpty(t, s, dir, h1)
		})
	}
	// Exactly at the limit is fine.
	exact := mkTar(t, ent{name: "f", body: "abc"})
	s, _ := open(t, int64(len(exact)))
	if err := s.Put(h1, bytes.NewReader(exact)); err != nil {
		t.Fatalf("at limit: %v", err)
	}
}

type failingReader struct {
	data []byte
	err  error
}

func (f *failingReader) Read(p []byte) (int, error) {
	if len(f.data) == 0 {
		return 0, f.err
	}
	n := copy(p, f.data)
	f.data = f.data[n:]
	return n, nil
}

func TestPutReaderErrorNotPresent(t *testing.T) {
	boom := errors.New("client went away")
	payload := mkTar(t, ent{name: "f", body: strings.Repeat("y", 8192)})
	for _, tc := range []struct {
		name string
		data []byte
		err  error
	}{
		{"plain mid member", payload[:3000], boom},
		{"gzip mid stream", gz(t, payload)[:30], boom},
		{"http short body", payload[:3000], io.ErrUnexpectedEOF},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, dir := open(t, 0)
			err := s.Put(h1, &failingReader{data: tc.data, err: tc.err})
			if !errors.Is(err, tc.err) {
				t.Fatalf("err = %v, want %v", err, tc.err)
			}
			if errors.Is(err, ErrBadArchive) {
				t.Fatal("a read error was reported as a bad archive")
			}
			assertEmpty(t, s, dir, h1)
			// A retry with the full body succeeds.
			if err := s.Put(h1, bytes.NewReader(payload)); err != nil || !s.Has(h1) {
				t.Fatalf("retry: %v", err)
			}
		})
	}
}

func TestInvalidHash(t *testing.T) {
	s, dir := open(t, 0)
	for _, h := range []string{"", "abc", strings.ToUpper(h1), h1 + "0", "../" + h1[3:], h1[:63] + "g"} {
		if err := s.Put(h, bytes.NewReader(simpleTar(t))); !errors.Is(err, ErrInvalidHash) {
			t.Errorf("Put(%q) = %v", h, err)
		}
		if s.Has(h) {
			t.Errorf("Has(%q) = true", h)
		}
		if err := s.Extract(h, t.TempDir()); !errors.Is(err, ErrInvalidHash) {
			t.Errorf("Extract(%q) = %v", h, err)
		}
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) != 0 {
		t.Fatal("invalid hash left files")
	}
}

func TestPutUnsafeMembers(t *testing.T) {
	dir := func(n string) ent { return ent{name: n, typ: tar.TypeDir} }
	file := func(n string) ent { return ent{name: n, body: "x"} }
	sym := func(n, to string) ent { return ent{name: n, typ: tar.TypeSymlink, link: to} }
	hard := func(n, to string) ent { return ent{name: n, typ: tar.TypeLink, link: to} }
	for _, tc := range []struct {
		name string
		ents []ent
		want error
	}{
		{"dotdot", []ent{file("../x")}, ErrUnsafePath},
		{"nested dotdot escape", []ent{file("a/../../x")}, ErrUnsafePath},
		{"dotdot even inside", []ent{file("a/../b")}, ErrUnsafePath},
		{"absolute", []ent{file("/etc/x")}, ErrUnsafePath},
		{"absolute dir", []ent{dir("/tmp/")}, ErrUnsafePath},
		{"symlink up", []ent{sym("l", "../x")}, ErrUnsafePath},
		{"symlink nested up", []ent{dir("a/"), sym("a/l", "../../x")}, ErrUnsafePath},
		{"symlink outside then file through it", []ent{sym("l", "/etc"), file("l/passwd")}, ErrUnsafePath},
		{"absolute symlink then dir through it", []ent{sym("l", "/tmp"), dir("l/sub/")}, ErrUnsafePath},
		{"absolute symlink replaced by a file", []ent{sym("l", "/etc/passwd"), file("l")}, ErrUnsafePath},
		{"hard link through an absolute symlink", []ent{sym("l", "/etc"), hard("h", "l/passwd")}, ErrBadArchive},
		{"file through an inside symlink", []ent{dir("d/"), sym("l", "d"), file("l/f")}, ErrUnsafePath},
		{"symlink chain escape", []ent{dir("d1/d2/"), sym("d1/d2/up", "../.."), sym("link", "d1/d2/up/..")}, ErrUnsafePath},
		{"symlink chain defined later", []ent{sym("link", "d1/up/.."), dir("d1/"), sym("d1/up", "..")}, ErrUnsafePath},
		{"symlink loop", []ent{sym("a", "b"), sym("b", "a")}, ErrUnsafePath},
		{"symlink replaces dir", []ent{dir("d/"), sym("d", ".")}, ErrUnsafePath},
		{"symlink replaces implicit dir", []ent{file("d/f"), sym("d", ".")}, ErrUnsafePath},
		{"char device", []ent{{name: "null", typ: tar.TypeChar}}, ErrUnsafePath},
		{"block device", []ent{{name: "sda", typ: tar.TypeBlock}}, ErrUnsafePath},
		{"fifo", []ent{{name: "p", typ: tar.TypeFifo}}, ErrUnsafePath},
		{"hard link up", []ent{hard("h", "../x")}, ErrUnsafePath},
		{"hard link absolute", []ent{hard("h", "/etc/passwd")}, ErrUnsafePath},
		{"hard link to missing", []ent{hard("h", "nope")}, ErrBadArchive},
		{"hard link to dir", []ent{dir("d/"), hard("h", "d")}, ErrBadArchive},
		{"duplicate file", []ent{file("f"), file("f")}, ErrBadArchive},
		{"file as parent", []ent{file("f"), file("f/g")}, ErrBadArchive},
		{"root entry not dir", []ent{file(".")}, ErrBadArchive},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, d := open(t, 0)
			err := s.Put(h1, bytes.NewReader(gz(t, mkTar(t, tc.ents...))))
			if !errors.Is(err, tc.want) {
				t.Fatalf("err = %v, want %v", err, tc.want)
			}
			assertEmpty(t, s, d, h1)
		})
	}
}

// Docker keeps absolute symlinks in a build context (they mean paths in the
// image) and the e2b SDK uploads them as they are: they are stored and
// extracted unchanged, and nothing is written through them on the host.
func TestAbsoluteSymlinksKept(t *testing.T) {
	s, _ := open(t, 0)
	hostDir := t.TempDir()
	tarball := mkTar(t,
		ent{name: "app/", typ: tar.TypeDir},
		ent{name: "app/python", typ: tar.TypeSymlink, link: "/usr/bin/python3"},
		ent{name: "app/host", typ: tar.TypeSymlink, link: hostDir},
		ent{name: "app/via", typ: tar.TypeSymlink, link: "host/x"}, // relative, through an absolute one
		ent{name: "app/main.py", body: "print(1)\n"},
	)
	if err := s.Put(h1, bytes.NewReader(gz(t, tarball))); err != nil {
		t.Fatalf("absolute symlinks refused: %v", err)
	}
	dest := t.TempDir()
	if err := s.Extract(h1, dest); err != nil {
		t.Fatal(err)
	}
	root := filepath.Join(dest, h1)
	for name, want := range map[string]string{"app/python": "/usr/bin/python3", "app/host": hostDir, "app/via": "host/x"} {
		if got, err := os.Readlink(filepath.Join(root, name)); err != nil || got != want {
			t.Errorf("%s -> %q (%v), want %q", name, got, err, want)
		}
	}
	if ents, _ := os.ReadDir(hostDir); len(ents) != 0 {
		t.Fatalf("extraction wrote through an absolute symlink: %v", ents)
	}
}

func TestExtractRoundTrip(t *testing.T) {
	s, _ := open(t, 0)
	tarball := mkTar(t,
		ent{typ: tar.TypeXGlobalHeader},
		ent{name: "./", typ: tar.TypeDir},
		ent{name: "app/", typ: tar.TypeDir, mode: 0o750, uid: 1000},
		ent{name: "app/main.py", body: "print('hi')\n", mode: 0o600, uid: 1000},
		ent{name: "app/run.sh", body: "#!/bin/sh\n", mode: 0o755},
		ent{name: "app/link.py", typ: tar.TypeSymlink, link: "main.py"},
		ent{name: "app/up", typ: tar.TypeSymlink, link: "../data/x.txt"},
		ent{name: "app/hard.py", typ: tar.TypeLink, link: "app/main.py"},
		ent{name: "implicit/deep/f.txt", body: "deep"},
		ent{name: "ro/", typ: tar.TypeDir, mode: 0o555},
		ent{name: "ro/inside", body: "r", mode: 0o444},
		ent{name: "bin/tool", body: "t", mode: 0o4755},
	)
	if err := s.Put(h1, bytes.NewReader(gz(t, tarball))); err != nil {
		t.Fatal(err)
	}
	dest := t.TempDir()
	if err := s.Extract(h1, dest); err != nil {
		t.Fatal(err)
	}
	root := filepath.Join(dest, h1)
	t.Cleanup(func() { removeTree(root) })

	read := func(p string) string {
		b, err := os.ReadFile(filepath.Join(root, p))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	mode := func(p string) fs.FileMode {
		fi, err := os.Lstat(filepath.Join(root, p))
		if err != nil {
			t.Fatal(err)
		}
		return fi.Mode()
	}
	if read("app/main.py") != "print('hi')\n" || read("app/link.py") != "print('hi')\n" || read("app/hard.py") != "print('hi')\n" {
		t.Fatal("contents")
	}
	if read("implicit/deep/f.txt") != "deep" || read("ro/inside") != "r" {
		t.Fatal("contents")
	}
	for p, want := range map[string]fs.FileMode{
		"app":           fs.ModeDir | 0o750,
		"app/main.py":   0o600,
		"app/run.sh":    0o755,
		"implicit":      fs.ModeDir | 0o755,
		"implicit/deep": fs.ModeDir | 0o755,
		"ro":            fs.ModeDir | 0o555,
		"ro/inside":     0o444,
		"bin/tool":      fs.ModeSetuid | 0o755,
	} {
		if got := mode(p); got != want {
			t.Errorf("%s mode %v, want %v", p, got, want)
		}
	}
	if mode("app/link.py")&fs.ModeSymlink == 0 {
		t.Fatal("link.py is not a symlink")
	}
	if target, _ := os.Readlink(filepath.Join(root, "app/up")); target != "../data/x.txt" {
		t.Fatalf("dangling in-context symlink target %q", target)
	}
	a, _ := os.Stat(filepath.Join(root, "app/main.py"))
	b, _ := os.Stat(filepath.Join(root, "app/hard.py"))
	if !os.SameFile(a, b) {
		t.Fatal("hard link not preserved")
	}
	if !a.ModTime().Equal(mtime) {
		t.Fatalf("mtime %v", a.ModTime())
	}
	if fi, _ := os.Stat(filepath.Join(root, "app")); !fi.ModTime().Equal(mtime) {
		t.Fatalf("dir mtime %v", fi.ModTime())
	}
	if top, _ := os.Stat(root); top.Mode().Perm() != 0o700 {
		t.Fatalf("context root mode %v", top.Mode())
	}
	if os.Geteuid() == 0 {
		if uid, _ := owner(t, filepath.Join(root, "app/main.py")); uid != 1000 {
			t.Fatalf("uid %d, want 1000", uid)
		}
		if uid, _ := owner(t, filepath.Join(root, "app")); uid != 1000 {
			t.Fatalf("dir uid %d, want 1000", uid)
		}
	}

	// Extracting again replaces the tree, dropping stray files.
	os.Chmod(filepath.Join(root, "app"), 0o755)
	os.WriteFile(filepath.Join(root, "app", "stray"), []byte("s"), 0o644)
	if err := s.Extract(h1, dest); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "app", "stray")); !errors.Is(err, os.ErrNotExist) {
		t.Fatal("re-extract kept a stray file")
	}
	ents, _ := os.ReadDir(dest)
	if len(ents) != 1 || ents[0].Name() != h1 {
		t.Fatalf("dest has %v", ents)
	}
}

func TestExtractNotFound(t *testing.T) {
	s, _ := open(t, 0)
	if err := s.Extract(h1, t.TempDir()); !errors.Is(err, ErrNotFound) {
		t.Fatalf("err = %v", err)
	}
}

// A tar placed in the store dir behind Put's back is still checked.
func TestExtractRevalidates(t *testing.T) {
	s, dir := open(t, 0)
	evil := mkTar(t, ent{name: "../../escape", body: "x"})
	if err := os.WriteFile(filepath.Join(dir, h1+".tar"), evil, 0o600); err != nil {
		t.Fatal(err)
	}
	dest := t.TempDir()
	if err := s.Extract(h1, dest); !errors.Is(err, ErrUnsafePath) {
		t.Fatalf("err = %v", err)
	}
	ents, _ := os.ReadDir(dest)
	if len(ents) != 0 {
		t.Fatalf("dest has %v", ents)
	}
	if _, err := os.Stat(filepath.Join(filepath.Dir(dest), "escape")); err == nil {
		t.Fatal("escaped")
	}
}

func TestGC(t *testing.T) {
	s, dir := open(t, 0)
	if err := s.Put(h1, bytes.NewReader(simpleTar(t))); err != nil {
		t.Fatal(err)
	}
	if err := s.Put(h2, bytes.NewReader(mkTar(t, ent{name: "r", body: "r"}))); err != nil {
		t.Fatal(err)
	}
	old := time.Now().Add(-48 * time.Hour)
	os.Chtimes(s.Path(h1), old, old)
	os.Chtimes(s.Path(h2), old, old)
	stale := filepath.Join(dir, "."+h1+".123.partial")
	os.WriteFile(stale, []byte("p"), 0o600)
	os.Chtimes(stale, old, old)
	unrelated := filepath.Join(dir, "notes.txt")
	os.WriteFile(unrelated, []byte("n"), 0o600)
	os.Chtimes(unrelated, old, old)

	// Re-uploading identical bytes refreshes the age.
	if err := s.Put(h2, bytes.NewReader(gz(t, mkTar(t, ent{name: "r", body: "r"})))); err != nil {
		t.Fatal(err)
	}
	n, err := s.GC(24 * time.Hour)
	if err != nil || n != 1 {
		t.Fatalf("GC = %d, %v", n, err)
	}
	if s.Has(h1) || !s.Has(h2) {
		t.Fatalf("after GC: h1 %v h2 %v", s.Has(h1), s.Has(h2))
	}
	if _, err := os.Stat(stale); !errors.Is(err, os.ErrNotExist) {
		t.Fatal("stale partial kept")
	}
	if _, err := os.Stat(unrelated); err != nil {
		t.Fatal("GC removed an unrelated file")
	}
	if n, _ := s.GC(24 * time.Hour); n != 0 {
		t.Fatalf("second GC removed %d", n)
	}
}

func TestOpenRemovesPartials(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "."+h1+".42.partial")
	os.WriteFile(p, []byte("half"), 0o600)
	s, err := Open(dir, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
		t.Fatal("partial survived Open")
	}
	if s.Has(h1) {
		t.Fatal("partial is present")
	}
}

func TestConcurrentPut(t *testing.T) {
	s, _ := open(t, 0)
	bodies := [][]byte{simpleTar(t), mkTar(t, ent{name: "other", body: "o"})}
	var wg sync.WaitGroup
	errs := make([]error, 16)
	for i := range errs {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			errs[i] = s.Put(h1, bytes.NewReader(bodies[i%2]))
		}(i)
	}
	wg.Wait()
	stored, _ := os.ReadFile(s.Path(h1))
	for i, err := range errs {
		same := bytes.Equal(bodies[i%2], stored)
		if same && err != nil || !same && !errors.Is(err, ErrConflict) {
			t.Errorf("Put %d (same=%v): %v", i, same, err)
		}
	}
}
