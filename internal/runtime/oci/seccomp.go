package oci

import (
	"sync"

	mseccomp "github.com/moby/profiles/seccomp"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// The seccomp profile is Docker's default, from the module Docker itself
// maintains, unchanged: an allow-list, so a syscall the list has never
// heard of (io_uring_setup, say) is refused with EPERM by default. The
// profile adapts to the capability set (rules that need CAP_SYS_ADMIN and
// friends are left out because those capabilities are not granted) and to
// the kernel, so it is computed once per process.
//
// Exceptions to "Docker's defaults", all inherited from that profile and
// kept deliberately:
//   - ptrace and process_vm_{readv,writev} are allowed (Docker does so on
//     kernels >= 4.8, where ptrace can no longer bypass seccomp);
//     CAP_SYS_PTRACE is not granted, so only a sandbox's own processes of
//     the same user can be traced, and debuggers/strace are legitimate
//     sandbox workloads.
//   - clone3 answers ENOSYS rather than EPERM (its flags live in a struct
//     seccomp cannot inspect; ENOSYS makes libc fall back to clone(2),
//     whose namespace flags the profile does filter).
var (
	seccompOnce    sync.Once
	seccompProfile *specs.LinuxSeccomp
	seccompErr     error
)

// DefaultSeccomp returns the sandbox seccomp profile for a process with
// the default capability set.
func DefaultSeccomp() (*specs.LinuxSeccomp, error) {
	seccompOnce.Do(func() {
		spec := &specs.Spec{Process: &specs.Process{Capabilities: &specs.LinuxCapabilities{
			Bounding: defaultCaps, Effective: defaultCaps, Permitted: defaultCaps,
		}}}
		seccompProfile, seccompErr = mseccomp.GetDefaultProfile(spec)
	})
	return seccompProfile, seccompErr
}
