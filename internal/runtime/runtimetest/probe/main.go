// Command probe runs inside sandboxes for the runtime conformance suite
// (runtimetest) and reports, one key=value per line on stdout, what the
// syscall filter does from the inside. It is built static (CGO_ENABLED=0) so
// it runs on any rootfs, busybox included.
//
//	probe syscalls
//
// prints
//
//	clone3=ENOSYS             clone3(NULL, 0); libc falls back to clone(2) only on ENOSYS
//	threads=4                 distinct threads started (clone(2) with thread flags)
//	tracer-setoptions=...     PTRACE_SETOPTIONS(PTRACE_O_TRACESECCOMP) on a child: ok or an errno
//	traced-clone3=ENOSYS      clone3(CLONE_NEWUSER) by that child; "created" if a process was made
//
//	probe budgets exhaust DIR OUT    take every per-user kernel budget, report, then hold it
//	probe budgets one DIR            try one of each (budgets.go)
package main

import (
	"bufio"
	"fmt"
	"os"
	"runtime"
	"strings"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

func init() {
	// The traced child's clone3 must come from the thread ptrace follows:
	// the one that exec'd, which runs init and main.
	runtime.LockOSThread()
}

func main() {
	if len(os.Args) >= 4 && os.Args[1] == "budgets" {
		budgets(os.Args[2], os.Args[3], os.Args[4:])
		return
	}
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: probe syscalls | probe budgets exhaust DIR OUT | probe budgets one DIR")
		os.Exit(2)
	}
	switch os.Args[1] {
	case "syscalls":
		_, _, e := unix.RawSyscall(unix.SYS_CLONE3, 0, 0, 0)
		fmt.Printf("clone3=%s\n", errName(e))
		fmt.Printf("threads=%d\n", threads(4))
		tracer()
	case "traced-clone3":
		tracedClone3()
	default:
		os.Exit(2)
	}
}

func errName(e syscall.Errno) string {
	if e == 0 {
		return "ok"
	}
	if n := unix.ErrnoName(e); n != "" {
		return n
	}
	return e.Error()
}

// threads starts n goroutines each locked to an OS thread of its own and
// returns how many distinct thread ids they saw.
func threads(n int) int {
	tids := make(chan int, n)
	release := make(chan struct{})
	for i := 0; i < n; i++ {
		go func() {
			runtime.LockOSThread() // never unlocked: this thread is not reused
			tids <- unix.Gettid()
			<-release
		}()
	}
	seen := map[int]bool{unix.Gettid(): true}
	for i := 0; i < n; i++ {
		seen[<-tids] = true
	}
	close(release)
	return len(seen) - 1
}

// tracer runs "probe traced-clone3" under ptrace and asks for seccomp
// events: with them, a tracer may let a call the filter answers with
// SECCOMP_RET_TRACE go through. The child's verdict arrives on a pipe and
// the tracer does not wait for the child's exit: runsc was seen to leave a
// traced child's exit unreported to a blocking wait4.
func tracer() {
	exe, err := os.Executable()
	if err != nil {
		fmt.Printf("tracer-setoptions=executable: %v\n", err)
		return
	}
	r, w, err := os.Pipe()
	if err != nil {
		fmt.Printf("tracer-setoptions=pipe: %v\n", err)
		return
	}
	p, err := os.StartProcess(exe, []string{exe, "traced-clone3"}, &os.ProcAttr{
		Files: []*os.File{os.Stdin, w, os.Stderr},
		Sys:   &syscall.SysProcAttr{Ptrace: true},
	})
	w.Close()
	if err != nil {
		fmt.Printf("tracer-setoptions=start: %v\n", err)
		return
	}
	verdict := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			if strings.HasPrefix(sc.Text(), "traced-clone3=") {
				verdict <- sc.Text()
				return
			}
		}
		verdict <- "traced-clone3=no answer"
	}()
	var ws unix.WaitStatus
	if _, err := unix.Wait4(p.Pid, &ws, 0, nil); err != nil || !ws.Stopped() {
		fmt.Printf("tracer-setoptions=wait: %v %v\n", err, ws)
		return
	}
	e := unix.PtraceSetOptions(p.Pid, unix.PTRACE_O_TRACESECCOMP)
	fmt.Printf("tracer-setoptions=%s\n", errOrOK(e))
	if err := unix.PtraceCont(p.Pid, 0); err != nil {
		fmt.Printf("tracer-cont=%v\n", err)
		return
	}
	// Continue every stop without a signal but for real signals (seccomp
	// events and traps proceed, as a lenient tracer would) until the
	// verdict is in. ptrace requests must come from this (locked) thread.
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case v := <-verdict:
			fmt.Println(v)
			return
		default:
		}
		pid, err := unix.Wait4(p.Pid, &ws, unix.WNOHANG, nil)
		switch {
		case err != nil:
			fmt.Printf("traced-clone3=wait: %v\n", err)
			return
		case pid == 0: // no news
			time.Sleep(5 * time.Millisecond)
		case ws.Exited() || ws.Signaled():
			fmt.Println(<-verdict) // the pipe is closed by now
			return
		case ws.Stopped():
			sig := 0
			if ws.StopSignal() != unix.SIGTRAP {
				sig = int(ws.StopSignal())
			}
			unix.PtraceCont(p.Pid, sig)
		}
	}
	fmt.Println("traced-clone3=timeout")
}

func errOrOK(err error) string {
	if e, ok := err.(syscall.Errno); ok {
		return errName(e)
	}
	if err != nil {
		return err.Error()
	}
	return "ok"
}

// cloneArgs is struct clone_args, version 0 (64 bytes).
type cloneArgs struct {
	flags, pidfd, childTID, parentTID, exitSignal, stack, stackSize, tls uint64
}

func tracedClone3() {
	a := cloneArgs{flags: unix.CLONE_NEWUSER, exitSignal: uint64(unix.SIGCHLD)}
	pid, _, e := unix.RawSyscall(unix.SYS_CLONE3, uintptr(unsafe.Pointer(&a)), unsafe.Sizeof(a), 0)
	if e == 0 && pid == 0 {
		unix.RawSyscall(unix.SYS_EXIT_GROUP, 0, 0, 0) // the new process: leave at once
	}
	if e != 0 {
		fmt.Printf("traced-clone3=%s\n", errName(e))
		return
	}
	var ws unix.WaitStatus
	unix.Wait4(int(pid), &ws, 0, nil)
	fmt.Println("traced-clone3=created")
}
