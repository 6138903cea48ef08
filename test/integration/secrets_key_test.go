package integration

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// serve makes the secrets key on a fresh install, but refuses to start
// when the key file is missing while the database holds secrets (a new key
// would leave every one of them unreadable), naming the key path; putting
// the key back lets it start with the secrets intact.
func TestSecretsKeyMissingRefusesStart(t *testing.T) {
	s := startServer(t)
	keyPath := filepath.Join(s.DataDir, "secrets.key")
	fi, err := os.Stat(keyPath)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("fresh install: key file %s: %v %v", keyPath, fi, err)
	}
	var sec struct {
		SecretID string `json:"secretID"`
	}
	if code := s.do("POST", "/secrets", map[string]string{"name": "kept", "value": "v"}, &sec); code != 201 {
		t.Fatalf("create secret: %d", code)
	}
	s.stop(syscall.SIGTERM)
	key, err := os.ReadFile(keyPath)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(keyPath); err != nil {
		t.Fatal(err)
	}

	// Started by hand: the harness's start fails the test when serve exits.
	// A serve that does come up (the bug) is stopped with SIGTERM, so it
	// cleans up after itself like any other.
	var out bytes.Buffer
	cmd := exec.Command(filepath.Join(binDir, "cubicle"), s.args...)
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	var waitErr error
	select {
	case waitErr = <-exited:
	case <-waitHealthy(s, 30*time.Second):
		cmd.Process.Signal(syscall.SIGTERM)
		<-exited
		t.Fatalf("serve started without the secrets key:\n%s", out.String())
	case <-time.After(time.Minute):
		cmd.Process.Signal(syscall.SIGTERM)
		<-exited
		t.Fatalf("serve neither started nor failed within a minute:\n%s", out.String())
	}
	if waitErr == nil || cmd.ProcessState.ExitCode() == 0 {
		t.Fatalf("serve exited 0 without the secrets key:\n%s", out.String())
	}
	if !strings.Contains(out.String(), keyPath) || !strings.Contains(out.String(), "does not exist") {
		t.Fatalf("the error does not name the missing key file %s:\n%s", keyPath, out.String())
	}
	if _, err := os.Stat(keyPath); !os.IsNotExist(err) {
		t.Fatalf("serve made a new key file anyway: %v", err)
	}

	if err := os.WriteFile(keyPath, key, 0o600); err != nil {
		t.Fatal(err)
	}
	s.start()
	if code := s.do("GET", "/secrets/kept", nil, nil); code != 200 {
		t.Fatalf("secret after restoring the key: %d", code)
	}
}

// waitHealthy is closed once s.URL answers /health with a 2xx; it stays
// open when it never does within d.
func waitHealthy(s *server, d time.Duration) <-chan struct{} {
	ok := make(chan struct{})
	go func() {
		for deadline := time.Now().Add(d); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
			resp, err := s.client.Get(s.URL + "/health")
			if err == nil {
				resp.Body.Close()
				if resp.StatusCode/100 == 2 {
					close(ok)
					return
				}
			}
		}
	}()
	return ok
}
