// Package mountinfo answers "is this path a mount point?" from
// /proc/self/mountinfo. Comparing st_dev with the parent is not enough: a bind
// mount of a directory on the same filesystem keeps the same st_dev.
package mountinfo

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

// Mountpoints lists the mount points of the calling process's mount
// namespace, in mount order (a path appears once per stacked mount).
func Mountpoints() ([]string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		// id parent major:minor root mountpoint options ...
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		out = append(out, unescape(fields[4]))
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read /proc/self/mountinfo: %w", err)
	}
	return out, nil
}

// unescape undoes the kernel's octal escaping of space, tab, newline and
// backslash (\040 etc.) in mountinfo paths.
func unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// resolve makes path comparable with mountinfo entries, which the kernel
// prints fully resolved.
func resolve(path string) (string, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return "", err
	}
	return filepath.EvalSymlinks(abs)
}

// IsMountpoint reports whether path is a mount point; a missing path is not.
func IsMountpoint(path string) (bool, error) {
	p, err := resolve(path)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	mps, err := Mountpoints()
	if err != nil {
		return false, err
	}
	for _, mp := range mps {
		if mp == p {
			return true, nil
		}
	}
	return false, nil
}

// Under lists the mount points at or below dir, deepest first (the order
// to unmount them in). Used by tests to clean up after themselves.
func Under(dir string) ([]string, error) {
	d, err := resolve(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	mps, err := Mountpoints()
	if err != nil {
		return nil, err
	}
	var out []string
	for _, mp := range mps {
		if mp == d || strings.HasPrefix(mp, d+"/") {
			out = append(out, mp)
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return len(out[i]) > len(out[j]) })
	return out, nil
}
