package lease

import (
	"errors"
	"path/filepath"
	"testing"
)

// A file claim is held until released, against every other taker, and
// free again after.
func TestClaimFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "node-a.claim")
	release, err := ClaimFile(path, "node/a")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ClaimFile(path, "node/a"); !errors.Is(err, ErrHeld) {
		t.Fatalf("second claim while held: %v, want ErrHeld", err)
	}
	other, err := ClaimFile(filepath.Join(filepath.Dir(path), "node-b.claim"), "node/b")
	if err != nil {
		t.Fatalf("another name's claim: %v", err)
	}
	other()
	release()
	again, err := ClaimFile(path, "node/a")
	if err != nil {
		t.Fatalf("claim after release: %v", err)
	}
	again()
}
