package jupyter

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/agent/interp/internal/kerneltest"
)

// startKernel runs a real ipykernel on fresh ports and returns a connected
// client; both are cleaned up with the test.
func startKernel(t *testing.T) *Client {
	t.Helper()
	python := kerneltest.Python(t)
	info, err := NewConnectionInfo("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "kernel.json")
	if err := info.WriteFile(path); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("connection file mode: %v %v", fi.Mode(), err)
	}
	cmd := exec.Command(python, "-m", "ipykernel_launcher", "-f", path)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-exited
	})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	go func() {
		select {
		case <-exited:
			cancel()
		case <-ctx.Done():
		}
	}()
	c, err := Dial(ctx, info)
	if err != nil {
		select {
		case <-exited:
			t.Fatalf("kernel exited (%v): %s", cmd.ProcessState, stderr.String())
		default:
		}
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// next waits for the next message on sub.
func next(t *testing.T, sub *Subscription, pending *[]Received) Received {
	t.Helper()
	deadline := time.After(30 * time.Second)
	for len(*pending) == 0 {
		select {
		case <-sub.Ready():
			*pending = append(*pending, sub.Drain()...)
		case <-deadline:
			t.Fatal("timed out waiting for a kernel message")
		}
	}
	r := (*pending)[0]
	*pending = (*pending)[1:]
	return r
}

func TestClientTalksToRealIPyKernel(t *testing.T) {
	c := startKernel(t)

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := c.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}

	sub, err := c.Request(Shell, "execute_request", map[string]any{"code": "1+1", "silent": false, "store_history": true, "user_expressions": map[string]any{}, "allow_stdin": false, "stop_on_error": true})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	var pending []Received
	var result string
	var gotReply, idle bool
	for !(gotReply && idle) {
		r := next(t, sub, &pending)
		switch r.Msg.Header.MsgType {
		case "execute_result":
			var content struct {
				Data map[string]string `json:"data"`
			}
			if err := json.Unmarshal(r.Msg.Content, &content); err != nil {
				t.Fatal(err)
			}
			result = content.Data["text/plain"]
		case "execute_reply":
			gotReply = r.Channel == Shell
		case "status":
			idle = idle || executionState(r.Msg.Content) == "idle"
		}
		if r.Msg.Header.Session == "" || r.Msg.Header.Date == "" {
			t.Fatalf("kernel header missing session/date: %+v", r.Msg.Header)
		}
	}
	if result != "2" {
		t.Fatalf("1+1 = %q, want 2", result)
	}

	ctl, err := c.Request(Control, "kernel_info_request", struct{}{})
	if err != nil {
		t.Fatal(err)
	}
	defer ctl.Close()
	pending = nil
	for {
		if r := next(t, ctl, &pending); r.Channel == Control && r.Msg.Header.MsgType == "kernel_info_reply" {
			break
		}
	}
}

func executionState(b []byte) string {
	var v struct {
		State string `json:"execution_state"`
	}
	_ = json.Unmarshal(b, &v)
	return v.State
}
