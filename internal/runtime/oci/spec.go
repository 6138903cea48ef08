package oci

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/cubicle-dev/cubicle/internal/runtime"
)

// defaultCaps is Docker's default capability set less CAP_NET_RAW; nothing
// else is granted. Without CAP_NET_RAW root in a sandbox cannot open raw or
// packet sockets (forged frames, sniffing); ping still works through
// unprivileged ICMP sockets (the network manager opens ping_group_range in
// every sandbox netns). As a CapEff mask: 0xa80405fb (docs/security.md).
var defaultCaps = []string{
	"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_MKNOD",
	"CAP_SETGID", "CAP_SETUID", "CAP_SETFCAP", "CAP_SETPCAP",
	"CAP_NET_BIND_SERVICE", "CAP_SYS_CHROOT", "CAP_KILL", "CAP_AUDIT_WRITE",
}

// Docker's default masked / read-only paths.
var (
	maskedPaths = []string{
		"/proc/asound", "/proc/acpi", "/proc/kcore", "/proc/keys",
		"/proc/latency_stats", "/proc/timer_list", "/proc/timer_stats",
		"/proc/sched_debug", "/proc/scsi", "/sys/firmware",
		"/sys/devices/virtual/powercap",
	}
	readonlyPaths = []string{
		"/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger",
	}
)

// annotationNetns records the network namespace runc is started in when
// the spec cannot name it (see buildSpec).
const annotationNetns = "dev.cubicle.netns"

// sysBindOptions bind the host's /sys into a user-namespaced sandbox.
// "ro" alone remounts only the top of the rbind, and every host submount
// (securityfs, bpffs, debugfs, cgroupfs...) would keep its host flags; the
// r* options (mount_setattr with AT_RECURSIVE, runc >= 1.1) make each of
// them read-only, nosuid, noexec and nodev too.
var sysBindOptions = []string{"rbind", "nosuid", "noexec", "nodev", "ro", "rro", "rnosuid", "rnoexec", "rnodev"}

// ociVersion is the oldest spec version that has every field we use
// (errnoRet arrived in 1.0.2); crun 1.8 rejects versions newer than it knows.
const ociVersion = "1.0.2"

const (
	cpuPeriod   = 100000
	nofileSoft  = 65536
	nofileHard  = 1048576
	defaultPath = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
)

func ptr[T any](v T) *T { return &v }

// buildSpec generates the OCI config for a sandbox whose rootfs is already
// mounted at rootfs.
// nsBase, when not 0, puts the sandbox in a user namespace mapping 0..65535
// to nsBase.. (userns.go).
func (d *Driver) buildSpec(s runtime.Spec, rootfs string, nsBase uint32) (*specs.Spec, error) {
	profile := DefaultSeccomp
	if d.cfg.Runtime == "runsc" {
		profile = RunscSeccomp
	}
	seccomp, err := profile()
	if err != nil {
		return nil, fmt.Errorf("seccomp profile: %w", err)
	}
	env := s.Env
	if !hasEnv(env, "PATH") {
		env = append([]string{defaultPath}, env...)
	}
	hostname := s.Hostname
	if hostname == "" {
		hostname = s.ID
	}
	caps := append([]string(nil), defaultCaps...)

	nsList := []specs.LinuxNamespace{
		{Type: specs.PIDNamespace},
		{Type: specs.IPCNamespace},
		{Type: specs.UTSNamespace},
		{Type: specs.MountNamespace},
		{Type: specs.NetworkNamespace, Path: s.NetNSPath},
	}
	// gVisor virtualises cgroups itself and rejects a cgroup namespace entry.
	if d.cfg.Runtime != "runsc" && d.cgroupNS {
		nsList = append(nsList, specs.LinuxNamespace{Type: specs.CgroupNamespace})
	}

	mounts := []specs.Mount{
		{Destination: "/proc", Type: "proc", Source: "proc", Options: []string{"nosuid", "noexec", "nodev"}},
		{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
		{Destination: "/dev/pts", Type: "devpts", Source: "devpts", Options: []string{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"}},
		{Destination: "/dev/shm", Type: "tmpfs", Source: "shm", Options: []string{"nosuid", "noexec", "nodev", "mode=1777", "size=65536k"}},
		{Destination: "/dev/mqueue", Type: "mqueue", Source: "mqueue", Options: []string{"nosuid", "noexec", "nodev"}},
		{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: []string{"nosuid", "noexec", "nodev", "ro"}},
	}
	var uidMap []specs.LinuxIDMapping
	var annotations map[string]string
	if nsBase != 0 && d.cfg.Runtime == "runsc" {
		// runsc makes it from the mappings, for the sentry and the gofer;
		// /sys stays gVisor's own.
		nsList = append(nsList, specs.LinuxNamespace{Type: specs.UserNamespace})
		uidMap = []specs.LinuxIDMapping{{ContainerID: 0, HostID: nsBase, Size: usernsSize}}
	} else if nsBase != 0 {
		// Joined, not made by runc: see bindOwnedUserns.
		nsList = append(nsList, specs.LinuxNamespace{Type: specs.UserNamespace, Path: d.usernsPath(s.ID)})
		uidMap = []specs.LinuxIDMapping{{ContainerID: 0, HostID: nsBase, Size: usernsSize}}
		if s.NetNSPath != "" {
			// runc joins the user namespace first, and from inside one
			// root does not own, the host's network namespace cannot be
			// joined (EPERM). So runc is started in it (runContainer)
			// and the container inherits it.
			nsList = slices.DeleteFunc(nsList, func(n specs.LinuxNamespace) bool { return n.Type == specs.NetworkNamespace })
			annotations = map[string]string{annotationNetns: s.NetNSPath}
		}
		// sysfs can only be mounted by the user namespace that owns the
		// network namespace, and the sandbox's netns is made by the host
		// beforehand: bind the host's read-only instead (as rootless
		// containers do), with the cgroup tree, which would show other
		// sandboxes, covered.
		for i := range mounts {
			if mounts[i].Destination == "/sys" {
				mounts[i] = specs.Mount{Destination: "/sys", Type: "bind", Source: "/sys", Options: sysBindOptions}
			}
		}
		mounts = append(mounts, specs.Mount{Destination: "/sys/fs/cgroup", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "noexec", "nodev", "ro", "size=4k", "mode=755"}})
	}
	for _, m := range s.Mounts {
		opts := []string{"rbind", "nosuid", "nodev"}
		if m.ReadOnly {
			opts = append(opts, "ro")
		} else {
			opts = append(opts, "rw")
		}
		mounts = append(mounts, specs.Mount{
			Destination: filepath.Clean(m.Destination), Type: "bind", Source: m.Source, Options: opts,
		})
	}

	if d.cfg.Runtime == "runsc" && !hasMountAt(s.Mounts, "/tmp") {
		// gVisor mounts a private tmpfs over an empty /tmp; bind the rootfs'
		// own /tmp onto itself so /tmp stays in the overlay upper dir. Not
		// nosuid: it is part of the rootfs, as under runc.
		mounts = append(mounts, specs.Mount{
			Destination: "/tmp", Type: "bind", Source: filepath.Join(rootfs, "tmp"),
			Options: []string{"rbind", "rw", "nodev"},
		})
	}

	var res specs.LinuxResources
	res.Devices = append([]specs.LinuxDeviceCgroup{{Allow: false, Access: "rwm"}}, allowedDevices...)
	var devices []specs.LinuxDevice
	for i, dev := range s.Devices {
		mode := os.FileMode(dev.FileMode & 0o7777)
		if mode == 0 {
			mode = 0o666
		}
		typ := string(rune(dev.Type))
		if nsBase != 0 {
			// Made on the host by idmappedRootfs; a bind without nodev.
			mounts = append(mounts, specs.Mount{Destination: filepath.Clean(dev.Path), Type: "bind", Source: d.devNode(s.ID, i), Options: []string{"bind", "nosuid"}})
		} else {
			devices = append(devices, specs.LinuxDevice{
				Path: filepath.Clean(dev.Path), Type: typ, Major: dev.Major, Minor: dev.Minor,
				FileMode: ptr(mode), UID: ptr(dev.UID), GID: ptr(dev.GID),
			})
		}
		res.Devices = append(res.Devices, specs.LinuxDeviceCgroup{
			Allow: true, Type: typ, Major: ptr(dev.Major), Minor: ptr(dev.Minor), Access: "rwm",
		})
	}
	if s.Resources.CPUCount > 0 {
		res.CPU = &specs.LinuxCPU{
			Period: ptr(uint64(cpuPeriod)),
			Quota:  ptr(int64(s.Resources.CPUCount) * cpuPeriod),
		}
	}
	if s.Resources.MemoryMB > 0 {
		b := int64(s.Resources.MemoryMB) << 20
		// swap == limit means "no swap on top of memory" (memsw is mem+swap).
		res.Memory = &specs.LinuxMemory{Limit: ptr(b), Swap: ptr(b)}
	}
	if s.Resources.PIDs > 0 {
		limit := s.Resources.PIDs
		if d.cfg.Runtime == "runsc" {
			// The host cgroup also holds the sentry's and gofer's own threads.
			limit += RunscPIDsOverhead
		}
		res.Pids = &specs.LinuxPids{Limit: ptr(limit)}
	}

	return &specs.Spec{
		Version: ociVersion,
		Root:    &specs.Root{Path: rootfs},
		Process: &specs.Process{
			Terminal: false,
			User:     specs.User{UID: 0, GID: 0},
			Args:     s.Args,
			Env:      env,
			Cwd:      "/",
			Capabilities: &specs.LinuxCapabilities{
				Bounding: caps, Effective: caps, Permitted: caps,
			},
			Rlimits: specRlimits(nsBase != 0 && d.cfg.Runtime != "runsc"), // the sentry applies its own
			// setuid binaries (sudo, su) need this off; runsc also needs
			// --allow-suid (globalArgs).
			NoNewPrivileges: false,
		},
		Hostname:    hostname,
		Mounts:      mounts,
		Annotations: annotations,
		Linux: &specs.Linux{
			UIDMappings:   uidMap,
			GIDMappings:   uidMap,
			CgroupsPath:   "/" + d.cfg.CgroupParent + "/" + s.ID,
			Devices:       devices,
			Namespaces:    nsList,
			Resources:     &res,
			Seccomp:       seccomp,
			MaskedPaths:   maskedPaths,
			ReadonlyPaths: readonlyPaths,
		},
	}, nil
}

// validateDevices checks Spec.Devices: absolute paths under /dev (not /dev
// itself, no duplicates) and type 'c' or 'b'.
func validateDevices(devs []runtime.Device) error {
	seen := map[string]bool{}
	for _, dev := range devs {
		p := filepath.Clean(dev.Path)
		if !filepath.IsAbs(dev.Path) || !strings.HasPrefix(p, "/dev/") {
			return fmt.Errorf("%w: device path %q must be absolute under /dev", ErrInvalidSpec, dev.Path)
		}
		if dev.Type != 'c' && dev.Type != 'b' {
			return fmt.Errorf("%w: device %s: type %q, want 'c' or 'b'", ErrInvalidSpec, dev.Path, dev.Type)
		}
		if dev.Major < 0 || dev.Minor < 0 {
			return fmt.Errorf("%w: device %s: negative major/minor", ErrInvalidSpec, dev.Path)
		}
		if seen[p] {
			return fmt.Errorf("%w: device %s listed twice", ErrInvalidSpec, p)
		}
		seen[p] = true
	}
	return nil
}

// allowedDevices is the usual container device allow-list (null, zero, full,
// tty, random, urandom, ptmx, pts).
var allowedDevices = []specs.LinuxDeviceCgroup{
	{Allow: true, Type: "c", Major: ptr(int64(1)), Minor: ptr(int64(3)), Access: "rwm"},
	{Allow: true, Type: "c", Major: ptr(int64(1)), Minor: ptr(int64(5)), Access: "rwm"},
	{Allow: true, Type: "c", Major: ptr(int64(1)), Minor: ptr(int64(7)), Access: "rwm"},
	{Allow: true, Type: "c", Major: ptr(int64(1)), Minor: ptr(int64(8)), Access: "rwm"},
	{Allow: true, Type: "c", Major: ptr(int64(1)), Minor: ptr(int64(9)), Access: "rwm"},
	{Allow: true, Type: "c", Major: ptr(int64(5)), Minor: ptr(int64(0)), Access: "rwm"},
	{Allow: true, Type: "c", Major: ptr(int64(5)), Minor: ptr(int64(2)), Access: "rwm"},
	{Allow: true, Type: "c", Major: ptr(int64(136)), Access: "rwm"},
}

// RunscPIDsOverhead is added to the host pids limit of runsc sandboxes: the
// sentry and gofer are Go programs whose threads count against pids.max.
const RunscPIDsOverhead = 256

func hasMountAt(ms []runtime.Mount, dst string) bool {
	for _, m := range ms {
		if filepath.Clean(m.Destination) == dst {
			return true
		}
	}
	return false
}

func hasEnv(env []string, key string) bool {
	for _, e := range env {
		if len(e) > len(key) && e[:len(key)] == key && e[len(key)] == '=' {
			return true
		}
	}
	return false
}

// specRlimits are the process rlimits runc applies. A user-namespaced
// sandbox gets none: runc sets them with prlimit(2) on its init once it is
// in the namespace, which needs CAP_SYS_RESOURCE over a namespace root no
// longer owns (bindOwnedUserns), so runContainer starts runc with them
// instead and the container inherits them.
func specRlimits(userns bool) []specs.POSIXRlimit {
	if userns {
		return nil
	}
	return []specs.POSIXRlimit{nofileRlimit(false)}
}

// nofileRlimit is 65536/1048576, capped at our own hard limit: without
// CAP_SYS_RESOURCE (some hosts drop it, and a user namespace never has it
// towards the host) the runtime cannot raise it and container init fails
// with EPERM.
func nofileRlimit(userns bool) specs.POSIXRlimit {
	hard, soft := uint64(nofileHard), uint64(nofileSoft)
	var cur unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &cur); err == nil && cur.Max < hard && (userns || !hasCapSysResource()) {
		hard = cur.Max
	}
	soft = min(soft, hard)
	return specs.POSIXRlimit{Type: "RLIMIT_NOFILE", Hard: hard, Soft: soft}
}

func hasCapSysResource() bool {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "CapEff:"); ok {
			n, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			return err == nil && n&(1<<unix.CAP_SYS_RESOURCE) != 0
		}
	}
	return false
}
