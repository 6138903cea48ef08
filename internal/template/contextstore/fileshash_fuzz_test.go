package contextstore

import (
	"bytes"
	"errors"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	cubicle "github.com/cubicle-dev/cubicle/sdk/go"
)

// treeFromSpec makes a build context under dir/app from a line-per-entry
// spec, "kind|relative name|octal mode|content or link target" (kind f, d
// or l), skipping what cannot be made. It reports whether a regular file was
// made (the first one's path).
func treeFromSpec(t *testing.T, dir, spec string) (firstFile string) {
	t.Helper()
	app := filepath.Join(dir, "app")
	if err := os.MkdirAll(app, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, f := range specLines(spec, 4) {
		rel := path.Clean("/" + f[1])[1:]
		if rel == "" || strings.ContainsRune(rel, 0) || len(rel) > 200 {
			continue
		}
		p := filepath.Join(app, filepath.FromSlash(rel))
		if os.MkdirAll(filepath.Dir(p), 0o755) != nil {
			continue
		}
		mode, _ := strconv.ParseUint(f[2], 8, 32)
		// Keep the tree walkable and readable by this process.
		perm := os.FileMode(mode)&0o777 | 0o600
		switch f[0] {
		case "f":
			if os.WriteFile(p, []byte(f[3]), perm) == nil {
				os.Chmod(p, perm)
				if firstFile == "" {
					firstFile = p
				}
			}
		case "d":
			if os.Mkdir(p, perm|0o700) == nil {
				os.Chmod(p, perm|0o700)
			}
		case "l":
			if f[3] != "" && !strings.ContainsRune(f[3], 0) {
				os.Symlink(f[3], p)
			}
		}
	}
	return firstFile
}

func hashOf(t *testing.T, ctx string) (string, []cubicle.ContextEntry, bool) {
	t.Helper()
	ents, err := cubicle.CollectContext(ctx, "app", nil)
	if err != nil {
		return "", nil, false
	}
	h, err := cubicle.FilesHash("app", "/app", ents)
	if err != nil {
		t.Fatalf("FilesHash: %v", err)
	}
	return h, ents, true
}

// FuzzFilesHash: the SDK's filesHash of a context is deterministic, changes
// when a file's content does, and is the same for the tree the server
// extracts from the archive the SDK uploads under it, so the hash a build
// names really describes the files it copies.
func FuzzFilesHash(f *testing.F) {
	for _, s := range []string{
		"f|main.py|644|print(1)\nf|run.sh|755|#!/bin/sh\nd|sub|755|\nf|sub/deep/n.txt|600|n",
		"f|a|644|\nl|link|a|\nl|dangling|nowhere|\nl|up|../outside|\nl|out|../../etc|\nl|abs|/etc/passwd|",
		"d|empty|700|\nf|suid|4755|x\nf|.env|600|SECRET=1",
		"f|sp ace|644|x\nf|uni-\u00e9|644|y\nf|q\"uote|644|z",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, spec string) {
		ctx := t.TempDir()
		first := treeFromSpec(t, ctx, spec)
		h1, ents, ok := hashOf(t, ctx)
		if !ok {
			return
		}
		if h2, _, _ := hashOf(t, ctx); h2 != h1 {
			t.Fatalf("filesHash not deterministic: %s vs %s", h1, h2)
		}
		var buf bytes.Buffer
		if err := cubicle.WriteContextArchive(&buf, ents); err != nil {
			t.Fatalf("WriteContextArchive: %v", err)
		}
		st, err := Open(filepath.Join(t.TempDir(), "store"), 1<<20)
		if err != nil {
			t.Fatal(err)
		}
		if err := st.Put(h1, &buf); err != nil {
			// A symlink out of the context is refused on purpose.
			if errors.Is(err, ErrUnsafePath) {
				return
			}
			t.Fatalf("the SDK's own archive was refused: %v", err)
		}
		dest := t.TempDir()
		if err := st.Extract(h1, dest); err != nil {
			t.Fatalf("Extract: %v", err)
		}
		if got, _, ok := hashOf(t, filepath.Join(dest, h1)); !ok || got != h1 {
			t.Fatalf("extracted tree hashes to %s, uploaded under %s", got, h1)
		}
		if first != "" {
			b, _ := os.ReadFile(first)
			os.WriteFile(first, append(b, 'x'), 0o600)
			if h3, _, _ := hashOf(t, ctx); h3 == h1 {
				t.Fatalf("changing %s did not change the hash", first)
			}
		}
	})
}
