package testenv

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// The behaviour under test is the test binary's own verdict, so each case
// reruns this binary with CI set or not and reads what go test printed.
func TestSkipFailsUnderCI(t *testing.T) {
	if os.Getenv("TESTENV_CHILD") == "1" {
		Skip(t, "the thing is missing")
		return
	}
	for _, c := range []struct {
		ci       string
		wantFail bool
		want     string
	}{
		{"", false, "--- SKIP"},
		{"false", false, "--- SKIP"},
		{"true", true, "--- FAIL"},
	} {
		cmd := exec.Command(os.Args[0], "-test.run=^TestSkipFailsUnderCI$", "-test.v")
		cmd.Env = append(os.Environ(), "TESTENV_CHILD=1", "CI="+c.ci)
		out, err := cmd.CombinedOutput()
		if (err != nil) != c.wantFail || !strings.Contains(string(out), c.want) || !strings.Contains(string(out), "the thing is missing") {
			t.Errorf("CI=%q: err %v, output:\n%s\nwant %s with the reason", c.ci, err, out, c.want)
		}
	}
}

func TestLookPathFindsAndMisses(t *testing.T) {
	if os.Getenv("TESTENV_CHILD") == "1" {
		LookPath(t, "no-such-program-cubicle-testenv")
		return
	}
	if p := LookPath(t, "sh"); p == "" {
		t.Fatal("sh not found")
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestLookPathFindsAndMisses$", "-test.v")
	cmd.Env = append(os.Environ(), "TESTENV_CHILD=1", "CI=true")
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "no-such-program-cubicle-testenv not installed") {
		t.Errorf("missing program under CI=true: err %v, output:\n%s", err, out)
	}
}
