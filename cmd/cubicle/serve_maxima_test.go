package main

import (
	"strings"
	"testing"
)

// The code interpreter's memory is refused above the sandbox maximum and
// when negative; 0 leaves it to the catalog (2048, or the maximum).
func TestCodeInterpreterMemoryWithinTheMaximum(t *testing.T) {
	for _, tc := range []struct {
		ci, max int
		err     string
	}{
		{0, 1024, ""},
		{2048, 4096, ""},
		{4096, 2048, "--code-interpreter-memory-mb 4096 exceeds --max-sandbox-memory-mb 2048"},
		{-1, 2048, "must not be negative"},
	} {
		o := &serveOptions{maxImageBytes: 1, cpuCount: 1, memoryMB: 512, diskSizeMB: 1,
			volumeSizeMB: 1, maxMemoryMB: tc.max, codeInterpreterMemoryMB: tc.ci}
		o.dataDir = t.TempDir()
		err := sandboxMaxima(o)
		if (err == nil) != (tc.err == "") || (err != nil && !strings.Contains(err.Error(), tc.err)) {
			t.Errorf("ci %d max %d: %v, want %q", tc.ci, tc.max, err, tc.err)
		}
	}
}
