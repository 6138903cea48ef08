package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A broken configuration still yields a protocol-shaped answer, so the
// caller reports the config error instead of "bad JSON".
func TestConfigErrorIsAProtocolAnswer(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "s3.json")
	if err := os.WriteFile(cfg, []byte(`{"bucket": "b"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"--config", cfg, "--op", "create", "--volume-id", "v"},
		{"--config=" + cfg, "--op", "create", "--volume-id", "v"},
	} {
		var out, errb bytes.Buffer
		code := run(args, nil, &out, &errb)
		if code == 0 {
			t.Fatalf("%v: exit 0 with an incomplete config", args)
		}
		var ans struct {
			Error       string  `json:"error"`
			PrivateData *string `json:"private_data"`
		}
		if err := json.Unmarshal(out.Bytes(), &ans); err != nil {
			t.Fatalf("%v: stdout %q is not JSON: %v", args, out.String(), err)
		}
		if !strings.Contains(ans.Error, "endpoint is required") || ans.PrivateData == nil {
			t.Errorf("%v: answer %s", args, out.String())
		}
	}
}

func TestServeConfigError(t *testing.T) {
	var out, errb bytes.Buffer
	code := run([]string{"serve", "--socket", filepath.Join(t.TempDir(), "s.sock"), "--config", "/nonexistent.json"}, nil, &out, &errb)
	if code != 1 || !strings.Contains(errb.String(), "nonexistent") {
		t.Errorf("exit %d, stderr %q", code, errb.String())
	}
}

func TestUsage(t *testing.T) {
	var out bytes.Buffer
	if code := run([]string{"--help"}, nil, &out, &out); code != 0 || !strings.Contains(out.String(), "serve") {
		t.Errorf("exit %d: %s", code, out.String())
	}
	out.Reset()
	if code := run([]string{"--op", "bogus"}, []string{"CUBICLE_S3_CONFIG=/nonexistent"}, &out, &out); code != 2 {
		t.Errorf("unknown op: exit %d", code)
	}
}
