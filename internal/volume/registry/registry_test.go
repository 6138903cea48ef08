package registry_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/volume"
	"github.com/cubicle-dev/cubicle/internal/volume/binary"
	"github.com/cubicle-dev/cubicle/internal/volume/local"
	"github.com/cubicle-dev/cubicle/internal/volume/registry"
	"github.com/cubicle-dev/cubicle/internal/volume/rpc"
)

func TestOpen(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "plugin")
	if err := os.WriteFile(bin, []byte("#!/bin/sh\necho '{\"error\":\"\"}'\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	root := filepath.Join(dir, "data")
	r, err := registry.Open([]volume.PluginConfig{
		{Name: "disk", Type: volume.TypeLocal, Root: root},
		{Name: "sh", Type: volume.TypeBinary, BinaryPath: bin, Timeout: time.Second},
		// Nothing listens there: Open must still succeed (lazy dial).
		{Name: "remote", Type: volume.TypeRPC, SocketPath: filepath.Join(dir, "none.sock")},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if r.Default() != "disk" || !slices.Equal(r.Names(), []string{"disk", "sh", "remote"}) {
		t.Errorf("default %q names %v", r.Default(), r.Names())
	}
	p, err := r.Get("disk")
	if _, ok := p.(*local.Plugin); err != nil || !ok {
		t.Errorf("disk: %T %v", p, err)
	}
	if _, err := p.Create(context.Background(), volume.CreateRequest{VolumeID: "v"}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "v")); err != nil {
		t.Errorf("local root not used: %v", err)
	}
	p, err = r.Get("sh")
	if _, ok := p.(*binary.Driver); err != nil || !ok {
		t.Errorf("sh: %T %v", p, err)
	}
	if err := p.Destroy(context.Background(), volume.DestroyRequest{VolumeID: "v"}); err != nil {
		t.Errorf("binary destroy: %v", err)
	}
	p, err = r.Get("remote")
	if _, ok := p.(*rpc.Client); err != nil || !ok {
		t.Errorf("remote: %T %v", p, err)
	}
	if err := p.Destroy(context.Background(), volume.DestroyRequest{VolumeID: "v"}); !errors.Is(err, volume.ErrPlugin) {
		t.Errorf("unreachable rpc plugin: %v", err)
	}

	_, err = r.Get("s3")
	if !errors.Is(err, volume.ErrUnknownDriver) || !strings.Contains(err.Error(), `"s3"`) || !strings.Contains(err.Error(), "disk, sh, remote") {
		t.Errorf("unknown: %v", err)
	}
	names := r.Names()
	names[0] = "changed"
	if r.Names()[0] != "disk" {
		t.Error("Names exposes internal state")
	}
}

func TestOpenInvalid(t *testing.T) {
	if _, err := registry.Open([]volume.PluginConfig{{Name: "x", Type: "ftp"}}); !errors.Is(err, volume.ErrConfig) {
		t.Errorf("got %v", err)
	}
	r, err := registry.Open(nil)
	if err != nil {
		t.Fatal(err)
	}
	if r.Default() != "" || len(r.Names()) != 0 {
		t.Error("empty registry not empty")
	}
	if _, err := r.Get(""); !errors.Is(err, volume.ErrUnknownDriver) {
		t.Errorf("got %v", err)
	}
	if err := r.Close(); err != nil {
		t.Error(err)
	}
}
