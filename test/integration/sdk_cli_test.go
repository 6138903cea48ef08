package integration

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/testenv"
)

// TestSDKExamples builds every program in sdk/go/examples and runs it
// against a real server, configured only through the environment.
func TestSDKExamples(t *testing.T) {
	s := startServer(t)
	dirs, err := filepath.Glob("../../sdk/go/examples/*")
	if err != nil || len(dirs) < 4 {
		t.Fatalf("examples: %v %v", dirs, err)
	}
	_, bkErr := os.Stat(filepath.Join(binDir, "buildkitd"))
	for _, d := range dirs {
		name := filepath.Base(d)
		t.Run(name, func(t *testing.T) {
			if name == "template" && bkErr != nil {
				testenv.Skip(t, "buildkitd missing")
			}
			bin := filepath.Join(t.TempDir(), name)
			build := exec.Command("go", "build", "-o", bin, "./examples/"+name)
			build.Dir = "../../sdk/go"
			if out, err := build.CombinedOutput(); err != nil {
				t.Fatalf("build: %v\n%s", err, out)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, bin)
			// E2B_* on purpose: existing e2b setups work unchanged.
			cmd.Env = append(os.Environ(), "CUBICLE_API_URL=", "CUBICLE_API_KEY=", "E2B_API_URL="+s.URL, "E2B_API_KEY="+s.Key)
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("%s: %v\n%s\nserver logs:\n%s", name, err, out, s.logs)
			}
			want := map[string]string{"quickstart": "killed", "streaming": "answered 42", "volumes": "volume deleted", "template": "app says hi"}[name]
			if !strings.Contains(string(out), want) {
				t.Fatalf("%s output lacks %q:\n%s", name, want, out)
			}
		})
	}
}

// TestCLISandboxAndFiles runs one happy path per `cubicle sandbox` and
// `cubicle files` command against a real server.
func TestCLISandboxAndFiles(t *testing.T) {
	s := startServer(t)
	cli := func(stdin string, args ...string) (string, string, int) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, filepath.Join(binDir, "cubicle"), args...)
		cmd.Env = append(os.Environ(), "CUBICLE_API_URL="+s.URL, "CUBICLE_API_KEY="+s.Key)
		cmd.Stdin = strings.NewReader(stdin)
		var out, errOut strings.Builder
		cmd.Stdout, cmd.Stderr = &out, &errOut
		err := cmd.Run()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatalf("%v: %v", args, err)
		}
		return out.String(), errOut.String(), code
	}
	must := func(stdin string, args ...string) string {
		t.Helper()
		out, errOut, code := cli(stdin, args...)
		if code != 0 {
			t.Fatalf("cubicle %v: exit %d\n%s%s", args, code, out, errOut)
		}
		return out
	}
	id := strings.TrimSpace(must("", "sandbox", "create", "--timeout", "600", "-e", "WHO=cli", "--metadata", "via=cli"))
	if out := must("", "sandbox", "list"); !strings.Contains(out, id) || !strings.Contains(out, "running") || !strings.HasPrefix(out, "ID") {
		t.Fatalf("list:\n%s", out)
	}
	var listed []map[string]any
	if err := json.Unmarshal([]byte(must("", "sandbox", "list", "--json", "--metadata", "via=cli")), &listed); err != nil || len(listed) != 1 {
		t.Fatalf("list --json: %v %v", listed, err)
	}
	if out := must("", "sandbox", "info", id); !strings.Contains(out, `"state": "running"`) {
		t.Fatalf("info:\n%s", out)
	}
	if out := must("", "sandbox", "exec", id, "--", "echo", "hi $WHO"); out != "hi $WHO\n" {
		t.Fatalf("exec quoted args: %q", out)
	}
	if out := must("", "sandbox", "exec", id, "--", "echo hi $WHO | tr a-z A-Z"); out != "HI CLI\n" {
		t.Fatalf("exec shell line: %q", out)
	}
	if out, errOut, code := cli("", "sandbox", "exec", id, "--", "echo out; echo err >&2; exit 7"); code != 7 || out != "out\n" || errOut != "err\n" {
		t.Fatalf("exec exit code: %d %q %q", code, out, errOut)
	}
	if out := must("from stdin\n", "sandbox", "exec", "--stdin", id, "--", "cat"); out != "from stdin\n" {
		t.Fatalf("exec --stdin: %q", out)
	}
	if out := must("echo shell-$((20+1))\n", "sandbox", "shell", id); !strings.Contains(out, "shell-21") {
		t.Fatalf("shell:\n%s", out)
	}

	local := filepath.Join(t.TempDir(), "up.txt")
	os.WriteFile(local, []byte(strings.Repeat("x", 100000)+"\n"), 0o644)
	if out, errOut, code := cli("", "files", "cp", "--progress", local, id+":/tmp/cli/"); code != 0 || !strings.Contains(out, "/tmp/cli/up.txt") || !strings.Contains(errOut, "100%") {
		t.Fatalf("cp up: %d %q %q", code, out, errOut)
	}
	back := filepath.Join(t.TempDir(), "down.txt")
	must("", "files", "cp", id+":/tmp/cli/up.txt", back)
	if b, _ := os.ReadFile(back); len(b) != 100001 {
		t.Fatalf("cp down: %d bytes", len(b))
	}
	if out := must("", "files", "cp", id+":/tmp/cli/up.txt", "-"); len(out) != 100001 {
		t.Fatalf("cp to stdout: %d bytes", len(out))
	}
	if out := must("", "files", "ls", id+":/tmp/cli"); !strings.Contains(out, "/tmp/cli/up.txt") || !strings.Contains(out, "100001") {
		t.Fatalf("ls:\n%s", out)
	}
	if _, errOut, code := cli("", "files", "cp", id+":/tmp/cli/none", back); code != 1 || !strings.Contains(errOut, "hint:") {
		t.Fatalf("cp missing: %d %q", code, errOut)
	}

	if out := must("", "sandbox", "pause", id); !strings.Contains(out, "paused") {
		t.Fatalf("pause: %q", out)
	}
	if out := must("", "sandbox", "resume", id); !strings.Contains(out, "running") {
		t.Fatalf("resume: %q", out)
	}
	if out := must("", "sandbox", "kill", id); strings.TrimSpace(out) != id {
		t.Fatalf("kill: %q", out)
	}
	if _, errOut, code := cli("", "sandbox", "kill", id); code != 1 || !strings.Contains(errOut, "no such sandbox") || !strings.Contains(errOut, "hint:") {
		t.Fatalf("kill again: %d %q", code, errOut)
	}
	// Warm pools and the image store.
	if out := must("", "pool", "set", "base", "--size", "1"); !strings.Contains(out, "pool size 1") {
		t.Fatalf("pool set: %q", out)
	}
	if out := must("", "pool", "list"); !strings.Contains(out, "base") {
		t.Fatalf("pool list: %q", out)
	}
	var pools []map[string]any
	if err := json.Unmarshal([]byte(must("", "pool", "list", "--json")), &pools); err != nil || len(pools) != 1 || pools[0]["poolSize"] != float64(1) {
		t.Fatalf("pool list --json: %v %v", pools, err)
	}
	if out := must("", "pool", "get", "base"); !strings.Contains(out, "pool size 1") {
		t.Fatalf("pool get: %q", out)
	}
	must("", "pool", "set", "base", "--size", "0")
	must("", "image", "import", "cli/base:1", filepath.Join(imagesDir(t), "base", "rootfs"))
	if out := must("", "image", "list"); !strings.Contains(out, "cli/base:1") {
		t.Fatalf("image list: %q", out)
	}
	must("", "image", "delete", "cli/base:1")
	if out := must("", "image", "list"); strings.Contains(out, "cli/base:1") {
		t.Fatalf("image still listed: %q", out)
	}
	if out := must("", "gpu", "list"); !strings.Contains(out, "no accelerators") {
		t.Fatalf("gpu list: %q", out)
	}
	if out := must("", "completion", "bash"); !strings.Contains(out, "__start_cubicle") {
		t.Fatalf("completion: %.200q", out)
	}
	// A dead server gets a hint naming the URL.
	cmd := exec.Command(filepath.Join(binDir, "cubicle"), "sandbox", "list")
	cmd.Env = append(os.Environ(), "CUBICLE_API_URL=http://127.0.0.1:1", "CUBICLE_API_KEY=k")
	if out, _ := cmd.CombinedOutput(); !strings.Contains(string(out), "is `cubicle serve` running at http://127.0.0.1:1") {
		t.Fatalf("refused: %s", out)
	}
}
