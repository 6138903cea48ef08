package main

import "testing"

// --userns auto is on for every runtime: under runsc the namespace holds
// gVisor's sentry and gofer, which would otherwise run as host root.
func TestUsernsMode(t *testing.T) {
	for _, rt := range []string{"runc", "crun", "runsc"} {
		for v, want := range map[string]bool{"auto": true, "on": true, "off": false} {
			if got, err := usernsMode(v, rt); err != nil || got != want {
				t.Errorf("usernsMode(%q, %s) = %v, %v; want %v", v, rt, got, err, want)
			}
		}
		if _, err := usernsMode("yes", rt); err == nil {
			t.Errorf("usernsMode(yes, %s) accepted", rt)
		}
	}
}
