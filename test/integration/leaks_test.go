package integration

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/cubicle-dev/cubicle/internal/testenv/testcluster"
)

// runtimeName is the --runtime the server was started with.
func (s *server) runtimeName() string {
	for i, a := range s.args {
		if a == "--runtime" && i+1 < len(s.args) {
			return s.args[i+1]
		}
		if v, ok := strings.CutPrefix(a, "--runtime="); ok {
			return v
		}
	}
	return "runc"
}

// stateRoot is the --root the server's OCI driver uses.
func (s *server) stateRoot() string { return filepath.Join(s.DataDir, "run", s.runtimeName()) }

// containers lists the container IDs under the server's state root. runc
// takes -q or --quiet, runsc only -quiet or --quiet.
func (s *server) containers() ([]string, error) {
	root := s.stateRoot()
	if _, err := os.Stat(root); os.IsNotExist(err) {
		return nil, nil
	}
	out, err := exec.Command(s.runtimeName(), "--root", root, "list", "--quiet").Output()
	if err != nil {
		var stderr string
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = string(ee.Stderr)
		}
		return nil, fmt.Errorf("%s --root %s list --quiet: %v %s", s.runtimeName(), root, err, strings.TrimSpace(stderr))
	}
	return strings.Fields(string(out)), nil
}

// waitNoContainers gives kills still in flight (warm-pool standbys a pool
// resize ends in the background) a bounded moment to finish.
func (s *server) waitNoContainers(max time.Duration) {
	deadline := time.Now().Add(max)
	for time.Now().Before(deadline) {
		if ids, err := s.containers(); err != nil || len(ids) == 0 {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// cgroupHierarchies are the cgroup mounts a cgroup parent can live in.
func cgroupHierarchies() []string { return testcluster.CgroupHierarchies() }

func vethOf(id string) string {
	h := sha256.Sum256([]byte(id))
	return "cbv" + hex.EncodeToString(h[:4])
}

// sandboxLeftovers lists what the server's sandboxes left on the host once
// every sandbox was killed and the server stopped: containers in its state
// root, netns files, veths (on its bridge, or named for a sandbox it had),
// cgroups under its cgroup parent, sandbox dirs and mounts.
func (s *server) sandboxLeftovers() []string {
	var left []string
	if ids, err := s.containers(); err != nil {
		left = append(left, err.Error())
	} else if len(ids) > 0 {
		left = append(left, fmt.Sprintf("containers in %s: %v", s.stateRoot(), ids))
	}
	nsDir := filepath.Join("/run/cubicle", s.Bridge, "netns")
	ents, _ := os.ReadDir(nsDir)
	for _, e := range ents {
		if e.Type().IsRegular() {
			left = append(left, "netns file "+filepath.Join(nsDir, e.Name()))
		}
	}
	addrs, _ := os.ReadDir(filepath.Join(nsDir, ".addr"))
	for _, e := range addrs {
		left = append(left, "netns address record "+filepath.Join(nsDir, ".addr", e.Name()))
	}
	if out, err := exec.Command("ip", "-o", "link", "show", "master", s.Bridge).Output(); err == nil {
		for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
			if l != "" {
				left = append(left, "link on bridge "+s.Bridge+": "+l)
			}
		}
	}
	for id := range s.seen {
		if exec.Command("ip", "link", "show", vethOf(id)).Run() == nil {
			left = append(left, "host veth "+vethOf(id)+" of sandbox "+id)
		}
	}
	for _, h := range cgroupHierarchies() {
		ents, _ := os.ReadDir(filepath.Join(h, s.Cgroup))
		for _, e := range ents {
			if e.IsDir() {
				left = append(left, "cgroup "+filepath.Join(h, s.Cgroup, e.Name()))
			}
		}
	}
	for _, e := range sandboxEntries(s.DataDir) {
		left = append(left, "sandbox dir "+e)
	}
	if f, err := os.Open("/proc/self/mountinfo"); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			fs := strings.Fields(sc.Text())
			if len(fs) < 5 {
				continue
			}
			mp := fs[4]
			// runsc keeps one null-netns bind mount per state root; it is the
			// runtime's, not a sandbox's.
			if strings.HasPrefix(mp, filepath.Join(s.DataDir, "run")+"/") {
				continue
			}
			// The reflink disk store stays mounted when serve stops, as
			// the data dir's filesystem would; a disk left in it is a
			// sandbox entry (sandboxEntries). So does a kept snapshot's
			// layer that is a clone of a disk.
			if mp == filepath.Join(s.DataDir, "disk-store") || testcluster.SnapshotLayerMount(s.DataDir, mp) {
				continue
			}
			if strings.HasPrefix(mp, s.DataDir+"/") || strings.HasPrefix(mp, "/run/cubicle/"+s.Bridge+"/") {
				left = append(left, "mount "+mp)
			}
		}
		f.Close()
	}
	return left
}

// forceClean removes whatever the server left, containers first (by the
// runtime, with the server's state root), so no sandbox keeps running once
// its state dir is gone.
func (s *server) forceClean() {
	if ids, err := s.containers(); err == nil {
		for _, id := range ids {
			exec.Command(s.runtimeName(), "--root", s.stateRoot(), "kill", id, "KILL").Run()
			exec.Command(s.runtimeName(), "--root", s.stateRoot(), "delete", "--force", id).Run()
		}
	}
	for id := range s.seen {
		exec.Command("ip", "link", "del", vethOf(id)).Run()
	}
	testcluster.RemoveCgroups(s.Cgroup)
}

// infraLeftovers lists what is still there after the clean-up: the server's
// bridge, nft tables, cgroup parent, netns dir and data dir must all be gone.
func (s *server) infraLeftovers() []string {
	var left []string
	if exec.Command("ip", "link", "show", s.Bridge).Run() == nil {
		left = append(left, "bridge "+s.Bridge)
	}
	if out, err := exec.Command("nft", "list", "tables").Output(); err == nil {
		for _, l := range strings.Split(string(out), "\n") {
			if f := strings.Fields(l); len(f) == 3 && strings.HasSuffix(f[2], "_"+s.Bridge) {
				left = append(left, "nft "+strings.TrimSpace(l))
			}
		}
	}
	for _, h := range cgroupHierarchies() {
		if _, err := os.Stat(filepath.Join(h, s.Cgroup)); err == nil {
			left = append(left, "cgroup parent "+filepath.Join(h, s.Cgroup))
		}
		if _, err := os.Stat(filepath.Join(h, s.Cgroup+"-lxcfs")); err == nil {
			left = append(left, "lxcfs cgroup "+filepath.Join(h, s.Cgroup+"-lxcfs"))
		}
	}
	for _, d := range []string{filepath.Join("/run/cubicle", s.Bridge), s.DataDir} {
		if _, err := os.Stat(d); err == nil {
			left = append(left, "dir "+d)
		}
	}
	return left
}
