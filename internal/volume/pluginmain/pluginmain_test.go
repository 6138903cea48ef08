package pluginmain_test

import (
	"bytes"
	"context"
	"encoding/json"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/cubicle-dev/cubicle/internal/testenv"
	"github.com/cubicle-dev/cubicle/internal/volume/internal/mountinfo"
	"github.com/cubicle-dev/cubicle/internal/volume/local"
	"github.com/cubicle-dev/cubicle/internal/volume/pluginmain"
)

type result struct {
	code   int
	answer map[string]any
	stderr string
}

func run(t *testing.T, root string, args ...string) result {
	t.Helper()
	var out, errb bytes.Buffer
	code := pluginmain.RunBinary(context.Background(), args, &out, &errb, local.New(root))
	// Exactly one JSON object, whatever happened.
	dec := json.NewDecoder(&out)
	var ans map[string]any
	if err := dec.Decode(&ans); err != nil {
		t.Fatalf("%v: stdout is not a JSON object: %v", args, err)
	}
	if dec.More() {
		t.Fatalf("%v: more than one JSON value on stdout", args)
	}
	return result{code, ans, errb.String()}
}

func keys(m map[string]any) string {
	return strings.Join(slices.Sorted(maps.Keys(m)), ",")
}

func TestCreateDestroy(t *testing.T) {
	root := t.TempDir()
	r := run(t, root, "--op", "create", "--volume-id", "v1", "--name", "v1")
	if r.code != 0 || keys(r.answer) != "error,private_data,token" || r.answer["error"] != "" {
		t.Fatalf("create: %+v", r)
	}
	if _, err := os.Stat(filepath.Join(root, "v1")); err != nil {
		t.Fatal(err)
	}
	// --flag=value spelling.
	r = run(t, root, "--op=destroy", "--volume-id=v1")
	if r.code != 0 || keys(r.answer) != "error" || r.answer["error"] != "" {
		t.Fatalf("destroy: %+v", r)
	}
	if _, err := os.Stat(filepath.Join(root, "v1")); !os.IsNotExist(err) {
		t.Fatalf("destroy left data: %v", err)
	}
}

func TestAttachDetach(t *testing.T) {
	testenv.RequireRoot(t, "the local plugin bind-mounts")
	root, base := t.TempDir(), t.TempDir()
	t.Cleanup(func() {
		mps, _ := mountinfo.Under(base)
		for _, mp := range mps {
			t.Errorf("left mounted: %s", mp)
			_ = unix.Unmount(mp, unix.MNT_DETACH)
		}
	})
	run(t, root, "--op", "create", "--volume-id", "v", "--name", "v")
	r := run(t, root, "--op", "attach", "--sandbox-id", "s", "--namespace", "cubicle", "--volume-id", "v",
		"--ref-count", "0", "--volume-base-dir", base, "--private-data", "anything")
	hp := filepath.Join(base, "local-v")
	if r.code != 0 || keys(r.answer) != "error,host_path,metadata" || r.answer["host_path"] != hp {
		t.Fatalf("attach: %+v", r)
	}
	md, _ := json.Marshal(r.answer["metadata"])
	r = run(t, root, "--op", "detach", "--sandbox-id", "s", "--namespace", "cubicle", "--volume-id", "v",
		"--ref-count", "0", "--metadata", string(md))
	if r.code != 0 || keys(r.answer) != "error" {
		t.Fatalf("detach: %+v", r)
	}
	if _, err := os.Stat(hp); !os.IsNotExist(err) {
		t.Fatalf("host path left: %v", err)
	}
}

func TestHookError(t *testing.T) {
	root := t.TempDir()
	// Attach of a volume never created fails inside the plugin.
	r := run(t, root, "--op", "attach", "--sandbox-id", "s", "--volume-id", "nope", "--ref-count", "0", "--volume-base-dir", t.TempDir())
	if r.code != pluginmain.ExitHook || keys(r.answer) != "error,host_path,metadata" || !strings.Contains(r.answer["error"].(string), "does not exist") {
		t.Fatalf("%+v", r)
	}
	r = run(t, root, "--op", "create", "--volume-id", "../escape")
	if r.code != pluginmain.ExitHook || r.answer["error"] == "" {
		t.Fatalf("%+v", r)
	}
}

func TestUsage(t *testing.T) {
	root := t.TempDir()
	for name, args := range map[string][]string{
		"no op":          {},
		"unknown op":     {"--op", "resize", "--volume-id", "v"},
		"unknown flag":   {"--op", "create", "--volume-id", "v", "--size", "1"},
		"missing id":     {"--op", "destroy"},
		"attach no base": {"--op", "attach", "--sandbox-id", "s", "--volume-id", "v", "--ref-count", "0"},
		"detach no rc":   {"--op", "detach", "--sandbox-id", "s", "--volume-id", "v"},
		"bad ref-count":  {"--op", "detach", "--sandbox-id", "s", "--volume-id", "v", "--ref-count", "one"},
		"neg ref-count":  {"--op", "detach", "--sandbox-id", "s", "--volume-id", "v", "--ref-count", "-1"},
		"bad metadata":   {"--op", "detach", "--sandbox-id", "s", "--volume-id", "v", "--ref-count", "0", "--metadata", "{not json"},
		"metadata array": {"--op", "detach", "--sandbox-id", "s", "--volume-id", "v", "--ref-count", "0", "--metadata", `["a"]`},
		"stray argument": {"--op", "destroy", "--volume-id", "v", "extra"},
	} {
		r := run(t, root, args...)
		if r.code != pluginmain.ExitUsage || r.answer["error"] == "" || r.stderr == "" {
			t.Errorf("%s: %+v", name, r)
		}
	}
}
