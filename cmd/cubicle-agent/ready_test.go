package main

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// The agent takes over -ready-fd only when it is a pipe, and makes it
// close-on-exec at once: no process it starts may inherit it.
func TestReadyPipe(t *testing.T) {
	if readyPipe(-1) != nil {
		t.Fatal("-ready-fd -1 gave a pipe")
	}
	f, err := os.Create(filepath.Join(t.TempDir(), "file"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if readyPipe(int(f.Fd())) != nil {
		t.Fatal("a regular file was taken as the ready pipe")
	}
	if readyPipe(1<<20) != nil {
		t.Fatal("a closed fd was taken as the ready pipe")
	}
	var p [2]int
	if err := unix.Pipe(p[:]); err != nil { // no O_CLOEXEC, as inherited
		t.Fatal(err)
	}
	defer unix.Close(p[0])
	w := readyPipe(p[1])
	if w == nil {
		t.Fatal("the pipe was not taken")
	}
	flags, err := unix.FcntlInt(uintptr(p[1]), unix.F_GETFD, 0)
	if err != nil || flags&unix.FD_CLOEXEC == 0 {
		t.Fatalf("ready fd flags %#x (%v): want close-on-exec", flags, err)
	}
	if _, err := w.Write([]byte{1}); err != nil {
		t.Fatal(err)
	}
	w.Close()
	var b [2]byte
	if n, _ := unix.Read(p[0], b[:]); n != 1 || b[0] != 1 {
		t.Fatalf("read %d bytes %v, want the one byte", n, b[:n])
	}
}
