package oci

import (
	goruntime "runtime"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

// deniedSyscalls are refused with EPERM. The list mirrors what Docker's
// default profile refuses to a container without CAP_SYS_ADMIN and friends,
// written as a deny-list so that new, harmless syscalls keep working.
//
// ptrace and process_vm_{readv,writev} are deliberately allowed (as Docker
// does on kernels >= 4.8): the seccomp-bypass-via-ptrace hole is closed there,
// CAP_SYS_PTRACE is not granted, and debuggers/strace are legitimate
// sandbox workloads.
var deniedSyscalls = []string{
	// kernel modules / replacing the kernel
	"kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module",
	"create_module", "get_kernel_syms", "query_module",
	// kernel attack surface not needed by sandboxed workloads
	"bpf", "perf_event_open", "userfaultfd", "lookup_dcookie", "nfsservctl",
	"vm86", "vm86old", "uselib", "_sysctl", "sysfs", "ustat",
	"iopl", "ioperm", "kcmp",
	"fanotify_init", "name_to_handle_at", "open_by_handle_at",
	// keyring is not namespaced
	"keyctl", "add_key", "request_key",
	// namespaces / mounts (Docker allows them only with CAP_SYS_ADMIN)
	"mount", "umount", "umount2", "pivot_root", "setns", "unshare",
	"fsopen", "fsconfig", "fsmount", "fsopen", "fspick", "move_mount", "open_tree",
	"mount_setattr",
	// host-global state
	"swapon", "swapoff", "reboot", "acct", "quotactl", "quotactl_fd",
	"settimeofday", "stime", "clock_settime", "clock_settime64", "clock_adjtime",
	"clock_adjtime64", "adjtimex",
}

// nsCloneFlags are the clone(2) flags that create namespaces; Docker refuses
// them without CAP_SYS_ADMIN. One rule per flag because MASKED_EQ can only
// test "all bits of mask set", and separate rules are OR-ed.
var nsCloneFlags = []uint64{
	unix.CLONE_NEWNS, unix.CLONE_NEWUTS, unix.CLONE_NEWIPC, unix.CLONE_NEWUSER,
	unix.CLONE_NEWPID, unix.CLONE_NEWNET, unix.CLONE_NEWCGROUP,
}

// DefaultSeccomp returns the default seccomp profile: allow by default, EPERM
// on the dangerous syscalls above, ENOSYS on clone3 (its flags live in a
// struct seccomp cannot inspect; ENOSYS makes libc fall back to clone(2),
// which we can filter).
func DefaultSeccomp() *specs.LinuxSeccomp {
	eperm := uint(unix.EPERM)
	enosys := uint(unix.ENOSYS)
	s := &specs.LinuxSeccomp{
		DefaultAction: specs.ActAllow,
		Architectures: seccompArches(),
		Syscalls: []specs.LinuxSyscall{
			{Names: dedup(deniedSyscalls), Action: specs.ActErrno, ErrnoRet: &eperm},
			{Names: []string{"clone3"}, Action: specs.ActErrno, ErrnoRet: &enosys},
		},
	}
	for _, f := range nsCloneFlags {
		s.Syscalls = append(s.Syscalls, specs.LinuxSyscall{
			Names:    []string{"clone"},
			Action:   specs.ActErrno,
			ErrnoRet: &eperm,
			// x86/arm: flags are the first argument of clone(2).
			Args: []specs.LinuxSeccompArg{{Index: 0, Value: f, ValueTwo: f, Op: specs.OpMaskedEqual}},
		})
	}
	return s
}

func seccompArches() []specs.Arch {
	switch goruntime.GOARCH {
	case "amd64":
		return []specs.Arch{specs.ArchX86_64, specs.ArchX86, specs.ArchX32}
	case "arm64":
		return []specs.Arch{specs.ArchAARCH64, specs.ArchARM}
	default:
		return nil // native arch only
	}
}

func dedup(in []string) []string {
	seen := make(map[string]bool, len(in))
	out := make([]string, 0, len(in))
	for _, s := range in {
		if !seen[s] {
			seen[s] = true
			out = append(out, s)
		}
	}
	return out
}
