package lease

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
)

// ClaimFile is Claim for a store without a lease server (SQLite): an
// exclusive flock on path, created if missing, held until release. The
// kernel drops it the moment the process dies, however it dies, so a
// restart finds it free. It fails with a *HeldError (ErrHeld) when
// another open file description holds it, this process's included.
func ClaimFile(path, name string) (release func(), err error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|syscall.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("lease %s: %w", name, err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, &HeldError{Name: name}
		}
		return nil, fmt.Errorf("lease %s: %w", name, err)
	}
	return func() { f.Close() }, nil
}
