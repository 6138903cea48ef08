//go:build unix

package contextstore

import (
	"os"
	"syscall"
	"testing"
)

func owner(t *testing.T, p string) (uid, gid int) {
	t.Helper()
	fi, err := os.Lstat(p)
	if err != nil {
		t.Fatal(err)
	}
	st := fi.Sys().(*syscall.Stat_t)
	return int(st.Uid), int(st.Gid)
}
