package accel

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"
)

func TestEventLogPersistsAndRotates(t *testing.T) {
	dir := t.TempDir()
	l := openEventLog(dir)
	for i := 0; i < 1200; i++ {
		if err := l.append(Event{Time: time.Unix(int64(i), 0), Type: "reserve", Device: fmt.Sprint(i), Reason: string(make([]byte, 1000))}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "events.jsonl.1")); err != nil {
		t.Fatalf("not rotated: %v", err)
	}
	if got := l.last(3); len(got) != 3 || got[2].Device != "1199" {
		t.Fatalf("%+v", got)
	}
	l2 := openEventLog(dir)
	all := l2.last(0)
	if len(all) == 0 || len(all) > eventRing || all[len(all)-1].Device != "1199" {
		t.Fatalf("reloaded %d, last %+v", len(all), all[len(all)-1])
	}
}
