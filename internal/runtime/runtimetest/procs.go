package runtimetest

import (
	"os"
	"strconv"
	"strings"
	"testing"
)

// ProcIDs reads the real uid and CapEff of pid from /proc.
func ProcIDs(t testing.TB, pid int) (uid, capEff string) {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "Uid:"); ok {
			uid = strings.Fields(v)[0]
		}
		if v, ok := strings.CutPrefix(l, "CapEff:"); ok {
			capEff = strings.TrimSpace(v)
		}
	}
	return uid, capEff
}

// RunscProcs are the pids of the sentry (runsc-sandbox ... boot) and the
// gofer serving sandbox id, found by their command lines.
func RunscProcs(t testing.TB, id string) (sentry, gofer []int) {
	t.Helper()
	ents, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err != nil {
			continue
		}
		args := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
		if len(args) == 0 || args[len(args)-1] != id {
			continue
		}
		for _, a := range args {
			switch a {
			case "boot":
				sentry = append(sentry, pid)
			case "gofer":
				gofer = append(gofer, pid)
			}
		}
	}
	return sentry, gofer
}
