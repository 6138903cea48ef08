package agent

import (
	"bytes"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/cubicle-dev/cubicle/internal/agentapi"
)

func (e *testEnv) accelCheck(body string, token string) (int, agentapi.AccelCheckResponse) {
	e.t.Helper()
	req, _ := http.NewRequest(http.MethodPost, e.srv.URL+"/cubicle/accelerators/check", bytes.NewBufferString(body))
	if token != "" {
		req.Header.Set("X-Access-Token", token)
	}
	resp, err := e.srv.Client().Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	var out agentapi.AccelCheckResponse
	json.NewDecoder(resp.Body).Decode(&out)
	return resp.StatusCode, out
}

func TestAccelCheck(t *testing.T) {
	e := newTestEnv(t, testToken)
	dev := filepath.Join(e.root, "nvidia0")
	// Same numbers as /dev/full: a real char device that exists on every host.
	if err := unix.Mknod(dev, unix.S_IFCHR|0o666, int(unix.Mkdev(1, 7))); err != nil {
		t.Fatal(err)
	}
	libs := filepath.Join(e.root, "lib")
	os.MkdirAll(libs, 0o755)
	writeFileT(t, filepath.Join(libs, "libcuda.so.1"), "elf")
	regular := filepath.Join(e.root, "plain")
	writeFileT(t, regular, "x")

	req := func(r agentapi.AccelCheckRequest) string { b, _ := json.Marshal(r); return string(b) }
	code, out := e.accelCheck(req(agentapi.AccelCheckRequest{Devices: []string{dev}, Libraries: []string{"libcuda.so.1"}, LibDirs: []string{libs}, Check: "echo gpu-ok"}), testToken)
	if code != 200 || !out.OK || len(out.Failures) != 0 || !strings.Contains(out.Output, "gpu-ok") {
		t.Fatalf("passing check: %d %+v", code, out)
	}
	code, out = e.accelCheck(req(agentapi.AccelCheckRequest{
		Devices: []string{dev, filepath.Join(e.root, "nvidia9"), regular}, Libraries: []string{"libcuda.so.1", "libnvidia-ml.so.1"},
		LibDirs: []string{libs}, Check: "echo broken; exit 3",
	}), testToken)
	layers := map[string]int{}
	for _, f := range out.Failures {
		layers[f.Layer]++
	}
	if code != 200 || out.OK || layers["hardware"] != 2 || layers["runtime"] != 1 || layers["cuda"] != 1 ||
		!strings.Contains(out.Failures[len(out.Failures)-1].Detail, "exited 3") {
		t.Fatalf("failing check: %d %+v", code, out)
	}
	_, out = e.accelCheck(req(agentapi.AccelCheckRequest{Check: "sleep 5", TimeoutMs: 200}), testToken)
	if out.OK || len(out.Failures) != 1 || !strings.Contains(out.Failures[0].Detail, "timed out") {
		t.Fatalf("timeout: %+v", out)
	}
	if code, _ := e.accelCheck(`{"devices":`, testToken); code != http.StatusBadRequest {
		t.Fatalf("bad json: %d", code)
	}
	if code, _ := e.accelCheck(`{}`, "wrong"); code != http.StatusUnauthorized {
		t.Fatalf("bad token: %d", code)
	}
}
