package cubicle

import (
	"archive/tar"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
)

// Build contexts: which files a COPY step sends, their hash (the e2b SDK's
// calculateFilesHash, so caches are shared with it) and the archive.

// NoFilesError is a COPY source that matched nothing (the e2b SDK's
// "No files found in ...").
type NoFilesError struct{ Src, Context string }

// Error implements error.
func (e *NoFilesError) Error() string {
	return fmt.Sprintf("no files found for COPY source %q in %s", e.Src, e.Context)
}

// FileTypeError is a context entry a build context cannot carry.
type FileTypeError struct{ Path, Kind string }

// Error implements error.
func (e *FileTypeError) Error() string {
	return fmt.Sprintf("%s is a %s; a build context holds only files, directories and symlinks", e.Path, e.Kind)
}

// ContextEntry is one path a COPY step sends.
type ContextEntry struct {
	Rel  string // POSIX path relative to the context; "" is the context itself
	Abs  string
	Info fs.FileInfo // lstat
}

// ReadDockerignore reads <ctx>/.dockerignore like the SDK (trimmed,
// blank and # lines dropped). A leading "/" is stripped as Docker does.
// "!" exceptions are not supported (the SDK reads them as literal names)
// and are reported in skipped.
func ReadDockerignore(ctxDir string) (patterns, skipped []string, err error) {
	b, err := os.ReadFile(filepath.Join(ctxDir, ".dockerignore"))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil, nil
	}
	if err != nil {
		return nil, nil, err
	}
	for _, l := range strings.Split(string(b), "\n") {
		l = strings.TrimSpace(l)
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		if strings.HasPrefix(l, "!") {
			skipped = append(skipped, l)
			continue
		}
		l = strings.TrimLeft(l, "/")
		for strings.HasPrefix(l, "./") {
			l = l[2:]
		}
		if l != "" {
			patterns = append(patterns, l)
		}
	}
	return patterns, skipped, nil
}

// tplIgnored says whether rel is excluded: glob's Ignore tests "rel" and
// "rel/" against each pattern.
func isIgnored(patterns []string, rel string) bool {
	if rel == "" {
		rel = "."
	}
	for _, p := range patterns {
		if MatchPattern(p, rel) || MatchPattern(p, rel+"/") {
			return true
		}
	}
	return false
}

// MatchPattern is the subset of minimatch (dot:true) glob and the SDK use:
// "*", "?", "[...]" within a segment, "**" across segments, and {a,b}.
func MatchPattern(pattern, name string) bool {
	for _, p := range braces(pattern) {
		if matchSegs(strings.Split(p, "/"), strings.Split(name, "/")) {
			return true
		}
	}
	return false
}

func matchSegs(p, n []string) bool {
	for len(p) > 0 {
		if p[0] == "**" {
			for len(p) > 1 && p[1] == "**" {
				p = p[1:]
			}
			if len(p) == 1 {
				return true
			}
			for i := 0; i <= len(n); i++ {
				if matchSegs(p[1:], n[i:]) {
					return true
				}
			}
			return false
		}
		if len(n) == 0 {
			return false
		}
		ok, err := path.Match(p[0], n[0])
		if err != nil {
			ok = p[0] == n[0]
		}
		if !ok {
			return false
		}
		p, n = p[1:], n[1:]
	}
	return len(n) == 0
}

// braces expands the first {a,b,...} group, recursively.
func braces(p string) []string {
	depth, start := 0, -1
	for i := 0; i < len(p); i++ {
		switch p[i] {
		case '\\':
			i++
		case '{':
			if depth == 0 {
				start = i
			}
			depth++
		case '}':
			if depth == 0 {
				continue
			}
			depth--
			if depth != 0 {
				continue
			}
			var parts []string
			d, last := 0, start+1
			for j := start + 1; j < i; j++ {
				switch p[j] {
				case '{':
					d++
				case '}':
					d--
				case ',':
					if d == 0 {
						parts = append(parts, p[last:j])
						last = j + 1
					}
				}
			}
			parts = append(parts, p[last:i])
			if len(parts) < 2 {
				continue
			}
			var out []string
			for _, part := range parts {
				out = append(out, braces(p[:start]+part+p[i+1:])...)
			}
			return out
		}
	}
	return []string{p}
}

// walkContext visits everything below root (not root itself) that ignore
// does not exclude, passing its context-relative POSIX path; an ignored
// directory is skipped whole.
func walkContext(ctxDir, root string, ignore []string, fn func(rel, abs string, d fs.DirEntry) error) error {
	return filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p == root {
			return nil
		}
		r, _ := filepath.Rel(ctxDir, p)
		r = filepath.ToSlash(r)
		if isIgnored(ignore, r) {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		return fn(r, p, d)
	})
}

// CollectContext lists what COPY src sends, sorted as the SDK sorts (by full
// path, which is by relative path). A matched directory brings itself and
// everything under it. One deliberate difference from the SDK: an ignored
// directory also hides its contents, as with Docker (the SDK's glob only
// drops the directory entry itself).
func CollectContext(ctxDir, src string, ignore []string) ([]ContextEntry, error) {
	clean := path.Clean(src)
	if clean == "." {
		clean = ""
	}
	seen := map[string]ContextEntry{}
	add := func(rel string) error {
		abs := ctxDir
		if rel != "" {
			abs = filepath.Join(ctxDir, filepath.FromSlash(rel))
		}
		fi, err := os.Lstat(abs)
		if err != nil {
			return err
		}
		if err := checkType(rel, fi); err != nil {
			return err
		}
		seen[rel] = ContextEntry{Rel: rel, Abs: abs, Info: fi}
		if !fi.IsDir() {
			return nil
		}
		return walkContext(ctxDir, abs, ignore, func(r, p string, d fs.DirEntry) error {
			fi, err := d.Info()
			if err != nil {
				return err
			}
			if err := checkType(r, fi); err != nil {
				return err
			}
			seen[r] = ContextEntry{Rel: r, Abs: p, Info: fi}
			return nil
		})
	}
	if !strings.ContainsAny(clean, "*?[{") {
		fi, err := os.Lstat(filepath.Join(ctxDir, filepath.FromSlash(clean)))
		switch {
		case errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR):
			return nil, &NoFilesError{Src: src, Context: ctxDir}
		case err != nil:
			return nil, err
		case strings.HasSuffix(src, "/") && !fi.IsDir():
			return nil, &NoFilesError{Src: src, Context: ctxDir}
		case isIgnored(ignore, clean):
			return nil, &NoFilesError{Src: src, Context: ctxDir}
		}
		if err := add(clean); err != nil {
			return nil, err
		}
	} else {
		var matches []string
		err := walkContext(ctxDir, ctxDir, ignore, func(r, _ string, d fs.DirEntry) error {
			if MatchPattern(clean, r) && (!strings.HasSuffix(src, "/") || d.IsDir()) {
				matches = append(matches, r)
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
		for _, m := range matches {
			if _, ok := seen[m]; ok {
				continue
			}
			if err := add(m); err != nil {
				return nil, err
			}
		}
	}
	if len(seen) == 0 {
		return nil, &NoFilesError{Src: src, Context: ctxDir}
	}
	out := make([]ContextEntry, 0, len(seen))
	for _, e := range seen {
		out = append(out, e)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Rel < out[j].Rel })
	return out, nil
}

func checkType(rel string, fi fs.FileInfo) error {
	m := fi.Mode()
	switch {
	case m&fs.ModeNamedPipe != 0:
		return &FileTypeError{Path: rel, Kind: "fifo"}
	case m&fs.ModeSocket != 0:
		return &FileTypeError{Path: rel, Kind: "socket"}
	case m&fs.ModeDevice != 0:
		return &FileTypeError{Path: rel, Kind: "device"}
	case m&fs.ModeIrregular != 0:
		return &FileTypeError{Path: rel, Kind: "special file"}
	}
	return nil
}

// stMode is the Unix st_mode Node reports as stats.mode.
func stMode(m fs.FileMode) uint32 {
	r := uint32(m.Perm())
	if m&fs.ModeSetuid != 0 {
		r |= 0o4000
	}
	if m&fs.ModeSetgid != 0 {
		r |= 0o2000
	}
	if m&fs.ModeSticky != 0 {
		r |= 0o1000
	}
	switch {
	case m&fs.ModeDir != 0:
		r |= 0o040000
	case m&fs.ModeSymlink != 0:
		r |= 0o120000
	case m&fs.ModeNamedPipe != 0:
		r |= 0o010000
	case m&fs.ModeSocket != 0:
		r |= 0o140000
	case m&fs.ModeDevice != 0 && m&fs.ModeCharDevice != 0:
		r |= 0o020000
	case m&fs.ModeDevice != 0:
		r |= 0o060000
	default:
		r |= 0o100000
	}
	return r
}

// FilesHash is the SDK's calculateFilesHash with resolveSymlinks off:
// SHA-256 of "COPY <src> <dest>", then per entry its relative path, mode
// and size in decimal, then the link target or the file's bytes.
func FilesHash(src, dest string, entries []ContextEntry) (string, error) {
	h := sha256.New()
	io.WriteString(h, "COPY "+src+" "+dest)
	for _, e := range entries {
		io.WriteString(h, e.Rel)
		io.WriteString(h, strconv.FormatUint(uint64(stMode(e.Info.Mode())), 10))
		io.WriteString(h, strconv.FormatInt(e.Info.Size(), 10))
		switch {
		case e.Info.Mode()&fs.ModeSymlink != 0:
			target, err := os.Readlink(e.Abs)
			if err != nil {
				return "", err
			}
			io.WriteString(h, target)
		case e.Info.Mode().IsRegular():
			f, err := os.Open(e.Abs)
			if err != nil {
				return "", err
			}
			_, err = io.Copy(h, f)
			f.Close()
			if err != nil {
				return "", err
			}
		}
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// WriteContextArchive writes the gzip tar of entries: paths relative to the
// context, directories included, symlinks kept as links.
func WriteContextArchive(w io.Writer, entries []ContextEntry) error {
	zw := gzip.NewWriter(w)
	tw := tar.NewWriter(zw)
	for _, e := range entries {
		link := ""
		if e.Info.Mode()&fs.ModeSymlink != 0 {
			t, err := os.Readlink(e.Abs)
			if err != nil {
				return err
			}
			link = t
		}
		hdr, err := tar.FileInfoHeader(e.Info, link)
		if err != nil {
			return err
		}
		hdr.Name = e.Rel
		if e.Rel == "" {
			hdr.Name = "."
		}
		if e.Info.IsDir() {
			hdr.Name += "/"
		}
		hdr.Uname, hdr.Gname = "", ""
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if e.Info.Mode().IsRegular() {
			f, err := os.Open(e.Abs)
			if err != nil {
				return err
			}
			// Exactly hdr.Size bytes: a file that grew meanwhile must not
			// break the archive.
			_, err = io.CopyN(tw, f, hdr.Size)
			f.Close()
			if err != nil {
				return fmt.Errorf("%s: %w", e.Rel, err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	return zw.Close()
}
