package snapstore_test

import (
	"context"
	"crypto/rand"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/snapstore"
	"github.com/cubicle-dev/cubicle/internal/snapstore/snapstoretest"
)

// BenchmarkPushFetch measures moving one snapshot package between nodes
// through a real S3 server (versitygw on loopback): Push (pack, hash, PUT)
// and Fetch (GET, hash, unpack) of a 64 MiB layer of 256 files of 256 KiB
// of random data, each through presigned URLs. It prints p50/p95/p99 of
// each and the MiB/s at the p50s.
//
//	go test -run '^$' -bench PushFetch -benchtime 10x ./bench/snapstore/
func BenchmarkPushFetch(b *testing.B) {
	st, _ := snapstoretest.New(b)
	const files, size = 256, 256 << 10
	src := filepath.Join(b.TempDir(), "snap_bench")
	if err := os.MkdirAll(filepath.Join(src, snapstore.PartRootfs, "d"), 0o755); err != nil {
		b.Fatal(err)
	}
	buf := make([]byte, size)
	for i := range files {
		rand.Read(buf)
		if err := os.WriteFile(filepath.Join(src, snapstore.PartRootfs, "d", fmt.Sprint(i)), buf, 0o644); err != nil {
			b.Fatal(err)
		}
	}
	ctx := context.Background()
	var push, fetch []time.Duration
	b.ResetTimer()
	for i := range b.N {
		id := fmt.Sprintf("snap_bench%d", i)
		puts, err := st.PutURLs(ctx, id, snapstore.PartRootfs)
		if err != nil {
			b.Fatal(err)
		}
		start := time.Now()
		pushed, err := snapstore.Push(ctx, http.DefaultClient, src, puts)
		if err != nil {
			b.Fatal(err)
		}
		push = append(push, time.Since(start))
		gets, err := st.GetURLs(ctx, id, pushed)
		if err != nil {
			b.Fatal(err)
		}
		dst := filepath.Join(b.TempDir(), id)
		start = time.Now()
		if err := snapstore.Fetch(ctx, http.DefaultClient, dst, gets); err != nil {
			b.Fatal(err)
		}
		fetch = append(fetch, time.Since(start))
		b.StopTimer()
		os.RemoveAll(dst)
		if err := st.Delete(ctx, id); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
	b.StopTimer()
	if b.N == 1 {
		return // the probe round
	}
	q := func(v []time.Duration, p float64) time.Duration { return v[int(float64(len(v)-1)*p)] }
	mib := float64(files*size) / (1 << 20)
	for _, s := range []struct {
		name string
		v    []time.Duration
	}{{"push", push}, {"fetch", fetch}} {
		sort.Slice(s.v, func(i, j int) bool { return s.v[i] < s.v[j] })
		b.Logf("%-5s %.0f MiB n=%d p50=%s p95=%s p99=%s (%.0f MiB/s at p50)", s.name, mib, len(s.v), q(s.v, .5), q(s.v, .95), q(s.v, .99), mib/q(s.v, .5).Seconds())
	}
}
