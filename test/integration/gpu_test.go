package integration

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/cubicle-dev/cubicle/internal/accel"
	"github.com/cubicle-dev/cubicle/internal/accel/acceltest"
	cubicle "github.com/cubicle-dev/cubicle/sdk/go"
)

const gpuAddr = "0000:3b:00.0"

func gpuServer(t *testing.T) (*server, *acceltest.Host) {
	t.Helper()
	acceltest.Skip(t)
	h := acceltest.NewHost(t, acceltest.GPU{Addr: gpuAddr, VendorID: "0x10de", DeviceID: "0x2330", Class: "0x030200", NUMA: 0,
		IOMMUGroup: 12, Driver: "nvidia", Minor: 0, Model: "NVIDIA H100 80GB HBM3", MemoryMB: 81559, UUID: "GPU-11111111-2222-3333-4444-555555555555"})
	// The fake tree lives in a 0700 temp dir; the sandbox's PID 1 runs as
	// root, but the bind mounts of its libraries must be reachable.
	// Only up to the temp dir: /tmp itself must stay 1777 (an unprivileged
	// buildkitd, among others, writes there).
	for d := h.Root; d != "/" && d != "." && d != filepath.Clean(os.TempDir()); d = filepath.Dir(d) {
		os.Chmod(d, 0o755)
	}
	s := startServer(t, "--accel-sysfs", h.Sysfs, "--accel-dev", h.Dev, "--accel-proc", h.Proc,
		"--nvidia-smi", filepath.Join(h.Bin, "nvidia-smi"), "--accel-lib-dir", h.Lib, "--accel-bin-dir", h.Bin,
		"--accel-release-timeout", "3s")
	return s, h
}

func (s *server) accelerators(t *testing.T) []accel.Device {
	t.Helper()
	var devs []accel.Device
	if st := s.do("GET", "/nodes/local/accelerators", nil, &devs); st != http.StatusOK {
		t.Fatalf("inventory: %d", st)
	}
	return devs
}

func (s *server) gpu(t *testing.T) accel.Device {
	t.Helper()
	devs := s.accelerators(t)
	if len(devs) != 1 {
		t.Fatalf("inventory: %+v", devs)
	}
	return devs[0]
}

func TestGPUSandboxEndToEnd(t *testing.T) {
	s, h := gpuServer(t)
	d := s.gpu(t)
	if d.ID != "gpu-"+gpuAddr || d.State != accel.StateAllocatable || d.Vendor != "nvidia" || d.DriverVersion != "550.54.15" ||
		d.Backend != accel.BackendPassthrough || d.MemoryMB != 81559 {
		t.Fatalf("discovered device: %+v", d)
	}
	// Requests no node can satisfy fail fast with 400, naming the layer.
	errShape(t, s, "POST", "/v2/sandboxes", map[string]any{"templateID": "base", "accelerators": []map[string]any{{"class": "tpu", "count": 1}}}, http.StatusBadRequest)
	errShape(t, s, "POST", "/v2/sandboxes", map[string]any{"templateID": "base", "accelerators": []map[string]any{{"class": "gpu", "count": 1, "labels": map[string]string{"vendor": "amd"}}}}, http.StatusBadRequest)
	errShape(t, s, "POST", "/v2/sandboxes", map[string]any{"templateID": "base", "accelerators": []map[string]any{{"class": "gpu", "count": 0}}}, http.StatusBadRequest)

	c := s.create(map[string]any{"templateID": "base", "accelerators": []map[string]any{{"class": "gpu", "count": 1}}})
	out := s.mustRun(c, "stat -c '%F %t:%T' /dev/nvidia0 /dev/nvidiactl; echo vis=$NVIDIA_VISIBLE_DEVICES; "+filepath.Join(h.Bin, "nvidia-smi"))
	for _, want := range []string{"character special file c3:0", "character special file c3:ff", "vis=GPU-11111111", "Driver Version: 550.54.15"} {
		if !strings.Contains(out, want) {
			t.Fatalf("inside the sandbox, want %q in:\n%s", want, out)
		}
	}
	if d := s.gpu(t); d.State != accel.StateAttached || d.SandboxID != c.SandboxID {
		t.Fatalf("after create: %+v", d)
	}
	// The only device is taken: no capacity (429), pause is refused (409),
	// and an attached device cannot be disabled (409).
	errShape(t, s, "POST", "/v2/sandboxes", map[string]any{"templateID": "base", "accelerators": []map[string]any{{"class": "gpu", "count": 1}}}, http.StatusTooManyRequests)
	errShape(t, s, "POST", "/sandboxes/"+c.SandboxID+"/pause", nil, http.StatusConflict)
	errShape(t, s, "POST", "/sandboxes/"+c.SandboxID+"/pause", map[string]bool{"memory": false}, http.StatusConflict)
	// Nor can it be snapshotted, forked or rolled back: device memory is
	// not captured (the GPU seed's non-goals).
	errShape(t, s, "POST", "/sandboxes/"+c.SandboxID+"/snapshots", map[string]any{}, http.StatusConflict)
	errShape(t, s, "POST", "/sandboxes/"+c.SandboxID+"/fork", map[string]any{"count": 1}, http.StatusConflict)
	plain := s.create(map[string]any{"templateID": "base"})
	var snap struct{ SnapshotID string }
	if st := s.do("POST", "/sandboxes/"+plain.SandboxID+"/snapshots", map[string]any{}, &snap); st != http.StatusCreated {
		t.Fatalf("snapshot of a CPU sandbox: %d", st)
	}
	errShape(t, s, "POST", "/sandboxes/"+c.SandboxID+"/rollback", map[string]string{"snapshotID": snap.SnapshotID}, http.StatusConflict)
	errShape(t, s, "POST", "/v2/sandboxes", map[string]any{"templateID": snap.SnapshotID, "accelerators": []map[string]any{{"class": "gpu", "count": 1}}}, http.StatusBadRequest)
	s.do("DELETE", "/templates/"+snap.SnapshotID, nil, nil)
	s.do("DELETE", "/sandboxes/"+plain.SandboxID, nil, nil)
	var gpuSnaps []map[string]any
	if s.do("GET", "/snapshots", nil, &gpuSnaps); len(gpuSnaps) != 0 {
		t.Fatalf("snapshots after refusals: %v", gpuSnaps)
	}
	errShape(t, s, "POST", "/nodes/local/accelerators/"+d.ID+"/disable", map[string]string{"reason": "maintenance"}, http.StatusConflict)
	cli := exec.Command(filepath.Join(binDir, "cubicle"), "gpu", "list")
	cli.Env = append(os.Environ(), "CUBICLE_API_URL="+s.URL, "CUBICLE_API_KEY="+s.Key)
	if b, err := cli.CombinedOutput(); err != nil || !strings.Contains(string(b), d.ID) || !strings.Contains(string(b), "attached") || !strings.Contains(string(b), c.SandboxID) {
		t.Fatalf("cubicle gpu list: %v\n%s", err, b)
	}

	if st := s.do("DELETE", "/sandboxes/"+c.SandboxID, nil, nil); st != http.StatusNoContent {
		t.Fatalf("kill: %d", st)
	}
	if d := s.gpu(t); d.State != accel.StateAllocatable || d.SandboxID != "" {
		t.Fatalf("after kill: %+v", d)
	}
	var evs []accel.Event
	s.do("GET", "/nodes/local/accelerators/events", nil, &evs)
	seen := map[string]bool{}
	for _, e := range evs {
		if e.Sandbox == c.SandboxID || e.Type == "deny" {
			seen[e.Type] = true
		}
	}
	for _, typ := range []string{"reserve", "attach", "release", "deny"} {
		if !seen[typ] {
			t.Fatalf("no %s event in %+v", typ, evs)
		}
	}
	// Operator actions on a free device.
	if st := s.do("POST", "/nodes/local/accelerators/"+d.ID+"/disable", map[string]string{"reason": "maintenance"}, nil); st != http.StatusOK {
		t.Fatalf("disable: %d", st)
	}
	if d := s.gpu(t); d.State != accel.StateDisabled || d.Reason != "maintenance" {
		t.Fatalf("disabled: %+v", d)
	}
	errShape(t, s, "POST", "/v2/sandboxes", map[string]any{"templateID": "base", "accelerators": []map[string]any{{"class": "gpu", "count": 1}}}, http.StatusTooManyRequests)
	if st := s.do("POST", "/nodes/local/accelerators/"+d.ID+"/enable", nil, nil); st != http.StatusOK {
		t.Fatalf("enable: %d", st)
	}
	errShape(t, s, "GET", "/nodes/other/accelerators", nil, http.StatusNotFound)
	errShape(t, s, "POST", "/nodes/local/accelerators/"+d.ID+"/explode", nil, http.StatusNotFound)
	s.requireMetrics(t, `cubicle_accelerators{class="gpu",state="allocatable"} 1`)
}

// A restart whose persisted state disagrees with the host quarantines the
// device; it returns to allocatable only through a successful recover.
func TestGPURestartQuarantine(t *testing.T) {
	s, h := gpuServer(t)
	c := s.create(map[string]any{"templateID": "base", "accelerators": []map[string]any{{"class": "gpu", "count": 1}}})
	s.stop(syscall.SIGKILL)
	h.SetDriver(gpuAddr, "") // the driver went away while the node agent was down
	s.start()
	d := s.gpu(t)
	if d.State != accel.StateQuarantined || d.Reason == "" {
		t.Fatalf("after a disagreeing restart: %+v", d)
	}
	errShape(t, s, "POST", "/v2/sandboxes", map[string]any{"templateID": "base", "accelerators": []map[string]any{{"class": "gpu", "count": 1}}}, http.StatusTooManyRequests)
	if st := s.do("DELETE", "/sandboxes/"+c.SandboxID, nil, nil); st != http.StatusNoContent {
		t.Fatalf("kill: %d", st)
	}
	if d := s.gpu(t); d.State != accel.StateQuarantined {
		t.Fatalf("a kill must not free a quarantined device: %+v", d)
	}
	if st := s.do("POST", "/nodes/local/accelerators/"+d.ID+"/recover", nil, nil); st == http.StatusOK {
		t.Fatal("recover succeeded with the driver unbound")
	}
	h.SetDriver(gpuAddr, "nvidia")
	if st := s.do("POST", "/nodes/local/accelerators/"+d.ID+"/recover", nil, nil); st != http.StatusOK {
		t.Fatalf("recover: %d", st)
	}
	c2 := s.create(map[string]any{"templateID": "base", "accelerators": []map[string]any{{"class": "gpu", "count": 1}}})
	s.mustRun(c2, "test -c /dev/nvidia0")
}

// The SDK and the CLI drive the same GPU path: a sandbox with the fake
// device through cubicle.CreateOptions.Accelerators, inventory and events
// through the SDK, and every `cubicle gpu` admin command.
func TestGPUSDKAndCLI(t *testing.T) {
	s, _ := gpuServer(t)
	ctx := context.Background()
	c := sdkClient(t, s)
	devs, err := c.ListAccelerators(ctx, "local")
	if err != nil || len(devs) != 1 || devs[0].State != "allocatable" || devs[0].Vendor != "nvidia" {
		t.Fatalf("inventory: %+v %v", devs, err)
	}
	dev := devs[0].ID
	sb, err := c.Create(ctx, cubicle.CreateOptions{Accelerators: []cubicle.AcceleratorRequest{{Class: "gpu", Count: 1, Vendor: "nvidia"}}})
	if err != nil {
		t.Fatal(err)
	}
	if res, err := sb.Commands().Run(ctx, "test -c /dev/nvidia0 && echo $NVIDIA_VISIBLE_DEVICES", nil); err != nil || !strings.HasPrefix(res.Stdout, "GPU-") {
		t.Fatalf("device inside: %+v %v", res, err)
	}
	if _, err := sb.Pause(ctx); !errors.Is(err, cubicle.ErrConflict) {
		t.Fatalf("pause a GPU sandbox: %v", err)
	}
	if _, err := c.Create(ctx, cubicle.CreateOptions{Accelerators: []cubicle.AcceleratorRequest{{Class: "gpu", Count: 1}}}); !errors.Is(err, cubicle.ErrRateLimited) {
		t.Fatalf("second GPU sandbox: %v", err)
	}
	if _, err := c.AcceleratorAction(ctx, "local", dev, cubicle.AcceleratorDisable, "busy"); !errors.Is(err, cubicle.ErrConflict) {
		t.Fatalf("disable attached: %v", err)
	}
	sb.Kill(ctx)

	cli := func(args ...string) string {
		t.Helper()
		cmd := exec.Command(filepath.Join(binDir, "cubicle"), args...)
		cmd.Env = append(os.Environ(), "CUBICLE_API_URL="+s.URL, "CUBICLE_API_KEY="+s.Key)
		b, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("cubicle %v: %v\n%s", args, err, b)
		}
		return string(b)
	}
	if out := cli("gpu", "disable", dev, "--reason", "maintenance"); !strings.Contains(out, "disabled") {
		t.Fatalf("gpu disable: %s", out)
	}
	if out := cli("gpu", "list"); !strings.Contains(out, "maintenance") {
		t.Fatalf("gpu list after disable: %s", out)
	}
	if out := cli("gpu", "enable", dev); !strings.Contains(out, "allocatable") {
		t.Fatalf("gpu enable: %s", out)
	}
	if out := cli("gpu", "events"); !strings.Contains(out, "attach") || !strings.Contains(out, sb.ID) || !strings.Contains(out, "disable") {
		t.Fatalf("gpu events: %s", out)
	}
	var listed []map[string]any
	if err := json.Unmarshal([]byte(cli("gpu", "list", "--json")), &listed); err != nil || len(listed) != 1 || listed[0]["state"] != "allocatable" {
		t.Fatalf("gpu list --json: %v %v", listed, err)
	}
	evs, err := c.AcceleratorEvents(ctx, "local", 100)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, e := range evs {
		seen[e.Type] = true
	}
	for _, typ := range []string{"reserve", "attach", "release", "deny", "disable", "enable"} {
		if !seen[typ] {
			t.Fatalf("SDK events lack %s: %+v", typ, evs)
		}
	}
}
