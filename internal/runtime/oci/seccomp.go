package oci

import (
	"fmt"
	"os"
	goruntime "runtime"
	"slices"
	"strings"
	"sync"

	mseccomp "github.com/moby/profiles/seccomp"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
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
//   - the x32 ABI is left out of the profile's architectures when the
//     kernel does not run x32 syscalls (most do not: CONFIG_X86_X32_ABI
//     unset, or disabled at boot). Such a syscall then kills the thread
//     instead of failing with ENOSYS, and nothing else changes; each
//     architecture the profile lists costs runc ~8 ms of libseccomp
//     compilation per sandbox start (docs/performance.md).
//
// runsc gets the same profile rewritten by forGVisor (RunscSeccomp).
var (
	seccompOnce    sync.Once
	seccompProfile *specs.LinuxSeccomp
	seccompErr     error

	runscSeccompOnce    sync.Once
	runscSeccompProfile *specs.LinuxSeccomp
	runscSeccompErr     error
)

// DefaultSeccomp returns the sandbox seccomp profile for a process with
// the default capability set.
func DefaultSeccomp() (*specs.LinuxSeccomp, error) {
	seccompOnce.Do(func() {
		spec := &specs.Spec{Process: &specs.Process{Capabilities: &specs.LinuxCapabilities{
			Bounding: defaultCaps, Effective: defaultCaps, Permitted: defaultCaps,
		}}}
		seccompProfile, seccompErr = mseccomp.GetDefaultProfile(spec)
		if seccompErr == nil && !x32Runs() {
			seccompProfile.Architectures = slices.DeleteFunc(slices.Clone(seccompProfile.Architectures),
				func(a specs.Arch) bool { return a == specs.ArchX32 })
		}
	})
	return seccompProfile, seccompErr
}

// x32Runs reports whether this kernel runs x32-ABI syscalls. It asks with
// one (getpid with the x32 bit), but only from a process under no seccomp
// filter of its own, which could kill it for that; under one the answer
// is "yes", which keeps the x32 architecture in the profile.
func x32Runs() bool {
	if goruntime.GOARCH != "amd64" {
		return false
	}
	if b, err := os.ReadFile("/proc/self/status"); err != nil || !strings.Contains(string(b), "\nSeccomp:\t0\n") {
		return true
	}
	const x32Bit = 0x40000000
	_, _, errno := unix.RawSyscall(x32Bit|unix.SYS_GETPID, 0, 0, 0)
	return errno != unix.ENOSYS
}

// RunscSeccomp returns DefaultSeccomp as runsc must be given it for gVisor
// to enforce the same policy (forGVisor).
func RunscSeccomp() (*specs.LinuxSeccomp, error) {
	runscSeccompOnce.Do(func() {
		p, err := DefaultSeccomp()
		if err != nil {
			runscSeccompErr = err
			return
		}
		runscSeccompProfile, runscSeccompErr = forGVisor(p)
	})
	return runscSeccompProfile, runscSeccompErr
}

const (
	ptraceSetOptions    = unix.PTRACE_SETOPTIONS // 0x4200
	ptraceSeize         = unix.PTRACE_SEIZE      // 0x4206
	ptraceOTraceSeccomp = unix.PTRACE_O_TRACESECCOMP
)

// forGVisor rewrites a profile so that runsc --oci-seccomp enforces what
// runc would. runsc's converter drops errnoRet (google/gvisor#14688, fixed
// upstream by #14721 but not in every release): every SCMP_ACT_ERRNO answers
// EPERM. For clone3 that breaks threads, since glibc >= 2.34 falls back to
// clone(2) only on ENOSYS. So:
//
//   - a rule answering ENOSYS becomes SCMP_ACT_TRACE: with no tracer, gVisor
//     (like Linux) fails the call with ENOSYS without running it, whatever
//     the converter does with errnoRet;
//   - a tracer that asks for seccomp events (PTRACE_O_TRACESECCOMP) would
//     let a traced call run, since gVisor, unlike Linux >= 4.8, does not
//     re-run the filter after the event; so ptrace stays allowed except
//     for setting that one option (PTRACE_SETOPTIONS, PTRACE_SEIZE), which
//     answers EPERM. strace and gdb do not use it (strace only with
//     --seccomp-bpf);
//   - any other errnoRet than EPERM, or a TRACE rule of the profile's own,
//     is an error rather than a silent change of policy.
//
// The result keeps every other rule, so gVisor's Sentry sees the same
// allow-list as the host kernel does under runc.
func forGVisor(p *specs.LinuxSeccomp) (*specs.LinuxSeccomp, error) {
	eperm, enosys := uint(unix.EPERM), uint(unix.ENOSYS)
	if p.DefaultErrnoRet != nil && *p.DefaultErrnoRet != eperm {
		return nil, fmt.Errorf("seccomp for runsc: defaultErrnoRet %d: runsc answers EPERM", *p.DefaultErrnoRet)
	}
	out := *p
	out.Syscalls = make([]specs.LinuxSyscall, 0, len(p.Syscalls)+8)
	sawPtrace := false
	for _, s := range p.Syscalls {
		switch {
		case s.Action == specs.ActTrace:
			return nil, fmt.Errorf("seccomp for runsc: %v: SCMP_ACT_TRACE cannot be kept faithfully", s.Names)
		case s.Action == specs.ActErrno && s.ErrnoRet != nil && *s.ErrnoRet == enosys:
			s.Action, s.ErrnoRet = specs.ActTrace, nil
		case s.Action == specs.ActErrno && s.ErrnoRet != nil && *s.ErrnoRet != eperm:
			return nil, fmt.Errorf("seccomp for runsc: %v: errnoRet %d: runsc answers EPERM", s.Names, *s.ErrnoRet)
		}
		if slices.Contains(s.Names, "ptrace") {
			if s.Action != specs.ActAllow || len(s.Args) != 0 || sawPtrace {
				return nil, fmt.Errorf("seccomp for runsc: unexpected ptrace rule %+v", s)
			}
			sawPtrace = true
			s.Names = slices.DeleteFunc(slices.Clone(s.Names), func(n string) bool { return n == "ptrace" })
			if len(s.Names) > 0 {
				out.Syscalls = append(out.Syscalls, s)
			}
			out.Syscalls = append(out.Syscalls, ptraceWithoutSeccompEvents()...)
			continue
		}
		out.Syscalls = append(out.Syscalls, s)
	}
	return &out, nil
}

// ptraceWithoutSeccompEvents allows every ptrace request except setting
// PTRACE_O_TRACESECCOMP. Each rule is a conjunction over distinct
// arguments: several conditions on one argument would be ORed by runc's
// and runsc's legacy semantics.
func ptraceWithoutSeccompEvents() []specs.LinuxSyscall {
	rule := func(args ...specs.LinuxSeccompArg) specs.LinuxSyscall {
		return specs.LinuxSyscall{Names: []string{"ptrace"}, Action: specs.ActAllow, Args: args}
	}
	req := func(op specs.LinuxSeccompOperator, v uint64) specs.LinuxSeccompArg {
		return specs.LinuxSeccompArg{Index: 0, Value: v, Op: op}
	}
	// data & PTRACE_O_TRACESECCOMP == 0
	noSeccompEvents := specs.LinuxSeccompArg{Index: 3, Value: ptraceOTraceSeccomp, ValueTwo: 0, Op: specs.OpMaskedEqual}
	rules := []specs.LinuxSyscall{
		rule(req(specs.OpLessThan, ptraceSetOptions)),
		rule(req(specs.OpGreaterThan, ptraceSeize)),
		rule(req(specs.OpEqualTo, ptraceSetOptions), noSeccompEvents),
		rule(req(specs.OpEqualTo, ptraceSeize), noSeccompEvents),
	}
	for r := uint64(ptraceSetOptions + 1); r < ptraceSeize; r++ {
		rules = append(rules, rule(req(specs.OpEqualTo, r)))
	}
	return rules
}
