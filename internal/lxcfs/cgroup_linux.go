package lxcfs

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// cgroupRoot is where the cgroup hierarchies are mounted.
const cgroupRoot = "/sys/fs/cgroup"

// cpuPeriod is the CFS period the quota is a share of (100 ms, the
// kernel's default).
const cpuPeriod = 100000

// ErrCgroup: lxcfs's CPU-limited cgroup could not be made or used.
var ErrCgroup = errors.New("lxcfs: cpu cgroup")

// cpuCgroup is lxcfs's own cgroup with a CFS quota. Every sandbox's /proc
// read is served by lxcfs, in the host's CPU accounting, not the
// sandbox's: without a quota, one sandbox reading /proc in a loop makes
// lxcfs burn CPUs no sandbox is charged for. It is cpu.max on cgroup v2
// and cpu.cfs_quota_us under the v1 cpu controller (hybrid hosts too,
// whose unified hierarchy usually has no cpu controller).
type cpuCgroup struct {
	dir string
}

// newCPUCgroup makes (or reuses) <cpu hierarchy>/<name> with a quota of
// cpus CPUs.
func newCPUCgroup(name string, cpus float64) (*cpuCgroup, error) {
	if err := checkCPUBound(name, cpus); err != nil {
		return nil, err
	}
	quota := int64(cpus * cpuPeriod)
	var st unix.Statfs_t
	if err := unix.Statfs(cgroupRoot, &st); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrCgroup, err)
	}
	if st.Type == unix.CGROUP2_SUPER_MAGIC {
		b, err := os.ReadFile(filepath.Join(cgroupRoot, "cgroup.subtree_control"))
		if err != nil || !strings.Contains(" "+strings.TrimSpace(string(b))+" ", " cpu ") {
			return nil, fmt.Errorf("%w: the cpu controller is not enabled in %s/cgroup.subtree_control (%q, %v)", ErrCgroup, cgroupRoot, b, err)
		}
		c := &cpuCgroup{dir: filepath.Join(cgroupRoot, name)}
		if err := c.mkdir(); err != nil {
			return nil, err
		}
		return c, c.write("cpu.max", fmt.Sprintf("%d %d", quota, cpuPeriod))
	}
	v1 := filepath.Join(cgroupRoot, "cpu")
	if _, err := os.Stat(filepath.Join(v1, "cpu.cfs_quota_us")); err != nil {
		return nil, fmt.Errorf("%w: no cgroup v2 and no v1 cpu controller with CFS quotas at %s: %v", ErrCgroup, v1, err)
	}
	c := &cpuCgroup{dir: filepath.Join(v1, name)}
	if err := c.mkdir(); err != nil {
		return nil, err
	}
	if err := c.write("cpu.cfs_period_us", strconv.Itoa(cpuPeriod)); err != nil {
		return nil, err
	}
	return c, c.write("cpu.cfs_quota_us", strconv.FormatInt(quota, 10))
}

// checkCPUBound validates a cgroup name and a CPU quota.
func checkCPUBound(name string, cpus float64) error {
	if name == "" || strings.Contains(name, "/") || name == "." || name == ".." {
		return fmt.Errorf("%w: bad cgroup name %q", ErrCgroup, name)
	}
	if int64(cpus*cpuPeriod) < 1000 { // the kernel's minimum quota is 1 ms
		return fmt.Errorf("%w: %g CPUs is below the 0.01 minimum", ErrCgroup, cpus)
	}
	return nil
}

func (c *cpuCgroup) mkdir() error {
	if err := os.Mkdir(c.dir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("%w: %v", ErrCgroup, err)
	}
	return nil
}

func (c *cpuCgroup) write(file, v string) error {
	if err := os.WriteFile(filepath.Join(c.dir, file), []byte(v), 0); err != nil {
		return fmt.Errorf("%w: %s: %v", ErrCgroup, file, err)
	}
	return nil
}

// add moves pid, all its threads with it, into the cgroup.
func (c *cpuCgroup) add(pid int) error { return c.write("cgroup.procs", strconv.Itoa(pid)) }

// remove deletes the cgroup once nothing is left in it; rmdir answers
// EBUSY for a moment while a killed lxcfs exits.
func (c *cpuCgroup) remove() error {
	var err error
	for i := 0; i < 50; i++ {
		if err = unix.Rmdir(c.dir); err == nil || errors.Is(err, unix.ENOENT) {
			return nil
		}
		if !errors.Is(err, unix.EBUSY) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("%w: remove %s: %v", ErrCgroup, c.dir, err)
}
