package diskbudget

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

func TestParseReserve(t *testing.T) {
	const total = 100 << 30
	for in, want := range map[string]int64{"5%": 5 << 30, "0": 0, "2048": 2 << 30, "2048MiB": 2 << 30, "2GiB": 2 << 30, "100%": total, "1.5G": 3 << 29} {
		f, err := ParseReserve(in)
		if err != nil {
			t.Fatalf("%q: %v", in, err)
		}
		if got := f(total); got != want {
			t.Errorf("%q of 100 GiB = %d, want %d", in, got, want)
		}
	}
	for _, in := range []string{"", "x", "-1", "101%", "5TB"} {
		if _, err := ParseReserve(in); err == nil {
			t.Errorf("%q accepted", in)
		}
	}
}

// The budget counts reservations and what existing sparse images may
// still take, and refuses a new image past free space minus the reserve.
// Before each admission the reserve is set to leave a window of a known
// size above what is promised, measured just before, so writes by other
// processes on the same filesystem cannot flip the result.
func TestReserve(t *testing.T) {
	dir := t.TempDir()
	var imgs []Image
	var reserve int64
	b := New(Config{Dir: dir, Reserve: func(int64) int64 { return reserve }, Sources: []Source{func() ([]Image, error) { return imgs, nil }}})
	window := func(w int64) Status {
		t.Helper()
		reserve = 0
		st, err := b.Status()
		if err != nil {
			t.Fatal(err)
		}
		if st.FreeBytes-st.PromisedBytes < 2<<30 {
			t.Fatalf("the test needs 2 GiB free in %s", dir)
		}
		reserve = st.FreeBytes - st.PromisedBytes - w
		return st
	}
	st := window(512 << 20)
	rel1, err := b.Reserve("sandbox/a", "a", 100<<20)
	if err != nil {
		t.Fatal(err)
	}
	// A sparse 200 MiB image of another sandbox is promised in full.
	img := filepath.Join(dir, "b.img")
	f, err := os.Create(img)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(200 << 20); err != nil {
		t.Fatal(err)
	}
	f.Close()
	imgs = []Image{{Key: "sandbox/b", Path: img}}
	st2, _ := b.Status()
	if d := st2.PromisedBytes - st.PromisedBytes; d != 300<<20 {
		t.Fatalf("promised grew by %d MiB, want 300 (100 reserved + a 200 MiB sparse image)", d>>20)
	}
	// A reservation standing for an image that exists counts once.
	window(512 << 20)
	rel2, err := b.Reserve("sandbox/b", "b", 200<<20)
	if err != nil {
		t.Fatal(err)
	}
	if st3, _ := b.Status(); st3.PromisedBytes != st2.PromisedBytes {
		t.Fatalf("a reservation and its image counted twice: %d vs %d MiB", st3.PromisedBytes>>20, st2.PromisedBytes>>20)
	}
	rel2()
	rel2() // idempotent
	window(512 << 20)
	_, err = b.Reserve("volume/c", "a 1024 MiB volume", 1<<30)
	var se *ShortError
	if !errors.As(err, &se) || !errors.Is(err, ErrInsufficientStorage) || se.What != "a 1024 MiB volume" {
		t.Fatalf("1 GiB into a window of 512 MiB: want a ShortError, got %v", err)
	}
	rel1()
	imgs = nil
	if st4, _ := b.Status(); st4.PromisedBytes != st.PromisedBytes {
		t.Fatalf("after release: promised %d MiB, want %d", st4.PromisedBytes>>20, st.PromisedBytes>>20)
	}
	window(512 << 20)
	rel, err := b.Reserve("volume/c", "c", 400<<20)
	if err != nil {
		t.Fatalf("400 MiB into a 512 MiB window: %v", err)
	}
	rel()
}

// An image that may grow by more than the filesystem has free is listed
// by Short (a sparse file larger than the disk stands in for a budget
// overrun by files that are not images).
func TestShort(t *testing.T) {
	dir := t.TempDir()
	small, huge := filepath.Join(dir, "small.img"), filepath.Join(dir, "huge.img")
	for _, f := range []struct {
		path string
		size int64
	}{{small, 1 << 20}, {huge, 1 << 42}} {
		fh, err := os.Create(f.path)
		if err != nil {
			t.Fatal(err)
		}
		if err := fh.Truncate(f.size); err != nil {
			t.Fatal(err)
		}
		fh.Close()
	}
	b := New(Config{Dir: dir, Reserve: func(int64) int64 { return 0 }, Sources: []Source{func() ([]Image, error) {
		return []Image{{Key: "sandbox/small", Path: small}, {Key: "sandbox/huge", Path: huge}}, nil
	}}})
	free, short, err := b.Short()
	if err != nil {
		t.Fatal(err)
	}
	if free <= 0 || len(short) != 1 || short[0].Key != "sandbox/huge" || short[0].AllowanceBytes != 1<<42 {
		t.Fatalf("Short = %d, %+v; want only the 4 TiB image", free, short)
	}
}

// A frozen image (a snapshot's clone) promises what it allocates, and
// Short never lists it: it is never written.
func TestFrozen(t *testing.T) {
	dir := t.TempDir()
	img := filepath.Join(dir, "snap.img")
	if err := os.WriteFile(img, make([]byte, 3<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(img, 1<<40); err != nil { // larger than any free space
		t.Fatal(err)
	}
	var imgs []Image
	b := New(Config{Dir: dir, Reserve: func(int64) int64 { return 0 }, Sources: []Source{func() ([]Image, error) { return imgs, nil }}})
	st, err := b.Status()
	if err != nil {
		t.Fatal(err)
	}
	imgs = []Image{{Key: "snapshot/s", Path: img, Frozen: true}}
	st2, _ := b.Status()
	if d := st2.PromisedBytes - st.PromisedBytes; d < 3<<20 || d > 4<<20 {
		t.Fatalf("a frozen image with 3 MiB allocated promised %d bytes, want its 3 MiB", d)
	}
	if _, short, err := b.Short(); err != nil || len(short) != 0 {
		t.Fatalf("Short = %v, %v; a frozen image is never short", short, err)
	}
	imgs[0].Frozen = false
	if _, short, _ := b.Short(); len(short) != 1 {
		t.Fatalf("the same image not frozen: Short = %v, want it listed", short)
	}
}
