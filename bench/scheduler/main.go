// Command scheduler is the placement simulation bench: simulated nodes
// (plain reported state, answered in-process) and sandbox placements at
// concurrency c through internal/scheduler and its in-memory ledger.
//
// The main run places -placements sandboxes on -nodes nodes without
// releasing any; the default cluster holds about 70% of them, so it fills
// up and the last creates race for the last room. It prints placement decisions per second, p50/p95/p99
// placement latency and the oversell count: the nodes whose successful
// placements (counted by the bench itself, not by the ledger) exceed what
// they can hold. Any oversell exits 1.
//
// The scaling runs then repeat the same decisions at -scale node counts in
// a steady state (nodes half full, each placement released once made) and
// print the cost per decision and its ratio to the smallest size, against
// the ratio of node counts, to show cost grows no worse than linearly.
//
//	go run ./bench/scheduler [-nodes 1000] [-placements 10000] [-c 50] [-scale 100,1000,10000] [-scale-placements 2000]
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/cubicle-dev/cubicle/internal/accel"
	"github.com/cubicle-dev/cubicle/internal/scheduler"
)

func main() {
	nodes := flag.Int("nodes", 1000, "simulated nodes in the main run")
	placements := flag.Int("placements", 10000, "sandboxes placed in the main run")
	conc := flag.Int("c", 50, "concurrent placements")
	scale := flag.String("scale", "100,1000,10000", "node counts of the scaling runs (empty: none)")
	scalePlacements := flag.Int("scale-placements", 2000, "placements per scaling run")
	strategy := flag.String("strategy", "spread", "spread or binpack")
	seed := flag.Uint64("seed", 1, "random seed of the simulated cluster")
	flag.Parse()
	if err := run(*nodes, *placements, *conc, *scale, *scalePlacements, scheduler.Strategy(*strategy), *seed); err != nil {
		fmt.Fprintln(os.Stderr, "scheduler bench:", err)
		os.Exit(1)
	}
}

const templates = 40

// cluster builds n heterogeneous nodes: sizes from 4 to 32 CPUs, three
// zones, a few cordoned or lost, one in twenty with GPUs, cached images
// and warm standbys spread around.
func cluster(n int, rng *rand.Rand) []scheduler.Node {
	sizes := []scheduler.Resources{
		{MilliCPU: 4000, MemoryMiB: 8 << 10, DiskMiB: 100 << 10},
		{MilliCPU: 8000, MemoryMiB: 16 << 10, DiskMiB: 200 << 10},
		{MilliCPU: 16000, MemoryMiB: 32 << 10, DiskMiB: 400 << 10},
		{MilliCPU: 32000, MemoryMiB: 64 << 10, DiskMiB: 800 << 10},
	}
	out := make([]scheduler.Node, n)
	for i := range out {
		nd := scheduler.Node{
			ID:            fmt.Sprintf("node-%05d", i),
			Labels:        map[string]string{"zone": fmt.Sprintf("z%d", i%3), "disk": []string{"ssd", "hdd"}[rng.IntN(2)]},
			Capacity:      sizes[rng.IntN(len(sizes))],
			VolumeDrivers: []string{"local"},
			WarmStandbys:  map[string]int{},
		}
		if rng.IntN(4) == 0 {
			nd.VolumeDrivers = append(nd.VolumeDrivers, "s3")
		}
		switch r := rng.IntN(100); {
		case r < 3:
			nd.Cordoned = true
		case r < 4:
			nd.HeartbeatAge = time.Minute
		}
		for t := 0; t < templates; t++ {
			if rng.IntN(5) == 0 {
				nd.Templates = append(nd.Templates, fmt.Sprintf("tpl-%d", t))
			}
		}
		if rng.IntN(3) == 0 {
			nd.WarmStandbys[fmt.Sprintf("tpl-%d", rng.IntN(templates))] = 1 + rng.IntN(3)
		}
		if i%20 == 0 {
			for g := 0; g < 1+rng.IntN(8); g++ {
				nd.Accelerators = append(nd.Accelerators, accel.Device{ID: fmt.Sprintf("gpu-0000:%02x:00.0", g), Class: accel.ClassGPU,
					Vendor: "nvidia", VendorID: "0x10de", Backend: accel.BackendPassthrough, DriverVersion: "550.54", CUDAVersion: "12.4",
					MemoryMB: 81920, State: accel.StateAllocatable})
			}
		}
		out[i] = nd
	}
	return out
}

// requests draws sandbox shapes: mostly small, some large, 2% GPU, 10% on
// an s3 volume.
func requests(n int, rng *rand.Rand) []*scheduler.Request {
	shapes := []scheduler.Resources{
		{MilliCPU: 1000, MemoryMiB: 1024, DiskMiB: 2048},
		{MilliCPU: 2000, MemoryMiB: 2048, DiskMiB: 4096},
		{MilliCPU: 2000, MemoryMiB: 4096, DiskMiB: 8192},
		{MilliCPU: 8000, MemoryMiB: 16384, DiskMiB: 20480},
	}
	mix := []int{0, 0, 0, 0, 0, 1, 1, 1, 2, 3} // half small, one in ten large
	contract := &accel.Contract{Class: accel.ClassGPU, Vendor: "nvidia", DriverVersion: ">=535"}
	out := make([]*scheduler.Request, n)
	for i := range out {
		r := &scheduler.Request{TeamID: fmt.Sprintf("team-%d", rng.IntN(50)), TemplateID: fmt.Sprintf("tpl-%d", rng.IntN(templates)),
			Resources: shapes[mix[rng.IntN(len(mix))]]}
		if rng.IntN(50) == 0 {
			r.Accelerator = &accel.Request{Class: accel.ClassGPU, Count: 1}
			r.Contract = contract
		}
		if rng.IntN(10) == 0 {
			r.VolumeDrivers = []string{"s3"}
		}
		out[i] = r
	}
	return out
}

type result struct {
	wall      time.Duration
	lat       []time.Duration
	placed    int
	noFit     int
	oversold  int
	mismatch  int
	decisions int
}

// place runs reqs through s at concurrency c. release frees every
// placement once made (steady state); otherwise the cluster fills.
func place(s *scheduler.Scheduler, led *scheduler.MemLedger, nodes []scheduler.Node, reqs []*scheduler.Request, c int, release bool) (result, error) {
	ctx := context.Background()
	var (
		mu     sync.Mutex
		res    = result{decisions: len(reqs), lat: make([]time.Duration, 0, len(reqs))}
		tally  = map[string]scheduler.Resources{}
		runErr error
		next   = make(chan int)
		wg     sync.WaitGroup
	)
	start := time.Now()
	for w := 0; w < c; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				id := "sb-" + strconv.Itoa(i)
				t0 := time.Now()
				p, err := s.Schedule(ctx, led, nodes, reqs[i], id)
				d := time.Since(t0)
				if err == nil && release {
					err = led.Release(ctx, id)
				}
				mu.Lock()
				res.lat = append(res.lat, d)
				switch {
				case err == nil:
					res.placed++
					if !release {
						tally[p.NodeID] = tally[p.NodeID].Add(reqs[i].Resources)
					}
				case errors.Is(err, scheduler.ErrNoFit):
					res.noFit++
				default:
					runErr = err
				}
				mu.Unlock()
			}
		}()
	}
	for i := range reqs {
		next <- i
	}
	close(next)
	wg.Wait()
	res.wall = time.Since(start)
	if runErr != nil {
		return res, runErr
	}
	committed, err := led.Committed(ctx)
	if err != nil {
		return res, err
	}
	for i := range nodes {
		n := &nodes[i]
		if !tally[n.ID].Fits(s.Allocatable(n)) {
			res.oversold++
		}
		if !release && committed[n.ID] != tally[n.ID] {
			res.mismatch++
		}
	}
	return res, nil
}

func setup(s *scheduler.Scheduler, nodes []scheduler.Node, prefill bool, rng *rand.Rand) (*scheduler.MemLedger, error) {
	ctx := context.Background()
	led := scheduler.NewMemLedger()
	for i := range nodes {
		a := s.Allocatable(&nodes[i])
		if err := led.SetNode(ctx, nodes[i].ID, a); err != nil {
			return nil, err
		}
		if prefill {
			// Half full, in varied proportions, so ranking has work to do.
			f := 0.3 + 0.4*rng.Float64()
			r := scheduler.Resources{MilliCPU: int64(float64(a.MilliCPU) * f), MemoryMiB: int64(float64(a.MemoryMiB) * f), DiskMiB: int64(float64(a.DiskMiB) * f)}
			if err := led.Reserve(ctx, "prefill-"+nodes[i].ID, nodes[i].ID, r); err != nil {
				return nil, err
			}
		}
	}
	return led, nil
}

func pct(ts []time.Duration) (p50, p95, p99 time.Duration) {
	if len(ts) == 0 {
		return
	}
	s := slices.Clone(ts)
	slices.Sort(s)
	at := func(p float64) time.Duration { return s[min(int(p*float64(len(s))), len(s)-1)] }
	return at(0.50), at(0.95), at(0.99)
}

func ms(d time.Duration) string { return fmt.Sprintf("%.3f ms", float64(d)/1e6) }

func run(nNodes, nPlacements, c int, scale string, scalePlacements int, strategy scheduler.Strategy, seed uint64) error {
	s, err := scheduler.New(scheduler.Config{Strategy: strategy})
	if err != nil {
		return err
	}
	rng := rand.New(rand.NewPCG(seed, 2))
	nodes := cluster(nNodes, rng)
	led, err := setup(s, nodes, false, rng)
	if err != nil {
		return err
	}
	reqs := requests(nPlacements, rng)
	r, err := place(s, led, nodes, reqs, c, false)
	if err != nil {
		return err
	}
	p50, p95, p99 := pct(r.lat)
	fmt.Printf("main run: %d nodes, %d placements, c=%d, %s\n", nNodes, nPlacements, c, strategy)
	fmt.Printf("  placed %d, refused with no fit %d\n", r.placed, r.noFit)
	fmt.Printf("  decisions/s %.0f   latency p50 %s  p95 %s  p99 %s\n", float64(r.decisions)/r.wall.Seconds(), ms(p50), ms(p95), ms(p99))
	fmt.Printf("  oversold nodes %d   ledger/bench disagreements %d\n", r.oversold, r.mismatch)
	if r.oversold > 0 || r.mismatch > 0 {
		return fmt.Errorf("%d nodes oversold, %d nodes where the ledger disagrees with the placements made", r.oversold, r.mismatch)
	}

	if scale == "" {
		return nil
	}
	var sizes []int
	for _, f := range strings.Split(scale, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return fmt.Errorf("-scale: bad node count %q", f)
		}
		sizes = append(sizes, n)
	}
	fmt.Printf("scaling (steady state: nodes 30-70%% full, each placement released), %d placements per size, c=%d\n", scalePlacements, c)
	var base float64
	for i, n := range sizes {
		rng := rand.New(rand.NewPCG(seed, uint64(n)))
		nodes := cluster(n, rng)
		led, err := setup(s, nodes, true, rng)
		if err != nil {
			return err
		}
		r, err := place(s, led, nodes, requests(scalePlacements, rng), c, true)
		if err != nil {
			return err
		}
		if r.oversold > 0 {
			return fmt.Errorf("%d nodes oversold at %d nodes", r.oversold, n)
		}
		per := float64(r.wall) / float64(r.decisions)
		if i == 0 {
			base = per
		}
		p50, p95, p99 := pct(r.lat)
		fmt.Printf("  %6d nodes: decisions/s %8.0f  cost/decision %9.1f µs  ratio %7.2f (nodes ×%.0f)  p50 %s  p95 %s  p99 %s  placed %d\n",
			n, float64(r.decisions)/r.wall.Seconds(), per/1e3, per/base, float64(n)/float64(sizes[0]), ms(p50), ms(p95), ms(p99), r.placed)
	}
	return nil
}
