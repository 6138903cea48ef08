package node

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestWriteResolvConf(t *testing.T) {
	dir := t.TempDir()
	host := filepath.Join(dir, "host")
	out := filepath.Join(dir, "out")
	os.WriteFile(host, []byte("nameserver 127.0.0.53\nnameserver ::1\nnameserver 192.0.2.10\nsearch x\n"), 0o644)
	if _, err := WriteResolvConf(host, out); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(out)
	if !strings.Contains(string(b), "nameserver 192.0.2.10\n") || strings.Contains(string(b), "127.0.0.53") || strings.Contains(string(b), "::1") {
		t.Fatalf("resolv.conf: %q", b)
	}
	os.WriteFile(host, []byte("nameserver 127.0.0.53\n"), 0o644)
	if _, err := WriteResolvConf(host, out); err != nil {
		t.Fatal(err)
	}
	b, _ = os.ReadFile(out)
	if !strings.Contains(string(b), "nameserver 1.1.1.1\n") {
		t.Fatalf("loopback-only host should fall back: %q", b)
	}
}
