package node

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/cubicle-dev/cubicle/internal/testenv"
	"github.com/cubicle-dev/cubicle/internal/volume"
	"github.com/cubicle-dev/cubicle/internal/volume/local"
)

func newTestVolumes(t *testing.T) (*volumes, *local.Plugin, string) {
	t.Helper()
	testenv.RequireRoot(t, "the local plugin bind-mounts")
	dir := t.TempDir()
	base := filepath.Join(dir, "base")
	os.MkdirAll(base, 0o755)
	p := local.New(filepath.Join(dir, "data"))
	v := &volumes{dir: filepath.Join(dir, "refs"), baseDir: base, log: slog.Default(),
		plugins: func(d string) (volume.Node, error) {
			if d != "local" {
				return nil, volume.ErrUnknownDriver
			}
			return p, nil
		}}
	t.Cleanup(func() {
		for _, m := range mountsBelow(base) {
			t.Errorf("mount left: %s", m)
			_ = syscall.Unmount(m, syscall.MNT_DETACH)
		}
	})
	return v, p, base
}

// The refcount handed to the plugin is the number of other durable refs,
// so the backend is mounted once and torn down with the last holder.
func TestVolumeRefcounts(t *testing.T) {
	ctx := context.Background()
	v, p, base := newTestVolumes(t)
	if _, err := p.Create(ctx, volume.CreateRequest{VolumeID: "vol1", Name: "vol1"}); err != nil {
		t.Fatal(err)
	}
	att := VolumeAttachment{VolumeID: "vol1", Driver: "local", Path: "/data"}
	a, err := v.attach(ctx, "sandbox-a", HolderSandbox, att)
	if err != nil {
		t.Fatal(err)
	}
	b, err := v.attach(ctx, "sandbox-b", HolderSandbox, att)
	if err != nil || b != a {
		t.Fatalf("second holder: %q %v, want %q", b, err, a)
	}
	if again, err := v.attach(ctx, "sandbox-a", HolderSandbox, att); err != nil || again != a {
		t.Fatalf("re-attach of the same holder must be a no-op: %q %v", again, err)
	}
	refs, _ := v.list()
	if len(refs) != 2 || refs[0].State != RefAttached || refs[0].Metadata["mount_dir"] != a {
		t.Fatalf("refs: %+v", refs)
	}
	if len(mountsBelow(base)) != 1 {
		t.Fatalf("want one mount, got %v", mountsBelow(base))
	}
	if err := v.detach(ctx, "sandbox-a", "vol1"); err != nil {
		t.Fatal(err)
	}
	if len(mountsBelow(base)) != 1 {
		t.Fatal("mount torn down while sandbox-b still holds it")
	}
	if err := v.detachHolder(ctx, "sandbox-b"); err != nil {
		t.Fatal(err)
	}
	if m := mountsBelow(base); len(m) != 0 {
		t.Fatalf("mount left after the last detach: %v", m)
	}
	if refs, _ := v.list(); len(refs) != 0 {
		t.Fatalf("refs left: %+v", refs)
	}
	if err := v.detach(ctx, "sandbox-b", "vol1"); err != nil {
		t.Fatalf("detach of an unknown ref must be a no-op: %v", err)
	}
	if _, err := v.attach(ctx, "sandbox-c", HolderSandbox, VolumeAttachment{VolumeID: "vol1", Driver: "nfs"}); err == nil {
		t.Fatal("attach with an unregistered driver succeeded")
	}
	if _, err := v.attach(ctx, "sandbox-c", HolderSandbox, VolumeAttachment{VolumeID: "../etc", Driver: "local"}); err == nil {
		t.Fatal("attach with a path-like volume ID succeeded")
	}
}

// A ref left in "attaching" by a crash is undone before the holder attaches again.
func TestVolumeAttachingRefRecovered(t *testing.T) {
	ctx := context.Background()
	v, p, base := newTestVolumes(t)
	p.Create(ctx, volume.CreateRequest{VolumeID: "vol2", Name: "vol2"})
	// The crash: the plugin mounted, the process died before recording it.
	res, err := p.Attach(ctx, volume.AttachRequest{SandboxID: "sb", Namespace: volume.Namespace, VolumeID: "vol2", VolumeBaseDir: base})
	if err != nil {
		t.Fatal(err)
	}
	if err := v.write(&VolumeRef{VolumeID: "vol2", Holder: "sb", Kind: HolderSandbox, Driver: "local", State: RefAttaching}); err != nil {
		t.Fatal(err)
	}
	holders, _ := v.sandboxHolders()
	if !holders["sb"] {
		t.Fatal("an attaching ref must list its holder for recovery")
	}
	// Recovery path: detach the holder (what node Delete does).
	if err := v.detachHolder(ctx, "sb"); err != nil {
		t.Fatal(err)
	}
	if m := mountsBelow(base); len(m) != 0 {
		t.Fatalf("recovery left the mount %s (attach had returned %s)", m, res.HostPath)
	}
	// And a re-attach over a stale attaching ref works and counts from zero.
	v.write(&VolumeRef{VolumeID: "vol2", Holder: "sb2", Kind: HolderSandbox, Driver: "local", State: RefAttaching})
	hp, err := v.attach(ctx, "sb2", HolderSandbox, VolumeAttachment{VolumeID: "vol2", Driver: "local"})
	if err != nil || hp == "" {
		t.Fatalf("attach over a stale ref: %q %v", hp, err)
	}
	if refs, _ := v.list(); len(refs) != 1 || refs[0].State != RefAttached {
		t.Fatalf("refs: %+v", refs)
	}
	if err := v.detachHolder(ctx, "sb2"); err != nil {
		t.Fatal(err)
	}
}

func mountsBelow(dir string) []string {
	raw, _ := os.ReadFile("/proc/self/mountinfo")
	var out []string
	for _, line := range strings.Split(string(raw), "\n") {
		if f := strings.Fields(line); len(f) > 4 && strings.HasPrefix(f[4], dir+"/") {
			out = append(out, f[4])
		}
	}
	return out
}
