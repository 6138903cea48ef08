package hostmount_test

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/cubicle-dev/cubicle/internal/hostmount"
)

// CubeSandbox's sdk_compat rejections, with the phrase each one pins.
func TestParseRefusesEachBadShapeNamingTheEntry(t *testing.T) {
	prefixes := []string{"/data/shared"}
	for _, tc := range []struct{ raw, want string }{
		{`[{"hostPath":"/data/shared/../etc/shadow","mountPath":"/mnt/x"}]`, `entry[0]: hostpath "/data/etc/shadow" is not within an allowed mount prefix`},
		{`[{"hostPath":"/data/shared_evil/data","mountPath":"/mnt/x"}]`, "is not within an allowed mount prefix"},
		{`[{"hostPath":"data/shared/foo","mountPath":"/mnt/x"}]`, "hostpath must be an absolute path"},
		{`[{"hostPath":"/var/run/secret","mountPath":"/mnt/x"}]`, "is not within an allowed mount prefix"},
		{`[{"hostPath":"/","mountPath":"/mnt/x"}]`, "is not within an allowed mount prefix"},
		{`[{"hostPath":"","mountPath":"/mnt/x"}]`, "hostpath must be an absolute path"},
		{`[{"hostPath":"/data/shared/ok","mountPath":"mnt/rel"}]`, "mountpath must be an absolute path"},
		{`[{"hostPath":"/data/shared/ok","mountPath":""}]`, "mountpath must be an absolute path"},
		{`[{"hostPath":"/data/shared/ok","mountPath":"/mnt/ok"},{"hostPath":"/etc/secret","mountPath":"/mnt/s"}]`, `entry[1]: hostpath "/etc/secret" is not within an allowed mount prefix`},
		{`this-is-not-json`, `invalid "host-mount" annotation`},
		{`{"hostPath": "/data/shared", "mountPath": "/mnt/x"}`, `invalid "host-mount" annotation`},
		{`"just-a-string"`, `invalid "host-mount" annotation`},
		{`[{"hostPath":"/data/shared/a","mountPath":"/mnt/x","propagation":"shared"}]`, `unknown field "propagation"`},
		{`[{"hostPath":"/data/shared/a","mountPath":"/mnt/x"},{"hostPath":"/data/shared/b","mountPath":"/mnt/x/"}]`, "used more than once"},
	} {
		_, err := hostmount.Parse(tc.raw, prefixes)
		if !errors.Is(err, hostmount.ErrInvalid) || !strings.Contains(strings.ToLower(err.Error()), strings.ToLower(tc.want)) {
			t.Errorf("%s: %v, want %q", tc.raw, err, tc.want)
		}
	}
}

func TestParseAcceptsThePrefixItselfAndAnEmptyList(t *testing.T) {
	ms, err := hostmount.Parse(`[{"hostPath":"/data/shared/","mountPath":"/mnt/exact/","readOnly":true},{"hostPath":"/data/shared/a/b","mountPath":"/mnt/b"}]`, []string{"/data/shared"})
	if err != nil || len(ms) != 2 || ms[0].HostPath != "/data/shared" || ms[0].MountPath != "/mnt/exact" || !ms[0].ReadOnly || ms[1].ReadOnly {
		t.Fatalf("%+v %v", ms, err)
	}
	for _, raw := range []string{"", "[]", "  "} {
		if ms, err := hostmount.Parse(raw, nil); err != nil || len(ms) != 0 {
			t.Fatalf("%q: %+v %v", raw, ms, err)
		}
	}
	// A server with no prefix refuses every mount and says why.
	if _, err := hostmount.Parse(`[{"hostPath":"/data/shared","mountPath":"/mnt"}]`, nil); err == nil || !strings.Contains(err.Error(), "serve --host-mount-prefix") {
		t.Fatalf("no prefixes: %v", err)
	}
}

// OpenDir walks without following a symlink anywhere below the prefix, and
// names what it met.
func TestOpenDirFollowsNoSymlink(t *testing.T) {
	root := t.TempDir()
	prefix := filepath.Join(root, "shared")
	outside := filepath.Join(root, "secret")
	for _, d := range []string{filepath.Join(prefix, "a", "b"), outside} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	os.WriteFile(filepath.Join(prefix, "file"), nil, 0o644)
	os.Symlink(outside, filepath.Join(prefix, "escape"))
	os.Symlink(filepath.Join(prefix, "a"), filepath.Join(prefix, "inner"))

	f, err := hostmount.OpenDir(prefix, filepath.Join(prefix, "a", "b"))
	if err != nil {
		t.Fatal(err)
	}
	var st, want os.FileInfo
	st, _ = os.Stat("/proc/self/fd/" + itoa(f.Fd()))
	want, _ = os.Stat(filepath.Join(prefix, "a", "b"))
	f.Close()
	if !os.SameFile(st, want) {
		t.Fatal("OpenDir opened another directory")
	}
	if f, err := hostmount.OpenDir(prefix, prefix); err != nil {
		t.Fatalf("the prefix itself: %v", err)
	} else {
		f.Close()
	}
	for _, tc := range []struct {
		path string
		want error
	}{
		{filepath.Join(prefix, "escape"), hostmount.ErrSymlink},
		{filepath.Join(prefix, "inner", "b"), hostmount.ErrSymlink}, // even one that stays inside
		{filepath.Join(prefix, "file"), hostmount.ErrNotDir},
		{filepath.Join(prefix, "missing"), hostmount.ErrNotExist},
		{outside, hostmount.ErrInvalid},
	} {
		if f, err := hostmount.OpenDir(prefix, tc.path); !errors.Is(err, tc.want) {
			if f != nil {
				f.Close()
			}
			t.Errorf("%s: %v, want %v", tc.path, err, tc.want)
		}
	}
}

func TestCheckPrefix(t *testing.T) {
	dir := t.TempDir()
	link := filepath.Join(t.TempDir(), "link")
	os.Symlink(dir, link)
	if got, err := hostmount.CheckPrefix(link + "/"); err != nil || got != dir {
		t.Fatalf("a symlinked prefix resolves once: %q %v", got, err)
	}
	for _, bad := range []string{"/", "relative", filepath.Join(dir, "missing")} {
		if _, err := hostmount.CheckPrefix(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func itoa(u uintptr) string { return strconv.FormatUint(uint64(u), 10) }

func TestAsks(t *testing.T) {
	for raw, want := range map[string]bool{"": false, "  ": false, "[]": false, " [] ": false,
		`[{"hostPath":"/a","mountPath":"/b"}]`: true, "[1]": true, "not-json": true, "{}": true} {
		if got := hostmount.Asks(raw); got != want {
			t.Errorf("Asks(%q) = %v, want %v", raw, got, want)
		}
	}
}
