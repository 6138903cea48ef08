package control

import (
	"context"
	"strings"
	"time"

	"github.com/cubicle-dev/cubicle/internal/diskbudget"
)

// DiskWatcher is optionally implemented by the Config.Disk budget: it
// lists the sparse images that may grow by more than the data filesystem
// has free, whose owners' writes can therefore fail before their size.
type DiskWatcher interface {
	Short() (freeBytes int64, short []diskbudget.Shortfall, err error)
}

// diskWatchInterval is how often the data filesystem is checked.
const diskWatchInterval = 5 * time.Second

// diskWatcher reports, once per episode, each sandbox and volume whose image
// the data filesystem can no longer hold to its size: an event on it
// (visible in the sandbox's logs) and an error in the server's log. Inside
// the sandbox such writes fail as I/O errors, which would otherwise look
// like a broken disk.
// The returned pass runs on the node's disk-watch loop (one goroutine).
func (m *Manager) diskWatcher(w DiskWatcher) func(context.Context) {
	reported := map[string]bool{}
	return func(ctx context.Context) {
		free, short, err := w.Short()
		if err != nil {
			m.log.Error("data filesystem check", "err", err)
			return
		}
		now := map[string]bool{}
		for _, s := range short {
			now[s.Key] = true
			if reported[s.Key] {
				continue
			}
			m.log.Error("data filesystem short of space: an image can no longer grow to its size", "image", s.Key,
				"free_mib", free>>20, "may_still_take_mib", s.AllowanceBytes>>20)
			const msg = "the server's data filesystem has %d MiB free, less than the %d MiB this %s may still take: writes past that fail (as I/O errors inside) until the operator frees space"
			switch kind, id, _ := strings.Cut(s.Key, "/"); kind {
			case "sandbox":
				m.event(ctx, id, "disk-short", "error", msg, free>>20, s.AllowanceBytes>>20, "sandbox's disk")
			case "volume":
				m.volumeEvent(ctx, id, "", "volume.disk-short", "error", msg, free>>20, s.AllowanceBytes>>20, "volume")
			}
		}
		reported = now
	}
}
