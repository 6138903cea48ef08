//go:build linux

package content

import (
	"io/fs"
	"syscall"
	"time"
)

// sysStat extracts what fs.FileInfo does not carry: owner, raw permission
// bits (with setuid/setgid/sticky) and atime/ctime.
func sysStat(fi fs.FileInfo) (uid, gid, mode uint32, atime, ctime time.Time) {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return 0, 0, fileModeBits(fi.Mode()), fi.ModTime(), fi.ModTime()
	}
	return st.Uid, st.Gid, st.Mode & 0o7777,
		time.Unix(st.Atim.Sec, st.Atim.Nsec), time.Unix(st.Ctim.Sec, st.Ctim.Nsec)
}

// readFileFlags: O_NONBLOCK so opening a FIFO the sandbox planted cannot hang
// the request, O_NOCTTY so a planted tty never becomes ours.
const readFileFlags = syscall.O_RDONLY | syscall.O_NONBLOCK | syscall.O_NOCTTY

// readDirFlags: O_DIRECTORY makes a swap of the directory for something else
// between our stat and open fail instead of opening it.
const readDirFlags = syscall.O_RDONLY | syscall.O_DIRECTORY
