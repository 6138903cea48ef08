package nodegrpc_test

import (
	"context"
	"fmt"
	"sort"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/node"
	"github.com/cubicle-dev/cubicle/internal/node/nodetest/localnode"
	"github.com/cubicle-dev/cubicle/internal/snapstore"
)

// BenchmarkPauseMove times what a filesystem pause costs with and without
// its package, and a resume on its own node against one on another node,
// with two real runc nodes (B over gRPC) and a real S3 server (versitygw
// on loopback). Each trial writes 16 MiB of random data in a fresh
// sandbox on A, then:
//   - stop: A.Stop, the filesystem pause the control plane makes without a
//     snapshot store;
//   - package: A.Snapshot of the stopped sandbox and A.PushSnapshot through
//     presigned URLs (what the pause adds with --snapshot-store);
//   - resume-here: A.Resume (today's filesystem resume);
//   - resume-elsewhere: B.FetchSnapshot and B.Create of the same ID over
//     the package, checked for the file's digest.
//
// (Here, not in bench/, because it drives node.Local and nodegrpc
// directly, as TestCrossNodeRestoreThroughS3 does.)
//
//	go test -run '^$' -bench PauseMove -benchtime 5x ./internal/node/nodegrpc/
func BenchmarkPauseMove(b *testing.B) {
	st, na, nb, layers := twoNodes(b, localnode.New)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	phases := []string{"stop", "package", "resume-here", "resume-elsewhere"}
	took := map[string][]time.Duration{}
	b.ResetTimer()
	for range b.N {
		id := "pm" + localnode.RandHex(b, 8)
		req := node.CreateRequest{ID: id, Layers: layers, EnvdToken: "tok", DefaultUser: "user", CPUCount: 1, MemoryMB: 256, DiskSizeMB: 512}
		b.StopTimer()
		if _, err := na.Create(ctx, req); err != nil {
			b.Fatal(err)
		}
		if c, err := na.Run(ctx, id, "tok", "user", "head -c 16777216 /dev/urandom > /home/user/blob && sha256sum /home/user/blob > /home/user/blob.sum"); err != nil || c != 0 {
			b.Fatalf("write: %d %v", c, err)
		}
		b.StartTimer()
		t0 := time.Now()
		if err := na.Stop(ctx, id); err != nil {
			b.Fatal(err)
		}
		took["stop"] = append(took["stop"], time.Since(t0))
		t0 = time.Now()
		sid := "snap_" + localnode.RandHex(b, 8)
		if _, err := na.Snapshot(ctx, id, sid); err != nil {
			b.Fatal(err)
		}
		pushed := pushSnapshot(b, ctx, st, na, sid, snapstore.PartRootfs)
		took["package"] = append(took["package"], time.Since(t0))
		t0 = time.Now()
		if err := na.Resume(ctx, id, req); err != nil {
			b.Fatal(err)
		}
		took["resume-here"] = append(took["resume-here"], time.Since(t0))
		b.StopTimer()
		if err := na.Delete(ctx, id); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		t0 = time.Now()
		gets, err := st.GetURLs(ctx, sid, pushed)
		if err != nil {
			b.Fatal(err)
		}
		if err := nb.FetchSnapshot(ctx, sid, gets); err != nil {
			b.Fatal(err)
		}
		moved := req
		moved.SnapshotLayers = []string{sid}
		if _, err := nb.Create(ctx, moved); err != nil {
			b.Fatal(err)
		}
		took["resume-elsewhere"] = append(took["resume-elsewhere"], time.Since(t0))
		b.StopTimer()
		if c, err := nb.Run(ctx, id, "tok", "user", "sha256sum -c /home/user/blob.sum"); err != nil || c != 0 {
			b.Fatalf("node B's sandbox lacks the paused files: exit %d %v", c, err)
		}
		_ = nb.Delete(ctx, id)
		_ = na.DeleteSnapshot(ctx, sid)
		_ = nb.DeleteSnapshot(ctx, sid)
		_ = st.Delete(ctx, sid)
		b.StartTimer()
	}
	b.StopTimer()
	for _, p := range phases {
		d := took[p]
		sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
		q := func(f float64) time.Duration { return d[min(len(d)-1, int(f*float64(len(d))))].Round(time.Millisecond) }
		fmt.Printf("%-17s n=%d p50 %v p95 %v p99 %v\n", p, len(d), q(0.5), q(0.95), q(0.99))
	}
}
