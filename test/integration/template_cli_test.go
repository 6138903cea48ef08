package integration

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/testenv"
)

// TestTemplateCLI builds templates with `cubicle template build` from a
// Dockerfile-style recipe against a real server, then lists, inspects and
// deletes them.
// uuidRE finds build IDs (UUIDs) in CLI output.
var uuidRE = regexp.MustCompile(`[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}`)

func TestTemplateCLI(t *testing.T) {
	if _, err := os.Stat(filepath.Join(binDir, "buildkitd")); err != nil {
		testenv.Skipf(t, "buildkitd missing next to the cubicle binary in %s (make build produces bin/buildkitd): %v", binDir, err)
	}
	s := startServer(t)
	cli := func(args ...string) (string, error) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, filepath.Join(binDir, "cubicle"), args...)
		cmd.Env = append(os.Environ(), "CUBICLE_API_URL="+s.URL, "CUBICLE_API_KEY="+s.Key)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	exitCode := func(err error) int {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return ee.ExitCode()
		}
		if err != nil {
			return -1
		}
		return 0
	}
	if out, err := cli("image", "import", "cubicle/base:1", filepath.Join(imagesDir(t), "mini", "rootfs")); err != nil {
		t.Fatalf("image import: %v\n%s", err, out)
	}

	ctxDir := t.TempDir()
	write := func(rel, body string) {
		p := filepath.Join(ctxDir, rel)
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("hello.txt", "hello from the cli context\n")
	write("sub/nested.txt", "nested\n")
	write("secret.txt", "must not be sent\n")
	write(".dockerignore", "secret.txt\n")
	write("Recipe", `# a template built by the CLI
FROM cubicle/base:1
COPY hello.txt /opt/cli/hello.txt
COPY sub /opt/cli/sub
COPY . /opt/ctx/
ENV GREETING="built by cli" \
    OTHER=2
RUN echo "$GREETING" > /opt/cli/greeting && \
    mkdir -p /srv/cli && chown 1000:1000 /srv/cli
EXPOSE 8080
WORKDIR /srv/cli
USER user
RUN id -u > /srv/cli/built-as
`)
	out, err := cli("template", "build", "-f", filepath.Join(ctxDir, "Recipe"), "--name", "cli-tpl", "--cpu", "1", "--memory-mb", "256")
	if err != nil {
		t.Fatalf("template build: %v\n%s\nserver logs:\n%s", err, out, s.logs)
	}
	for _, want := range []string{"Step 1/10: FROM cubicle/base:1", "Step 2/10: COPY hello.txt", "Step 6/10: RUN echo", "Step 10/10: finalize", "Uploaded 'hello.txt'", "EXPOSE is ignored", "is ready: templateID "} {
		if !strings.Contains(out, want) {
			t.Errorf("build output lacks %q:\n%s", want, out)
		}
	}
	if !regexp.MustCompile(`(?m)^\[\d+\] `).MatchString(out) {
		t.Errorf("build output has no [step] log lines:\n%s", out)
	}

	c := s.create(map[string]any{"templateID": "cli-tpl"})
	got := s.mustRun(c, "cat /opt/cli/hello.txt /opt/cli/sub/nested.txt /opt/cli/greeting /srv/cli/built-as /opt/ctx/hello.txt; "+
		"test -e /opt/ctx/secret.txt && echo secret-present; pwd; id -un")
	want := "hello from the cli context\nnested\nbuilt by cli\n1000\nhello from the cli context\n/srv/cli\nuser\n"
	if got != want {
		t.Errorf("sandbox of cli-tpl:\n got %q\nwant %q", got, want)
	}

	// The same build again: every context is already on the server.
	out, err = cli("template", "build", "-f", filepath.Join(ctxDir, "Recipe"), "--name", "cli-tpl")
	if err != nil || !strings.Contains(out, "Skipping upload of 'hello.txt', already cached") {
		t.Errorf("rebuild: %v\n%s", err, out)
	}

	// A failing RUN: exit status 1 and the reason with its step.
	failDir := t.TempDir()
	os.WriteFile(filepath.Join(failDir, "Recipe"), []byte("FROM cubicle/base:1\nRUN echo ok\nRUN echo failing; exit 3\n"), 0o644)
	out, err = cli("template", "build", "-f", filepath.Join(failDir, "Recipe"), "--name", "cli-fail")
	if exitCode(err) != 1 {
		t.Fatalf("failing build: want exit 1, got %v\n%s", err, out)
	}
	if !strings.Contains(out, "failed at step 1 (RUN echo failing; exit 3)") || !regexp.MustCompile(`exit code: 3|exit status 3|did not complete successfully`).MatchString(out) {
		t.Errorf("failing build output lacks the reason and step:\n%s", out)
	}

	// A recipe error names the line and reaches no server.
	os.WriteFile(filepath.Join(failDir, "Bad"), []byte("FROM cubicle/base:1\nARG X=1\n"), 0o644)
	out, err = cli("template", "build", "-f", filepath.Join(failDir, "Bad"), "--name", "cli-bad")
	if exitCode(err) != 1 || !strings.Contains(out, "Bad:2: ARG is not supported") {
		t.Errorf("recipe error: %v\n%s", err, out)
	}

	out, err = cli("template", "list")
	if err != nil || !regexp.MustCompile(`(?m)^tpl_\S+\s+cli-tpl\S*\s+ready\s+1\s+256MiB`).MatchString(out) || !strings.Contains(out, "cli-fail") {
		t.Errorf("template list: %v\n%s", err, out)
	}
	out, err = cli("template", "list", "--json")
	var list []map[string]any
	if err != nil || json.Unmarshal([]byte(out), &list) != nil || len(list) < 3 {
		t.Errorf("template list --json: %v\n%s", err, out)
	}
	out, err = cli("template", "get", "cli-tpl")
	if err != nil || len(uuidRE.FindAllString(out, -1)) < 3 { // current build + 2 builds
		t.Errorf("template get: %v\n%s", err, out)
	}
	out, err = cli("template", "logs", "cli-fail")
	if err == nil || !strings.Contains(out, "failing") {
		t.Errorf("template logs of the failed build: %v\n%s", err, out)
	}

	// In use: refused; after the sandbox is gone it goes.
	if out, err = cli("template", "delete", "cli-tpl"); err == nil || !strings.Contains(out, "in use") {
		t.Errorf("delete while in use: %v\n%s", err, out)
	}
	if out, err = cli("sandbox", "kill", c.SandboxID); err != nil {
		t.Fatalf("sandbox kill: %v\n%s", err, out)
	}
	if out, err = cli("template", "delete", "cli-tpl", "cli-fail"); err != nil {
		t.Fatalf("template delete: %v\n%s", err, out)
	}
	if out, err = cli("template", "get", "cli-tpl"); exitCode(err) != 1 || !strings.Contains(out, "404") {
		t.Errorf("get after delete: %v\n%s", err, out)
	}
}
