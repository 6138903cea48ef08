package testcluster

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
)

// Suffix is six random hex digits, for names of host resources (bridges,
// cgroups, namespaces) that concurrent runs must not share.
func Suffix() string {
	b := make([]byte, 3)
	rand.Read(b)
	return hex.EncodeToString(b)
}

var (
	takenMu sync.Mutex
	taken   = map[string]bool{}
)

// FreeListenAddr picks a free loopback port below the kernel's ephemeral
// range: a port from that range (what listen on :0 hands out) can be taken
// by any outgoing connection between this check and the child's own bind.
// No address is handed out twice in one process.
func FreeListenAddr() (string, error) {
	low := 32768
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if n, err := strconv.Atoi(f[0]); err == nil {
				low = n
			}
		}
	}
	from := max(1024, low-12000)
	takenMu.Lock()
	defer takenMu.Unlock()
	for range 200 {
		b := make([]byte, 2)
		rand.Read(b)
		addr := fmt.Sprintf("127.0.0.1:%d", from+(int(b[0])<<8|int(b[1]))%(low-from))
		if taken[addr] {
			continue
		}
		if ln, err := net.Listen("tcp", addr); err == nil {
			ln.Close()
			taken[addr] = true
			return addr, nil
		}
	}
	return "", fmt.Errorf("no free loopback port in %d-%d", from, low-1)
}

var (
	poolMu   sync.Mutex
	poolNext int
)

// FreePool picks a prefix.X.0/24 (prefix is two octets, e.g. "10.215")
// that no interface on the host uses (another suite, or a leftover of a
// crashed run, may hold one). Successive calls in one process go round
// the 250 pools from the last one picked, so pools picked before their
// bridges exist differ.
func FreePool(prefix string) (string, error) {
	out, _ := exec.Command("ip", "-o", "-4", "addr", "show").Output()
	poolMu.Lock()
	defer poolMu.Unlock()
	for i := range 250 {
		x := (os.Getpid() + poolNext + i) % 250
		if !strings.Contains(string(out), fmt.Sprintf(" %s.%d.", prefix, x)) {
			poolNext += i + 1
			return fmt.Sprintf("%s.%d.0/24", prefix, x), nil
		}
	}
	return "", errors.New("no free " + prefix + ".X.0/24 pool")
}

// CgroupHierarchies are the cgroup v2 root, or every v1 hierarchy.
func CgroupHierarchies() []string {
	if _, err := os.Stat("/sys/fs/cgroup/cgroup.controllers"); err == nil {
		return []string{"/sys/fs/cgroup"}
	}
	ents, _ := os.ReadDir("/sys/fs/cgroup")
	var out []string
	for _, e := range ents {
		if e.IsDir() { // symlinks (cpu -> cpu,cpuacct) are skipped by IsDir
			out = append(out, filepath.Join("/sys/fs/cgroup", e.Name()))
		}
	}
	return out
}

var octal = regexp.MustCompile(`\\([0-7]{3})`)

// MountsUnder lists mount points at or under dir, deepest first.
func MountsUnder(dir string) []string {
	raw, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	var points []string
	for _, line := range strings.Split(string(raw), "\n") {
		f := strings.Fields(line)
		if len(f) < 5 {
			continue
		}
		mp := octal.ReplaceAllStringFunc(f[4], func(s string) string {
			n, _ := strconv.ParseUint(s[1:], 8, 8)
			return string(rune(n))
		})
		if mp == dir || strings.HasPrefix(mp, dir+"/") {
			points = append(points, mp)
		}
	}
	for i, j := 0, len(points)-1; i < j; i, j = i+1, j-1 {
		points[i], points[j] = points[j], points[i]
	}
	return points
}

// UnmountUnder lazily unmounts every mount point at or under dir, deepest
// first.
func UnmountUnder(dir string) {
	for _, mp := range MountsUnder(dir) {
		syscall.Unmount(mp, syscall.MNT_DETACH)
	}
}
