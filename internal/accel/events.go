package accel

import (
	"bufio"
	"encoding/json"
	"os"
	"path/filepath"
	"sync"
	"time"
)

// Event is one recorded device lifecycle fact or scheduling denial.
type Event struct {
	Time    time.Time `json:"time"`
	Type    string    `json:"type"` // reserve, prepare, attach, release, quarantine, unhealthy, disable, enable, recover, deny, restore
	Device  string    `json:"device,omitempty"`
	Sandbox string    `json:"sandbox,omitempty"`
	From    string    `json:"from,omitempty"`
	To      string    `json:"to,omitempty"`
	Reason  string    `json:"reason,omitempty"`
}

const (
	eventRing    = 1000
	eventMaxSize = 1 << 20
)

// eventLog is an in-memory ring backed by <dir>/events.jsonl (rotated to
// events.jsonl.1 past 1 MiB).
type eventLog struct {
	mu   sync.Mutex
	path string
	ring []Event
}

func openEventLog(dir string) *eventLog {
	l := &eventLog{path: filepath.Join(dir, "events.jsonl")}
	for _, p := range []string{l.path + ".1", l.path} {
		f, err := os.Open(p)
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			var e Event
			if json.Unmarshal(sc.Bytes(), &e) == nil {
				l.push(e)
			}
		}
		f.Close()
	}
	return l
}

func (l *eventLog) push(e Event) {
	l.ring = append(l.ring, e)
	if len(l.ring) > eventRing {
		l.ring = append([]Event(nil), l.ring[len(l.ring)-eventRing:]...)
	}
}

func (l *eventLog) append(e Event) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.push(e)
	if fi, err := os.Stat(l.path); err == nil && fi.Size() > eventMaxSize {
		_ = os.Rename(l.path, l.path+".1")
	}
	b, err := json.Marshal(e)
	if err != nil {
		return err
	}
	f, err := os.OpenFile(l.path, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	_, err = f.Write(append(b, '\n'))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// last returns up to limit newest events, newest last (limit<=0: all).
func (l *eventLog) last(limit int) []Event {
	l.mu.Lock()
	defer l.mu.Unlock()
	r := l.ring
	if limit > 0 && len(r) > limit {
		r = r[len(r)-limit:]
	}
	return append([]Event(nil), r...)
}
