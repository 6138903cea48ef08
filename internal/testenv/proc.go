package testenv

import (
	"fmt"
	"os"
	"strings"
	"testing"
)

// ProcUids is the Uid line of /proc/<pid>/status (real, effective, saved,
// fs): what a test checks to show a process does not run as host root.
func ProcUids(t testing.TB, pid int) []string {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) == 5 && f[0] == "Uid:" {
			return f[1:]
		}
	}
	t.Fatalf("no Uid line in /proc/%d/status", pid)
	return nil
}
