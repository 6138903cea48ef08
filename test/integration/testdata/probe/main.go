// Command probe is uploaded into sandboxes by the isolation tests: it tries
// what hostile code would and prints what the kernel answered.
package main

import (
	"fmt"
	"net"
	"os"
	"strconv"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: probe iouring|packet|ping|dial ADDR|forkstorm N|hold N|membomb")
		os.Exit(2)
	}
	switch os.Args[1] {
	case "euid":
		fmt.Println(os.Geteuid())
	case "iouring":
		var params [120]byte
		_, _, e := unix.Syscall(unix.SYS_IO_URING_SETUP, 1, uintptr(unsafe.Pointer(&params[0])), 0)
		fmt.Println(errName(e))
	case "packet":
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW, 0x0300)
		report(fd, err)
	case "rawip":
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_RAW, unix.IPPROTO_ICMP)
		report(fd, err)
	case "ping":
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM, unix.IPPROTO_ICMP)
		report(fd, err)
	case "dial":
		c, err := net.DialTimeout("tcp", os.Args[2], 2*time.Second)
		if err != nil {
			fmt.Println("blocked:", err)
			return
		}
		c.Close()
		fmt.Println("connected")
	case "forkstorm":
		// Start sleepers until fork fails, then report how far it got.
		n, _ := strconv.Atoi(os.Args[2])
		started, failure := 0, "none"
		for i := 0; i < n; i++ {
			_, err := syscall.ForkExec("/bin/sleep", []string{"sleep", "3"}, &syscall.ProcAttr{})
			if err != nil {
				failure = errName(err.(syscall.Errno))
				break
			}
			started++
		}
		fmt.Println(started, failure)
	case "hold":
		// Fill the pids limit with sleepers, say how many and why it
		// stopped, then hold them until the process group is killed.
		n, _ := strconv.Atoi(os.Args[2])
		started, failure := 0, "none"
		for i := 0; i < n; i++ {
			_, err := syscall.ForkExec("/bin/sleep", []string{"sleep", "600"}, &syscall.ProcAttr{})
			if err != nil {
				failure = errName(err.(syscall.Errno))
				break
			}
			started++
		}
		fmt.Println(started, failure)
		for {
			unix.Pause()
		}
	case "membomb":
		// Touch memory until the OOM killer ends this process.
		var keep [][]byte
		for i := 0; i < 1<<14; i++ {
			b := make([]byte, 16<<20)
			for j := range b {
				if j%4096 == 0 {
					b[j] = 1
				}
			}
			keep = append(keep, b)
		}
		fmt.Println("survived", len(keep))
	default:
		os.Exit(2)
	}
}

func report(fd int, err error) {
	if err != nil {
		fmt.Println(errName(err.(syscall.Errno)))
		return
	}
	unix.Close(fd)
	fmt.Println("ok")
}

func errName(e syscall.Errno) string {
	switch e {
	case 0:
		return "ok"
	case unix.EPERM:
		return "EPERM"
	case unix.EACCES:
		return "EACCES"
	case unix.ENOSYS:
		return "ENOSYS"
	case unix.EAGAIN:
		return "EAGAIN"
	}
	return e.Error()
}
