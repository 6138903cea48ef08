// Package localnode builds a real node.Local for tests (runc, its own
// bridge, address pool, nft table, cgroup parent and data dirs) and runs
// the nodetest conformance suite over it, directly or through a wrapper
// (the gRPC client over a bufconn), so every implementation of node.Node
// is tested against the same node.
package localnode

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/cubicle-dev/cubicle/internal/diskstore/diskstoretest"
	"github.com/cubicle-dev/cubicle/internal/imagecache"
	"github.com/cubicle-dev/cubicle/internal/network"
	"github.com/cubicle-dev/cubicle/internal/node"
	"github.com/cubicle-dev/cubicle/internal/node/nodetest"
	"github.com/cubicle-dev/cubicle/internal/runtime"
	"github.com/cubicle-dev/cubicle/internal/runtime/oci"
	"github.com/cubicle-dev/cubicle/internal/testenv"
	"github.com/cubicle-dev/cubicle/internal/volume"
	"github.com/cubicle-dev/cubicle/internal/volume/local"
)

var (
	agentOnce sync.Once
	agentBin  string
	agentErr  error
)

// buildAgent builds the static cubicle-agent once per test binary.
func buildAgent(t testing.TB) string {
	t.Helper()
	agentOnce.Do(func() {
		dir, err := os.MkdirTemp("/var/tmp", "cubicle-nodetest-agent-")
		if err != nil {
			agentErr = err
			return
		}
		agentBin = filepath.Join(dir, "cubicle-agent")
		cmd := exec.Command("go", "build", "-o", agentBin, "github.com/cubicle-dev/cubicle/cmd/cubicle-agent")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			agentErr = fmt.Errorf("build cubicle-agent: %v\n%s", err, out)
		}
	})
	if agentErr != nil {
		t.Fatal(agentErr)
	}
	return agentBin
}

// Main runs a test binary's tests and removes the agent binary they built;
// call it from TestMain.
func Main(m *testing.M) {
	code := m.Run()
	if agentBin != "" {
		os.RemoveAll(filepath.Dir(agentBin))
	}
	os.Exit(code)
}

// ImagesDir holds the built-in images (mini among them).
func ImagesDir() string {
	if d := os.Getenv("CUBICLE_IMAGES_DIR"); d != "" {
		return d
	}
	return "/var/lib/cubicle/images"
}

// Image is the mini image as a reference (a built-in, by name).
var Image = node.Image{Name: "mini"}

// Layers are the mini image every sandbox boots from (bash, a user).
func Layers(t testing.TB) []string {
	t.Helper()
	d := ImagesDir()
	root := filepath.Join(d, "mini", "rootfs")
	if _, err := os.Stat(filepath.Join(root, "bin", "bash")); err != nil {
		t.Fatalf("mini image missing under %s (run scripts/install or scripts/build-rootfs): %v", d, err)
	}
	return []string{root}
}

// RandHex is n random bytes in hex.
func RandHex(t testing.TB, n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

// New is a Local with real runc and its own bridge, pool, nft table,
// cgroup parent and data dirs; everything goes when the test ends.
func New(t testing.TB) (*node.Local, *local.Plugin) {
	t.Helper()
	return NewWith(t, nil)
}

// NewWith is New with images resolved by images (nil: the built-ins in
// the images dir).
func NewWith(t testing.TB, images node.ImageSource) (*node.Local, *local.Plugin) {
	t.Helper()
	return newLocal(t, images, nil)
}

// NewWithRuntime is New with the node's runc driver wrapped by wrap (a
// test that counts the node's runtime calls). A wrapper that embeds the
// driver hides its optional abilities (runtime.Snapshotter...) from the node.
func NewWithRuntime(t testing.TB, wrap func(runtime.Driver) runtime.Driver) (*node.Local, *local.Plugin) {
	t.Helper()
	return newLocal(t, nil, wrap)
}

// NewRunsc is New on gVisor (runsc), whose pauses and snapshots keep
// memory (a checkpoint).
func NewRunsc(t testing.TB) (*node.Local, *local.Plugin) {
	t.Helper()
	return newLocalOn(t, "runsc", nil, nil)
}

func newLocal(t testing.TB, images node.ImageSource, wrap func(runtime.Driver) runtime.Driver) (*node.Local, *local.Plugin) {
	t.Helper()
	return newLocalOn(t, "runc", images, wrap)
}

func newLocalOn(t testing.TB, runtimeName string, images node.ImageSource, wrap func(runtime.Driver) runtime.Driver) (*node.Local, *local.Plugin) {
	t.Helper()
	if images == nil {
		// Built-ins only: registry pulls are imagecache's own tests.
		images = &imagecache.Source{ImagesDir: ImagesDir()}
	}
	testenv.RequireRoot(t, runtimeName+", netns, nftables, mounts")
	bin := testenv.LookPath(t, runtimeName)
	agent := buildAgent(t)
	base, err := os.MkdirTemp("/var/tmp", "cubicle-nodetest-")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(base, 0o711); err != nil {
		t.Fatal(err)
	}
	tag := RandHex(t, 3)
	parent := "cubicle-nodetest-" + tag
	// Serve's default: disks are clones in a reflink store.
	disks := diskstoretest.Open(t, base)
	drv, err := oci.New(oci.Config{Runtime: runtimeName, BinaryPath: bin, StateDir: filepath.Join(base, "run"),
		SandboxDir: filepath.Join(base, "sandboxes"), CgroupParent: parent, Disks: disks})
	if err != nil {
		diskstoretest.Close(t, disks)
		os.RemoveAll(base)
		t.Fatal(err)
	}
	// The pool is a random /24 of 10.252/16. Other test processes (node's
	// and nodegrpc's suites run at once under `go test ./...`) pick theirs
	// the same way: a pool already on the host is refused before anything
	// is made, and another is drawn (a bounded number of times).
	var ncfg network.Config
	var netm *network.Linux
	for try := 0; ; try++ {
		b := make([]byte, 1)
		rand.Read(b)
		ncfg = network.Config{
			Bridge: "cbn" + tag, Pool: netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 252, b[0], 0}), 24),
			NetnsDir: filepath.Join(base, "netns"), Table: "cubicle_nodetest_" + tag, VethPrefix: "n" + tag[:2],
			MaxFlows: 2048, NewFlowRate: 100,
		}
		netm, err = network.NewLinux(ncfg)
		if err == nil || !errors.Is(err, network.ErrInvalidConfig) || try == 8 {
			break
		}
	}
	if err != nil {
		diskstoretest.Close(t, disks)
		os.RemoveAll(base)
		t.Fatal(err)
	}
	plugin := local.New(filepath.Join(base, "volumes-data"))
	var rt runtime.Driver = drv
	if wrap != nil {
		rt = wrap(drv)
	}
	n, err := node.NewLocal(node.LocalConfig{
		ID: "nodetest-" + tag, Runtime: rt, Network: netm, AgentBin: agent, SandboxDir: filepath.Join(base, "sandboxes"),
		VolumeDir: filepath.Join(base, "volume-refs"), VolumeBaseDir: filepath.Join(base, "volume-mounts"),
		VolumePlugin: func(d string) (volume.Node, error) {
			if d != "local" {
				return nil, volume.ErrUnknownDriver
			}
			return plugin, nil
		},
		VolumeDrivers: []string{"local"},
		SnapshotDir:   filepath.Join(base, "snapshots"),
		TokenDir:      filepath.Join(base, "tokens"),
		Images:        images,
	})
	t.Cleanup(func() {
		ctx := context.Background()
		if n != nil {
			if l, err := n.List(ctx); err == nil {
				for _, sb := range l {
					t.Errorf("sandbox %s left by the suite", sb.ID)
					if err := n.Delete(ctx, sb.ID); err != nil {
						t.Errorf("cleanup %s: %v", sb.ID, err)
					}
				}
			}
			if refs, err := n.VolumeRefs(ctx); err == nil && len(refs) > 0 {
				t.Errorf("volume refs left by the suite: %+v", refs)
			}
			// Snapshots are the node's to keep; their layers may be
			// mounts (clones of disks in the store).
			if ids, err := n.Snapshots(ctx); err == nil {
				for _, id := range ids {
					if err := n.DeleteSnapshot(ctx, id); err != nil {
						t.Errorf("cleanup snapshot %s: %v", id, err)
					}
				}
			}
		}
		if err := netm.Destroy(ctx); err != nil {
			t.Errorf("network destroy: %v", err)
		}
		if _, err := netlink.LinkByName(ncfg.Bridge); err == nil {
			t.Errorf("bridge %s left behind", ncfg.Bridge)
		}
		if err := oci.RemoveCgroupParent(parent); err != nil {
			t.Errorf("cleanup cgroups: %v", err)
		}
		// runsc keeps a null-netns bind mount in its --root; it is ours.
		if mps, _ := oci.MountsUnder(filepath.Join(base, "run")); len(mps) > 0 {
			for _, mp := range mps {
				if err := unix.Unmount(mp, unix.MNT_DETACH); err != nil {
					t.Errorf("cleanup state mount %s: %v", mp, err)
				}
			}
		}
		diskstoretest.Close(t, disks)
		if mps, _ := oci.MountsUnder(base); len(mps) > 0 {
			t.Errorf("mounts left under %s: %v", base, mps)
			return
		}
		os.RemoveAll(base)
	})
	if err != nil {
		t.Fatal(err)
	}
	return n, plugin
}

// NewVolume creates a fresh volume on plugin (the control plane's half of
// the "local" driver) and returns its attachment.
func NewVolume(t testing.TB, plugin *local.Plugin) node.VolumeAttachment {
	t.Helper()
	id := "vol" + RandHex(t, 6)
	if _, err := plugin.Create(context.Background(), volume.CreateRequest{VolumeID: id, Name: id}); err != nil {
		t.Fatal(err)
	}
	return node.VolumeAttachment{VolumeID: id, Driver: "local"}
}

// Conformance runs nodetest over a fresh Local per subtest, seen through
// wrap (identity for Local itself).
func Conformance(t *testing.T, wrap func(t *testing.T, l *node.Local) node.Node) {
	var plugin *local.Plugin
	nodetest.Run(t, func(t *testing.T) node.Node {
		n, p := New(t)
		plugin = p
		return wrap(t, n)
	}, nodetest.Options{
		Layers:    Layers(t),
		Snapshots: true,
		Image:     Image,
		NewVolume: func(t *testing.T) node.VolumeAttachment { return NewVolume(t, plugin) },
	})
}
