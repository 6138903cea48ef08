package rpc_test

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cubicle-dev/cubicle/internal/testenv"
	"github.com/cubicle-dev/cubicle/internal/volume"
	"github.com/cubicle-dev/cubicle/internal/volume/internal/mountinfo"
	"github.com/cubicle-dev/cubicle/internal/volume/local"
	"github.com/cubicle-dev/cubicle/internal/volume/plugintest"
	"github.com/cubicle-dev/cubicle/internal/volume/rpc"
)

// serve runs rpc.Serve for p on a socket in a temp dir until the test ends.
func serve(t *testing.T, p volume.Plugin) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "plugin.sock")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- rpc.Serve(ctx, sock, p) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	// Wait for the socket to appear.
	for i := 0; ; i++ {
		if c, err := net.Dial("unix", sock); err == nil {
			c.Close()
			break
		}
		if i > 200 {
			t.Fatal("server did not start")
		}
		time.Sleep(10 * time.Millisecond)
	}
	return sock
}

func dial(t *testing.T, addr string, timeout time.Duration) *rpc.Client {
	t.Helper()
	c, err := rpc.Dial(addr, timeout)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func TestLocalOverRPC(t *testing.T) {
	testenv.RequireRoot(t, "the local plugin bind-mounts")
	root, base := t.TempDir(), t.TempDir()
	t.Cleanup(func() {
		mps, _ := mountinfo.Under(base)
		for _, mp := range mps {
			t.Errorf("left mounted: %s", mp)
			_ = unix.Unmount(mp, unix.MNT_DETACH)
		}
	})
	sock := serve(t, local.New(root))
	fi, err := os.Stat(sock)
	if err != nil || fi.Mode().Perm() != 0o660 {
		t.Errorf("socket mode: %v %v", fi, err)
	}
	for _, addr := range []string{sock, "unix://" + sock} {
		plugintest.Run(t, dial(t, addr, 10*time.Second), plugintest.Options{BaseDir: base, ProbeFiles: true})
	}
}

// failing is a plugin whose hooks fail or block, to exercise error paths
// end to end over a real gRPC connection.
type failing struct {
	block chan struct{}
}

func (f *failing) Create(context.Context, volume.CreateRequest) (volume.CreateResult, error) {
	return volume.CreateResult{}, errors.New("bucket quota exceeded")
}
func (f *failing) Destroy(context.Context, volume.DestroyRequest) error { return nil }
func (f *failing) Attach(ctx context.Context, _ volume.AttachRequest) (volume.AttachResult, error) {
	select {
	case <-f.block:
	case <-ctx.Done():
	}
	return volume.AttachResult{}, ctx.Err()
}
func (f *failing) Detach(context.Context, volume.DetachRequest) error { return nil }

func TestErrors(t *testing.T) {
	f := &failing{block: make(chan struct{})}
	defer close(f.block)
	sock := serve(t, f)
	c := dial(t, sock, time.Second)

	_, err := c.Create(context.Background(), volume.CreateRequest{VolumeID: "v"})
	if !errors.Is(err, volume.ErrPlugin) || !strings.Contains(err.Error(), "bucket quota exceeded") || !strings.Contains(err.Error(), "internal") {
		t.Errorf("create: %v", err)
	}
	if err := c.Destroy(context.Background(), volume.DestroyRequest{VolumeID: "v"}); err != nil {
		t.Errorf("destroy: %v", err)
	}

	start := time.Now()
	_, err = c.Attach(context.Background(), volume.AttachRequest{VolumeID: "v"})
	if !errors.Is(err, volume.ErrPluginTimeout) {
		t.Errorf("blocked attach: got %v, want ErrPluginTimeout", err)
	}
	if d := time.Since(start); d < 900*time.Millisecond || d > 3*time.Second {
		t.Errorf("blocked attach returned after %s, want ~1s", d)
	}

	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(100*time.Millisecond, cancel)
	if _, err := c.Attach(ctx, volume.AttachRequest{VolumeID: "v"}); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled attach: %v", err)
	}
}

func TestNobodyListening(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "absent.sock")
	c := dial(t, sock, 30*time.Second)
	start := time.Now()
	_, err := c.Create(context.Background(), volume.CreateRequest{VolumeID: "v"})
	if !errors.Is(err, volume.ErrPlugin) || !strings.Contains(err.Error(), sock) || !strings.Contains(err.Error(), "unavailable") {
		t.Errorf("got %v", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("took %s; must fail fast, not wait for the timeout", d)
	}

	// A plugin that starts after the client was made is picked up.
	f := &failing{block: make(chan struct{})}
	defer close(f.block)
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- rpc.Serve(ctx, sock, f) }()
	defer func() { stop(); <-done }()
	deadline := time.Now().Add(5 * time.Second)
	for {
		err := c.Destroy(context.Background(), volume.DestroyRequest{VolumeID: "v"})
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("late plugin never reached: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func TestServeSocketFile(t *testing.T) {
	dir := t.TempDir()
	// A stale socket (no listener) is replaced.
	stale := filepath.Join(dir, "stale.sock")
	ln, err := net.Listen("unix", stale)
	if err != nil {
		t.Fatal(err)
	}
	ln.(*net.UnixListener).SetUnlinkOnClose(false)
	ln.Close()
	serve2 := func(addr string) error {
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		return rpc.Serve(ctx, addr, &failing{})
	}
	if err := serve2(stale); err != nil {
		t.Errorf("stale socket: %v", err)
	}
	// A regular file is not deleted.
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, []byte("keep"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := serve2(file); err == nil {
		t.Error("Serve replaced a regular file")
	}
	// A live server is not displaced.
	sock := serve(t, &failing{})
	if err := serve2(sock); err == nil || !strings.Contains(err.Error(), "listening") {
		t.Errorf("second server on a live socket: %v", err)
	}
	// TCP works too.
	ctx, cancel := context.WithCancel(context.Background())
	lnTCP, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lnTCP.Addr().String()
	lnTCP.Close()
	done := make(chan error, 1)
	go func() { done <- rpc.Serve(ctx, addr, &failing{}) }()
	defer func() { cancel(); <-done }()
	c := dial(t, addr, 5*time.Second)
	deadline := time.Now().Add(5 * time.Second)
	for c.Destroy(context.Background(), volume.DestroyRequest{VolumeID: "v"}) != nil {
		if time.Now().After(deadline) {
			t.Fatal("tcp server unreachable")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestDialBadAddress(t *testing.T) {
	if _, err := rpc.Dial("not-an-address", time.Second); !errors.Is(err, volume.ErrConfig) {
		t.Errorf("got %v", err)
	}
}
