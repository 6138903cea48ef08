// Package diskbudget keeps the data filesystem from being promised more
// than it holds. Sandbox disks and sized volumes are sparse images: each
// may still grow by its size minus what the host has allocated to it (its
// allowance). A new image is admitted only while
//
//	sum of allowances + the new size <= free space - reserve
//
// so when every image fills up at once, the reserve is still free for what
// is not an image: the SQLite store, template images, snapshots, logs.
package diskbudget

import (
	"errors"
	"fmt"
	"sync"
	"syscall"

	"github.com/cubicle-dev/cubicle/internal/diskimage"
)

// ErrInsufficientStorage is what a *ShortError matches (507 at the API).
var ErrInsufficientStorage = errors.New("insufficient storage")

// ShortError says why a new image was refused, in MiB.
type ShortError struct {
	What                          string // "a 1024 MiB sandbox disk"
	FreeMB, PromisedMB, ReserveMB int64
	NeedMB                        int64
}

func (e *ShortError) Error() string {
	return fmt.Sprintf("insufficient storage: the server's data filesystem cannot hold %s: %d MiB free, %d MiB already promised to sandbox disks and volumes that may still fill, %d MiB kept in reserve (serve --disk-reserve)",
		e.What, e.FreeMB, e.PromisedMB, e.ReserveMB)
}

func (e *ShortError) Unwrap() error { return ErrInsufficientStorage }

// Image is one sparse image on the data filesystem. Key names its owner
// ("sandbox/<id>", "volume/<id>"), the same key its create reserved with.
type Image struct {
	Key, Path string
	// Frozen marks a clone that is never written (a snapshot's layer):
	// it promises its allocated bytes, not its free ones. They are
	// shared with the disk it was cloned from, which may rewrite them,
	// and each block rewritten is new space that disk's allowance (its
	// size minus what it allocates) does not count.
	Frozen bool
}

// Source lists images that exist now.
type Source func() ([]Image, error)

// Config configures a Budget.
type Config struct {
	// Dir is a path on the data filesystem.
	Dir string
	// Reserve is the bytes kept free, given the filesystem's total size.
	Reserve func(totalBytes int64) int64
	Sources []Source
}

// Budget admits new images. Safe for concurrent use.
type Budget struct {
	cfg Config

	mu      sync.Mutex
	pending map[string]int64 // reserved, image maybe not made yet
}

// New returns a budget over cfg.
func New(cfg Config) *Budget {
	return &Budget{cfg: cfg, pending: map[string]int64{}}
}

// Reserve admits an image of sizeBytes for key, described by what in the
// error, or returns a *ShortError. The reservation stands in for the image
// until release is called, which the caller does once the image exists or
// its create failed; release is idempotent.
func (b *Budget) Reserve(key, what string, sizeBytes int64) (release func(), err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	free, total, err := b.statfs()
	if err != nil {
		return nil, err
	}
	promised, err := b.promisedLocked()
	if err != nil {
		return nil, err
	}
	reserve := b.cfg.Reserve(total)
	if promised+sizeBytes > free-reserve {
		return nil, &ShortError{What: what, FreeMB: free >> 20, PromisedMB: promised >> 20, ReserveMB: reserve >> 20, NeedMB: sizeBytes >> 20}
	}
	b.pending[key] += sizeBytes
	var once sync.Once
	return func() {
		once.Do(func() {
			b.mu.Lock()
			defer b.mu.Unlock()
			if b.pending[key] -= sizeBytes; b.pending[key] <= 0 {
				delete(b.pending, key)
			}
		})
	}, nil
}

// Status is the budget as it stands.
type Status struct {
	FreeBytes, TotalBytes, PromisedBytes, ReserveBytes int64
}

// Status reports free space, promises and the reserve.
func (b *Budget) Status() (Status, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	free, total, err := b.statfs()
	if err != nil {
		return Status{}, err
	}
	promised, err := b.promisedLocked()
	if err != nil {
		return Status{}, err
	}
	return Status{FreeBytes: free, TotalBytes: total, PromisedBytes: promised, ReserveBytes: b.cfg.Reserve(total)}, nil
}

// Shortfall is an image that may still grow by more than the filesystem
// has free: its owner's writes can fail (as I/O errors inside the image)
// before it reaches its size.
type Shortfall struct {
	Key            string
	AllowanceBytes int64
}

// Short lists the images whose allowance exceeds the free space, and the
// free space. Admission keeps this list empty unless something else
// filled the filesystem (snapshots, templates, an operator's files).
func (b *Budget) Short() (freeBytes int64, short []Shortfall, err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	free, _, err := b.statfs()
	if err != nil {
		return 0, nil, err
	}
	for _, src := range b.cfg.Sources {
		imgs, err := src()
		if err != nil {
			return 0, nil, fmt.Errorf("diskbudget: %w", err)
		}
		for _, img := range imgs {
			if img.Frozen {
				continue // never written: no write of its own can fail
			}
			size, alloc, err := diskimage.Usage(img.Path)
			if err != nil {
				continue
			}
			if a := size - alloc; a > free {
				short = append(short, Shortfall{Key: img.Key, AllowanceBytes: a})
			}
		}
	}
	return free, short, nil
}

// promisedLocked sums the allowances of existing images (those with a
// reservation standing count that instead) and the reservations.
func (b *Budget) promisedLocked() (int64, error) {
	var sum int64
	for _, src := range b.cfg.Sources {
		imgs, err := src()
		if err != nil {
			return 0, fmt.Errorf("diskbudget: %w", err)
		}
		for _, img := range imgs {
			if _, ok := b.pending[img.Key]; ok {
				continue
			}
			size, alloc, err := diskimage.Usage(img.Path)
			if err != nil {
				continue // removed meanwhile
			}
			if img.Frozen {
				sum += alloc
				continue
			}
			sum += max(size-alloc, 0)
		}
	}
	for _, n := range b.pending {
		sum += n
	}
	return sum, nil
}

// statfs is the space an unprivileged writer may still use, and the size.
func (b *Budget) statfs() (free, total int64, err error) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(b.cfg.Dir, &st); err != nil {
		return 0, 0, fmt.Errorf("diskbudget: statfs %s: %w", b.cfg.Dir, err)
	}
	return int64(st.Bavail) * st.Bsize, int64(st.Blocks) * st.Bsize, nil
}

// ParseReserve reads --disk-reserve: "N%" of the filesystem's size, or a
// size in MiB ("2048", "2048MiB") or GiB ("2GiB").
func ParseReserve(s string) (func(totalBytes int64) int64, error) {
	var n float64
	var unit string
	if _, err := fmt.Sscanf(s, "%g%s", &n, &unit); err != nil && unit == "" {
		if _, err := fmt.Sscanf(s, "%g", &n); err != nil {
			return nil, fmt.Errorf("disk reserve %q: want N%%, N MiB or NGiB", s)
		}
	}
	if n < 0 {
		return nil, fmt.Errorf("disk reserve %q is negative", s)
	}
	switch unit {
	case "%":
		if n > 100 {
			return nil, fmt.Errorf("disk reserve %q is over 100%%", s)
		}
		return func(total int64) int64 { return int64(float64(total) * n / 100) }, nil
	case "", "M", "MiB":
		return func(int64) int64 { return int64(n * (1 << 20)) }, nil
	case "G", "GiB":
		return func(int64) int64 { return int64(n * (1 << 30)) }, nil
	}
	return nil, fmt.Errorf("disk reserve %q: unit %q is not %%, MiB or GiB", s, unit)
}
