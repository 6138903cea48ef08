// Package hostmount holds CubeSandbox's host mounts: host directories bound
// into a sandbox, requested by the create's metadata["host-mount"], a JSON
// list of {hostPath, mountPath, readOnly}. Parse validates a request against
// the server's allowed prefixes with CubeMaster's wording; OpenDir reaches a
// host directory without following any symlink, so what is mounted is what
// was checked (docs/volumes.md, "Host mounts").
package hostmount

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// Key is the metadata key of a create's host mounts.
const Key = "host-mount"

// MaxMounts bounds one sandbox's host mounts.
const MaxMounts = 16

// Mount is one host mount.
type Mount struct {
	HostPath  string `json:"hostPath"`
	MountPath string `json:"mountPath"`
	ReadOnly  bool   `json:"readOnly,omitempty"`
}

var (
	// ErrInvalid: the request is malformed or names what may not be mounted.
	ErrInvalid = errors.New("hostmount: invalid")
	// ErrSymlink: a component of the host path is a symlink.
	ErrSymlink = errors.New("hostmount: symlink")
	// ErrNotDir: the host path (or a component) is not a directory.
	ErrNotDir = errors.New("hostmount: not a directory")
	// ErrNotExist: the host path does not exist.
	ErrNotExist = errors.New("hostmount: no such file or directory")
)

func invalid(format string, a ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalid, fmt.Sprintf(format, a...))
}

// Asks reports whether raw, metadata[Key], asks for any host mount: a
// non-empty list, or a value that is not a list at all (never read as
// "nothing").
func Asks(raw string) bool {
	raw = strings.TrimSpace(raw)
	var ms []json.RawMessage
	return raw != "" && (json.Unmarshal([]byte(raw), &ms) != nil || len(ms) > 0)
}

// Parse decodes and validates raw, metadata[Key], against prefixes (clean,
// absolute, never "/"). Every entry must be valid for any to be: one bad
// entry refuses the whole list. An empty list is no mounts. Host paths come
// back cleaned; each Mount's prefix is Within's.
func Parse(raw string, prefixes []string) ([]Mount, error) {
	if strings.TrimSpace(raw) == "" {
		return nil, nil
	}
	dec := json.NewDecoder(bytes.NewReader([]byte(raw)))
	dec.DisallowUnknownFields()
	var ms []Mount
	if err := dec.Decode(&ms); err != nil {
		return nil, invalid("invalid %q annotation: want a JSON list of {hostPath, mountPath, readOnly}: %v", Key, err)
	}
	if dec.More() {
		return nil, invalid("invalid %q annotation: text after the JSON list", Key)
	}
	if len(ms) > MaxMounts {
		return nil, invalid("%q: %d entries, at most %d", Key, len(ms), MaxMounts)
	}
	seen := map[string]bool{}
	for i := range ms {
		m := &ms[i]
		if !strings.HasPrefix(m.HostPath, "/") {
			return nil, invalid("%q entry[%d]: hostPath must be an absolute path, got %q", Key, i, m.HostPath)
		}
		if !strings.HasPrefix(m.MountPath, "/") {
			return nil, invalid("%q entry[%d]: mountPath must be an absolute path, got %q", Key, i, m.MountPath)
		}
		if strings.ContainsRune(m.HostPath, 0) || strings.ContainsRune(m.MountPath, 0) || len(m.HostPath) > 4096 || len(m.MountPath) > 4096 {
			return nil, invalid("%q entry[%d]: path too long or contains NUL", Key, i)
		}
		// Lexical: "/data/shared/../etc" is "/data/etc", outside.
		m.HostPath = filepath.Clean(m.HostPath)
		m.MountPath = filepath.Clean(m.MountPath)
		if _, ok := Within(m.HostPath, prefixes); !ok {
			return nil, invalid("%q entry[%d]: hostPath %q is not within an allowed mount prefix%s", Key, i, m.HostPath, allowed(prefixes))
		}
		if seen[m.MountPath] {
			return nil, invalid("%q entry[%d]: mountPath %s is used more than once", Key, i, m.MountPath)
		}
		seen[m.MountPath] = true
	}
	return ms, nil
}

func allowed(prefixes []string) string {
	if len(prefixes) == 0 {
		return " (this server allows none: serve --host-mount-prefix)"
	}
	return " (" + strings.Join(prefixes, ", ") + ")"
}

// Within returns the prefix p holds path: path is p or below it, component
// by component ("/data/shared_evil" is not within "/data/shared").
func Within(path string, prefixes []string) (string, bool) {
	for _, p := range prefixes {
		if path == p || strings.HasPrefix(path, strings.TrimSuffix(p, "/")+"/") {
			return p, true
		}
	}
	return "", false
}

// CheckPrefix validates a configured prefix and returns its canonical form
// (symlinks of the operator's own path resolved once, here).
func CheckPrefix(p string) (string, error) {
	if !filepath.IsAbs(p) {
		return "", fmt.Errorf("host mount prefix %q must be absolute", p)
	}
	r, err := filepath.EvalSymlinks(filepath.Clean(p))
	if err != nil {
		return "", fmt.Errorf("host mount prefix %q: %w", p, err)
	}
	if r == "/" {
		return "", fmt.Errorf("host mount prefix %q is the host's root", p)
	}
	fi, err := os.Stat(r)
	if err != nil {
		return "", err
	}
	if !fi.IsDir() {
		return "", fmt.Errorf("host mount prefix %q is not a directory", p)
	}
	return r, nil
}

// OpenDir opens path, which must be under (a canonical prefix) or under
// itself, as an O_PATH descriptor, walking down from under one component
// at a time with O_NOFOLLOW: no symlink on the way is followed, so a link
// planted under the prefix (by a sandbox that mounts it read-write) cannot
// send the mount elsewhere. Mounting from the descriptor closes the window
// between this check and the mount.
func OpenDir(under, path string) (*os.File, error) {
	rel, err := filepath.Rel(under, path)
	if err != nil || rel == ".." || strings.HasPrefix(rel, "../") {
		return nil, invalid("%s is not under %s", path, under)
	}
	fd, err := unix.Open(under, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", under, err)
	}
	at := under
	if rel != "." {
		for _, c := range strings.Split(rel, "/") {
			next, err := unix.Openat(fd, c, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
			unix.Close(fd)
			at = filepath.Join(at, c)
			if err != nil {
				if errors.Is(err, unix.ENOENT) {
					return nil, fmt.Errorf("%w: %s", ErrNotExist, at)
				}
				return nil, fmt.Errorf("open %s: %w", at, err)
			}
			fd = next
			var st unix.Stat_t
			if err := unix.Fstat(fd, &st); err != nil {
				unix.Close(fd)
				return nil, err
			}
			switch st.Mode & unix.S_IFMT {
			case unix.S_IFDIR:
			case unix.S_IFLNK:
				unix.Close(fd)
				return nil, fmt.Errorf("%w: %s is a symlink; host mounts never follow symlinks", ErrSymlink, at)
			default:
				unix.Close(fd)
				return nil, fmt.Errorf("%w: %s", ErrNotDir, at)
			}
		}
	}
	return os.NewFile(uintptr(fd), path), nil
}
