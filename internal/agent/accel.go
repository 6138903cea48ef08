package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/cubicle-dev/cubicle/internal/agentapi"
)

var defaultLibDirs = []string{"/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib", "/lib/x86_64-linux-gnu"}

const accelOutputMax = 64 << 10

func (a *Agent) handleAccelCheck(w http.ResponseWriter, r *http.Request) {
	var req agentapi.AccelCheckRequest
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<20)).Decode(&req); err != nil {
		writeJSONError(w, http.StatusBadRequest, "invalid accelerator check request: "+err.Error())
		return
	}
	writeJSON(w, http.StatusOK, a.runAccelCheck(r.Context(), req))
}

// runAccelCheck performs the checks in the agent's view of the system. Its
// commands run through the agent's reaper (runOutput).
func (a *Agent) runAccelCheck(ctx context.Context, req agentapi.AccelCheckRequest) agentapi.AccelCheckResponse {
	start := time.Now()
	resp := agentapi.AccelCheckResponse{Failures: []agentapi.AccelFailure{}}
	var out bytes.Buffer
	if req.Ldconfig {
		if p, err := exec.LookPath("ldconfig"); err == nil {
			b, ws, err := a.runOutput(ctx, []string{p}, accelOutputMax)
			if err == nil && ws.ExitStatus() != 0 {
				err = fmt.Errorf("exit status %d", ws.ExitStatus())
			}
			if err != nil {
				fmt.Fprintf(&out, "ldconfig: %v: %s\n", err, b)
			}
		}
	}
	for _, d := range req.Devices {
		fi, err := os.Stat(d)
		switch {
		case err != nil:
			resp.Failures = append(resp.Failures, agentapi.AccelFailure{Layer: "hardware", Detail: d + " not visible: " + err.Error()})
		case fi.Mode()&os.ModeCharDevice == 0:
			resp.Failures = append(resp.Failures, agentapi.AccelFailure{Layer: "hardware", Detail: d + " is not a character device"})
		}
	}
	dirs := req.LibDirs
	if len(dirs) == 0 {
		dirs = defaultLibDirs
	}
	for _, lib := range req.Libraries {
		found := false
		for _, dir := range dirs {
			if _, err := os.Stat(filepath.Join(dir, lib)); err == nil {
				found = true
				break
			}
		}
		if !found {
			resp.Failures = append(resp.Failures, agentapi.AccelFailure{Layer: "runtime", Detail: fmt.Sprintf("%s not found in %v", lib, dirs)})
		}
	}
	if req.Check != "" {
		timeout := time.Duration(req.TimeoutMs) * time.Millisecond
		if timeout <= 0 {
			timeout = 20 * time.Second
		}
		cctx, cancel := context.WithTimeout(ctx, timeout)
		sh := "/bin/sh"
		if _, err := os.Stat(sh); err != nil {
			sh = "bash"
		}
		b, ws, err := a.runOutput(cctx, []string{sh, "-c", req.Check}, accelOutputMax)
		timedOut := cctx.Err() != nil
		cancel()
		out.Write(b)
		if err != nil || ws.ExitStatus() != 0 {
			head := b
			if len(head) > 500 {
				head = head[:500]
			}
			switch {
			case timedOut:
				resp.Failures = append(resp.Failures, agentapi.AccelFailure{Layer: "cuda", Detail: fmt.Sprintf("%s timed out after %s: %s", req.Check, timeout, head)})
			case err != nil:
				resp.Failures = append(resp.Failures, agentapi.AccelFailure{Layer: "cuda", Detail: fmt.Sprintf("%s: %v", req.Check, err)})
			default:
				resp.Failures = append(resp.Failures, agentapi.AccelFailure{Layer: "cuda", Detail: fmt.Sprintf("%s exited %d: %s", req.Check, ws.ExitStatus(), head)})
			}
		}
	}
	resp.Output = out.String()
	resp.OK = len(resp.Failures) == 0
	resp.DurationMs = time.Since(start).Milliseconds()
	return resp
}
