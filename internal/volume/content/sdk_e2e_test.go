package content

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/testenv"
)

// TestSDKEndToEnd drives the handler with the real e2b JS SDK
// (testdata/sdk_e2e.mjs); skipped (failed under CI=true) when node or
// test/e2b-js/node_modules is missing.
func TestSDKEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("short mode")
	}
	requireRoot(t) // the script sets uid/gid
	node := testenv.LookPath(t, "node")
	module, err := filepath.Abs("../../../test/e2b-js/node_modules/e2b/dist/index.mjs")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(module); err != nil {
		testenv.Skip(t, "e2b SDK not installed under test/e2b-js/node_modules (npm ci in test/e2b-js)")
	}
	e := newEnv(t)

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, "testdata/sdk_e2e.mjs")
	cmd.Env = append(os.Environ(),
		"E2B_MODULE="+module,
		"E2B_VOLUME_API_URL="+e.srv.URL,
		"E2B_DEBUG=false",
		"VOLUME_ID="+testVol,
		"VOLUME_TOKEN="+testToken,
	)
	out, err := cmd.CombinedOutput()
	t.Logf("node output:\n%s", out)
	if err != nil {
		t.Fatalf("sdk e2e script: %v", err)
	}
	fi, err := os.Stat(e.path("big/stream.bin"))
	if err != nil || fi.Size() != 5<<20 || fi.Mode().Perm() != 0o600 {
		t.Errorf("streamed upload on host: %v %v", fi, err)
	}
	e.assertNoTemp()
}
