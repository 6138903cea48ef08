// Command isolation measures what the isolation layers cost a sandbox's
// create+delete, on the runtime driver directly (no API, no agent), in one
// invocation: the baseline (no user namespace, no disk limit) and each
// variant (disk limit, user namespace, both), interleaved so that drift on
// a shared machine hits all alike. It prints p50/p95/p99 and the p50 ratio
// against the baseline.
//
//	go run ./bench/isolation [-runtime runc|runsc] [-samples 30] [-rootfs DIR] [-disk-mb 1024]
//
// Root only. Everything it creates is removed before it exits.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/cubicle-dev/cubicle/internal/runtime"
	"github.com/cubicle-dev/cubicle/internal/runtime/oci"
)

func main() {
	rt := flag.String("runtime", "runc", "runc or runsc")
	samples := flag.Int("samples", 30, "creates per variant")
	rootfs := flag.String("rootfs", "/var/lib/cubicle/images/base/rootfs", "read-only lower layer")
	diskMB := flag.Int("disk-mb", 1024, "disk limit of the limited variant (MiB)")
	flag.Parse()
	if err := run(*rt, *samples, *rootfs, *diskMB); err != nil {
		fmt.Fprintln(os.Stderr, "isolation bench:", err)
		os.Exit(1)
	}
}

func run(rt string, samples int, rootfs string, diskMB int) error {
	base, err := os.MkdirTemp("/var/tmp", "cubicle-bench-isolation-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(base)
	if err := os.Chmod(base, 0o711); err != nil { // as serve keeps its data dir
		return err
	}
	newDriver := func(userns bool) (*oci.Driver, error) {
		sub := filepath.Join(base, fmt.Sprint(userns))
		if err := os.Mkdir(sub, 0o711); err != nil {
			return nil, err
		}
		return oci.New(oci.Config{Runtime: rt, StateDir: filepath.Join(sub, "state"), SandboxDir: filepath.Join(sub, "sandboxes"),
			CgroupParent: "cubicle-bench-" + filepath.Base(base), UserNS: userns})
	}
	plain, err := newDriver(false)
	if err != nil {
		return err
	}
	ctx := context.Background()
	res := runtime.Resources{CPUCount: 1, MemoryMB: 256, PIDs: 256}
	limited := res
	limited.DiskMB = diskMB
	type variant struct {
		name string
		d    *oci.Driver
		res  runtime.Resources
	}
	variants := []variant{
		{"baseline", plain, res},
		{fmt.Sprintf("disk limit %d MiB", diskMB), plain, limited},
	}
	if rt != "runsc" {
		userns, err := newDriver(true)
		if err != nil {
			return err
		}
		variants = append(variants, variant{"user namespace", userns, res},
			variant{fmt.Sprintf("user namespace + disk %d MiB", diskMB), userns, limited})
	}
	times := make([][]time.Duration, len(variants))
	for i := 0; i < samples; i++ {
		for v, vr := range variants {
			id := fmt.Sprintf("bench%015d", i*len(variants)+v)
			start := time.Now()
			if _, err := vr.d.Create(ctx, runtime.Spec{ID: id, Layers: []string{rootfs}, Args: []string{"/bin/sleep", "60"}, Resources: vr.res}); err != nil {
				vr.d.Delete(ctx, id)
				return fmt.Errorf("%s: create: %w", vr.name, err)
			}
			if err := vr.d.Delete(ctx, id); err != nil {
				return fmt.Errorf("%s: delete: %w", vr.name, err)
			}
			times[v] = append(times[v], time.Since(start))
		}
	}
	fmt.Printf("%s create+delete, %d samples each\n", rt, samples)
	var baseP50 time.Duration
	for v, vr := range variants {
		p := percentiles(times[v])
		if v == 0 {
			baseP50 = p[0]
		}
		fmt.Printf("  %-32s p50 %7.1f ms  p95 %7.1f ms  p99 %7.1f ms  ratio(p50) %.2f\n", vr.name,
			ms(p[0]), ms(p[1]), ms(p[2]), float64(p[0])/float64(baseP50))
	}
	for _, vr := range variants {
		if err := vr.d.CheckLeaks(ctx); err != nil {
			return err
		}
	}
	return nil
}

func percentiles(ts []time.Duration) [3]time.Duration {
	s := slices.Clone(ts)
	slices.Sort(s)
	at := func(q float64) time.Duration { return s[min(len(s)-1, int(q*float64(len(s))))] }
	return [3]time.Duration{at(0.50), at(0.95), at(0.99)}
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
