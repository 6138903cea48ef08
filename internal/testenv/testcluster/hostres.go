package testcluster

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
)

// Host is what one process that runs sandboxes owns on the host: its data
// dir, sandbox bridge (with its nft tables and /run/cubicle/<bridge>) and
// cgroup parent. Every name is its own, so clean-up goes by name.
type Host struct {
	Name    string // for messages
	DataDir string
	Bridge  string
	Cgroup  string
}

// NewHost makes a data dir under /var/tmp named dirPrefix… and picks a
// bridge bridgePrefix<suffix> and cgroup parent cgroupPrefix<suffix>.
func NewHost(name, dirPrefix, bridgePrefix, cgroupPrefix string) (*Host, error) {
	dir, err := os.MkdirTemp("/var/tmp", dirPrefix)
	if err != nil {
		return nil, err
	}
	s := Suffix()
	return &Host{Name: name, DataDir: dir, Bridge: bridgePrefix + s, Cgroup: cgroupPrefix + s}, nil
}

func (h *Host) stateRoot(runtime string) string { return filepath.Join(h.DataDir, "run", runtime) }

func containers(runtime, root string) ([]string, error) {
	if _, err := os.Stat(root); err != nil {
		return nil, nil
	}
	out, err := exec.Command(runtime, "--root", root, "list", "--quiet").Output()
	if err != nil {
		return nil, fmt.Errorf("%s --root %s list: %v", runtime, root, err)
	}
	return strings.Fields(string(out)), nil
}

// SandboxLeftovers lists what the host's sandboxes left once every sandbox
// was killed and the process stopped: containers, netns files and address
// records, links on the bridge, sandbox cgroups, sandbox dirs and mounts.
func (h *Host) SandboxLeftovers() []string {
	var left []string
	for _, rt := range []string{"runc", "runsc"} {
		ids, err := containers(rt, h.stateRoot(rt))
		if err != nil {
			left = append(left, err.Error())
		}
		if len(ids) > 0 {
			left = append(left, fmt.Sprintf("%s: containers %s", h.Name, strings.Join(ids, " ")))
		}
	}
	nsDir := filepath.Join("/run/cubicle", h.Bridge, "netns")
	ents, _ := os.ReadDir(nsDir)
	for _, e := range ents {
		if e.Type().IsRegular() {
			left = append(left, fmt.Sprintf("%s: netns file %s", h.Name, filepath.Join(nsDir, e.Name())))
		}
	}
	addrs, _ := os.ReadDir(filepath.Join(nsDir, ".addr"))
	for _, e := range addrs {
		left = append(left, fmt.Sprintf("%s: netns address record %s", h.Name, filepath.Join(nsDir, ".addr", e.Name())))
	}
	if out, _ := exec.Command("ip", "-o", "link", "show", "master", h.Bridge).Output(); len(strings.TrimSpace(string(out))) > 0 {
		left = append(left, fmt.Sprintf("%s: links on bridge %s: %s", h.Name, h.Bridge, strings.TrimSpace(string(out))))
	}
	for _, hier := range CgroupHierarchies() {
		ents, _ := os.ReadDir(filepath.Join(hier, h.Cgroup))
		for _, e := range ents {
			if e.IsDir() {
				left = append(left, fmt.Sprintf("%s: cgroup %s", h.Name, filepath.Join(hier, h.Cgroup, e.Name())))
			}
		}
	}
	for _, d := range []string{filepath.Join(h.DataDir, "sandboxes"), filepath.Join(h.DataDir, "sandboxes", ".private"), filepath.Join(h.DataDir, "disk-store", "disks")} {
		ents, _ := os.ReadDir(d)
		for _, e := range ents {
			if e.Name() != ".private" {
				left = append(left, fmt.Sprintf("%s: sandbox dir %s", h.Name, filepath.Join(d, e.Name())))
			}
		}
	}
	// runsc keeps one null-netns bind mount per state root; it is the runtime's.
	// The reflink disk store stays mounted after the process stops, as the
	// data dir's filesystem would (a disk left in it is listed above), and
	// so does the layer of a snapshot kept there (SnapshotLayerMount).
	runRoot := filepath.Join(h.DataDir, "run") + "/"
	store := filepath.Join(h.DataDir, "disk-store")
	for _, mp := range append(MountsUnder(filepath.Join("/run/cubicle", h.Bridge)), MountsUnder(h.DataDir)...) {
		if !strings.HasPrefix(mp, runRoot) && mp != store && !SnapshotLayerMount(h.DataDir, mp) {
			left = append(left, fmt.Sprintf("%s: mount %s", h.Name, mp))
		}
	}
	return left
}

// Clean removes everything the host's process made, by name (containers
// first, by the runtime with the host's state root, so no sandbox keeps
// running once its state dir is gone), and lists what survived.
func (h *Host) Clean() []string {
	if h.DataDir == "" {
		return nil
	}
	var left []string
	for _, rt := range []string{"runc", "runsc"} {
		root := h.stateRoot(rt)
		ids, _ := containers(rt, root)
		for _, id := range ids {
			exec.Command(rt, "--root", root, "kill", id, "KILL").Run()
			exec.Command(rt, "--root", root, "delete", "--force", id).Run()
		}
		if still, _ := containers(rt, root); len(still) > 0 {
			left = append(left, fmt.Sprintf("%s: containers survived delete --force: %s", h.Name, strings.Join(still, " ")))
		}
	}
	// Sandbox veths hang off the bridge: its ports go first.
	if out, err := exec.Command("ip", "-o", "link", "show", "master", h.Bridge).Output(); err == nil {
		for _, l := range strings.Split(string(out), "\n") {
			if f := strings.Fields(l); len(f) > 1 {
				exec.Command("ip", "link", "del", strings.SplitN(strings.TrimSuffix(f[1], ":"), "@", 2)[0]).Run()
			}
		}
	}
	exec.Command("ip", "link", "del", h.Bridge).Run()
	for _, fam := range []string{"inet", "bridge", "ip", "ip6"} {
		exec.Command("nft", "delete", "table", fam, "cubicle_"+h.Bridge).Run()
	}
	RemoveCgroups(h.Cgroup)
	runDir := filepath.Join("/run/cubicle", h.Bridge)
	UnmountUnder(runDir)
	UnmountUnder(h.DataDir)
	os.RemoveAll(runDir)
	os.RemoveAll(h.DataDir)

	if exec.Command("ip", "link", "show", h.Bridge).Run() == nil {
		left = append(left, h.Name+": bridge "+h.Bridge)
	}
	if out, err := exec.Command("nft", "list", "tables").Output(); err == nil {
		for _, l := range strings.Split(string(out), "\n") {
			if f := strings.Fields(l); len(f) == 3 && strings.HasSuffix(f[2], "_"+h.Bridge) {
				left = append(left, h.Name+": nft "+strings.TrimSpace(l))
			}
		}
	}
	for _, hier := range CgroupHierarchies() {
		for _, d := range []string{filepath.Join(hier, h.Cgroup), filepath.Join(hier, h.Cgroup+"-lxcfs")} {
			if _, err := os.Stat(d); err == nil {
				left = append(left, h.Name+": cgroup "+d)
			}
		}
	}
	for _, d := range []string{runDir, h.DataDir} {
		if _, err := os.Stat(d); err == nil {
			left = append(left, h.Name+": dir "+d)
		}
	}
	return left
}

// RemoveCgroups removes cgroup parent's (empty) children, the parent and
// parent-lxcfs in every hierarchy.
func RemoveCgroups(parent string) {
	for _, hier := range CgroupHierarchies() {
		ents, _ := os.ReadDir(filepath.Join(hier, parent))
		for _, e := range ents {
			if e.IsDir() {
				syscall.Rmdir(filepath.Join(hier, parent, e.Name()))
			}
		}
		syscall.Rmdir(filepath.Join(hier, parent))
		syscall.Rmdir(filepath.Join(hier, parent+"-lxcfs")) // empty once lxcfs is gone
	}
}

// SnapshotLayerMount reports whether mp is the layer of a snapshot kept in
// data's snapshot dir whose layer is a clone of a disk: a mount that stays
// with the snapshot, as its files would (<id>/rootfs, marked by
// <id>/layer-disk).
func SnapshotLayerMount(data, mp string) bool {
	snap := filepath.Dir(mp)
	if filepath.Base(mp) != "rootfs" || filepath.Dir(snap) != filepath.Join(data, "snapshots") {
		return false
	}
	_, err := os.Stat(filepath.Join(snap, "layer-disk"))
	return err == nil
}
