//go:build !linux

package content

import (
	"io/fs"
	"os"
	"time"
)

// sysStat falls back to portable fields off Linux (Cubicle only serves
// volumes on Linux; this keeps the package building elsewhere).
func sysStat(fi fs.FileInfo) (uid, gid, mode uint32, atime, ctime time.Time) {
	return 0, 0, fileModeBits(fi.Mode()), fi.ModTime(), fi.ModTime()
}

const (
	readFileFlags = os.O_RDONLY
	readDirFlags  = os.O_RDONLY
)
