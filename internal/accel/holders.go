package accel

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"

	"golang.org/x/sys/unix"
)

// Holders returns the sorted PIDs that have an fd open on one of nodes,
// matched by character-device major/minor rather than path: a sandbox sees
// the node under another path (bind mount, its own /dev) and a VMM may have
// opened it through a different name. One pass over <procRoot>/*/fd;
// processes that vanish or deny access mid-scan are skipped, since a racing
// exit cannot hold a device anyway. The caller's own process is included.
func Holders(procRoot string, nodes []DeviceNode) ([]int, error) {
	if len(nodes) == 0 {
		return nil, nil
	}
	type mm struct{ major, minor uint32 }
	want := make(map[mm]bool, len(nodes))
	for _, n := range nodes {
		want[mm{uint32(n.Major), uint32(n.Minor)}] = true
	}
	entries, err := os.ReadDir(procRoot)
	if err != nil {
		return nil, err
	}
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid <= 0 {
			continue
		}
		fdDir := filepath.Join(procRoot, e.Name(), "fd")
		fds, err := os.ReadDir(fdDir)
		if err != nil {
			continue // vanished or EACCES
		}
		for _, fd := range fds {
			var st unix.Stat_t
			// stat (not lstat) follows the magic link to the open file.
			if unix.Stat(filepath.Join(fdDir, fd.Name()), &st) != nil {
				continue
			}
			if st.Mode&unix.S_IFMT != unix.S_IFCHR {
				continue
			}
			if want[mm{unix.Major(st.Rdev), unix.Minor(st.Rdev)}] {
				pids = append(pids, pid)
				break
			}
		}
	}
	sort.Ints(pids)
	return pids, nil
}

// nodeAt stats a host character device and describes it as a DeviceNode
// with the given in-sandbox path.
func nodeAt(hostPath, sandboxPath string) (DeviceNode, error) {
	var st unix.Stat_t
	if err := unix.Stat(hostPath, &st); err != nil {
		return DeviceNode{}, &os.PathError{Op: "stat", Path: hostPath, Err: err}
	}
	if st.Mode&unix.S_IFMT != unix.S_IFCHR {
		return DeviceNode{}, &os.PathError{Op: "stat", Path: hostPath, Err: errNotCharDev}
	}
	return DeviceNode{
		Path:     sandboxPath,
		HostPath: hostPath,
		Major:    int64(unix.Major(st.Rdev)),
		Minor:    int64(unix.Minor(st.Rdev)),
		Mode:     st.Mode & 0o7777,
	}, nil
}

type notCharDevError struct{}

func (notCharDevError) Error() string { return "not a character device" }

var errNotCharDev error = notCharDevError{}

// observePCI reports whether the PCI function at sysfs dir exists and which
// driver it is bound to; both backends start their Observe here.
func observePCI(dir string) (Observation, error) {
	if _, err := os.Stat(dir); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return Observation{}, nil
		}
		return Observation{}, err
	}
	return Observation{Present: true, Driver: linkBase(filepath.Join(dir, "driver"))}, nil
}
