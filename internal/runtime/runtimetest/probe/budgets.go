package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// budgetSig is queued to the probe's own (locked, blocking) thread: a
// signal neither the Go runtime nor libc uses.
const budgetSig = 40

// budgets takes (exhaust) or tries (one) each per-user kernel budget a
// user namespace's owner is charged for: inotify instances, inotify
// watches, POSIX message-queue bytes and queued signals. exhaust writes
// key=value lines to OUT (name-count and name-err, the errno that stopped
// it) and then holds everything until killed; one prints name=ok or the
// errno to stdout.
func budgets(mode, dir string, rest []string) {
	switch {
	case mode == "exhaust" && len(rest) == 1:
		var b strings.Builder
		exhaust(dir, &b)
		tmp := rest[0] + ".tmp"
		if err := os.WriteFile(tmp, []byte(b.String()), 0o644); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		if err := os.Rename(tmp, rest[0]); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		for { // hold what was taken (a bare select{} is a deadlock to the runtime)
			time.Sleep(time.Hour)
		}
	case mode == "one" && len(rest) == 0:
		one(dir)
	default:
		os.Exit(2)
	}
}

func exhaust(dir string, out *strings.Builder) {
	report := func(name string, n int, e error) {
		fmt.Fprintf(out, "%s-count=%d\n%s-err=%s\n", name, n, name, errOrOK(e))
	}

	var fds []int
	var err error
	for len(fds) < 1<<16 {
		var fd int
		if fd, err = unix.InotifyInit1(unix.IN_CLOEXEC); err != nil {
			break
		}
		fds = append(fds, fd)
	}
	report("inotify-instances", len(fds), err)

	// A watch is per (instance, inode): 4096 files across the instances
	// reach any usual max_user_watches without making 200k files.
	const files = 4096
	paths := make([]string, files)
	for i := range paths {
		paths[i] = filepath.Join(dir, fmt.Sprintf("w%d", i))
		if err := os.WriteFile(paths[i], nil, 0o644); err != nil {
			report("inotify-watches", 0, err)
			return
		}
	}
	watches := 0
	err = nil
watch:
	for _, fd := range fds {
		for _, p := range paths {
			if _, err = unix.InotifyAddWatch(fd, p, unix.IN_MODIFY); err != nil {
				break watch
			}
			watches++
		}
	}
	report("inotify-watches", watches, err)

	queues := 0
	for err = nil; queues < 4096; queues++ {
		if err = mqOpen(fmt.Sprintf("cubicle-probe-%d", queues)); err != nil {
			break
		}
	}
	report("mqueue", queues, err)

	if err := blockBudgetSig(); err != nil {
		report("sigqueue", 0, err)
		return
	}
	queued := 0
	for err = nil; queued < 1<<24; queued++ {
		if err = queueSelf(); err != nil {
			break
		}
	}
	report("sigqueue", queued, err)
}

func one(dir string) {
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC)
	fmt.Printf("inotify-instances=%s\n", errOrOK(err))
	if err == nil {
		_, err = unix.InotifyAddWatch(fd, dir, unix.IN_MODIFY)
		fmt.Printf("inotify-watches=%s\n", errOrOK(err))
	}
	name := fmt.Sprintf("cubicle-probe-one-%d", os.Getpid())
	err = mqOpen(name)
	fmt.Printf("mqueue=%s\n", errOrOK(err))
	if err == nil {
		mqUnlink(name)
	}
	if err = blockBudgetSig(); err == nil {
		err = queueSelf()
	}
	fmt.Printf("sigqueue=%s\n", errOrOK(err))
}

// mqOpen creates a queue with the namespace's default size (10 messages
// of 8 KiB unless changed), charged to RLIMIT_MSGQUEUE. The descriptor
// is left open; the queue lives as long as the IPC namespace.
func mqOpen(name string) error {
	p, err := unix.BytePtrFromString(name)
	if err != nil {
		return err
	}
	_, _, e := unix.Syscall6(unix.SYS_MQ_OPEN, uintptr(unsafe.Pointer(p)), unix.O_RDWR|unix.O_CREAT|unix.O_EXCL|unix.O_CLOEXEC, 0o600, 0, 0, 0)
	if e != 0 {
		return e
	}
	return nil
}

func mqUnlink(name string) {
	p, err := unix.BytePtrFromString(name)
	if err == nil {
		unix.Syscall(unix.SYS_MQ_UNLINK, uintptr(unsafe.Pointer(p)), 0, 0)
	}
}

// blockBudgetSig blocks budgetSig on this (locked) thread, so what is
// queued to it stays pending.
func blockBudgetSig() error {
	var set unix.Sigset_t
	set.Val[0] = 1 << (budgetSig - 1)
	return unix.PthreadSigmask(unix.SIG_BLOCK, &set, nil)
}

// queueSelf queues one budgetSig with a payload (SI_QUEUE) to this thread:
// each one is charged to RLIMIT_SIGPENDING until delivered.
func queueSelf() error {
	var info [128]byte
	*(*int32)(unsafe.Pointer(&info[0])) = budgetSig
	*(*int32)(unsafe.Pointer(&info[8])) = -1 // SI_QUEUE
	pid := unix.Getpid()
	_, _, e := unix.RawSyscall6(unix.SYS_RT_TGSIGQUEUEINFO, uintptr(pid), uintptr(unix.Gettid()), budgetSig, uintptr(unsafe.Pointer(&info[0])), 0, 0)
	if e != 0 {
		return e
	}
	return nil
}
