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
// Placement policies: with -policies (the default) every request carries
// its team's and template's compiled CEL policies, as the control plane
// passes them (a zone filter and a free-CPU score for one team in five, a
// cached-image score for one template in four); the main run is then
// repeated without them and the ratio printed, so the policies' cost is
// measured against a baseline from the same run.
//
// -ledger picks the capacity ledger: mem (scheduler.MemLedger), sqlite (the
// store-backed ledger over a SQLite file in a temp dir) or a postgres://
// URL (the store-backed ledger over that database; its ledger tables are
// emptied first). The store-backed ledgers read every node's committed
// capacity per decision, so their runs are best kept smaller (-nodes 100
// -placements 2000 -scale "").
//
//	go run ./bench/scheduler [-nodes 1000] [-placements 10000] [-c 50] [-scale 10,100,1000,10000] [-scale-placements 2000] [-policies=true] [-ledger mem]
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/cubicle-dev/cubicle/internal/accel"
	"github.com/cubicle-dev/cubicle/internal/scheduler"
	"github.com/cubicle-dev/cubicle/internal/scheduler/storeledger"
	"github.com/cubicle-dev/cubicle/internal/store/sqlite"
)

func main() {
	nodes := flag.Int("nodes", 1000, "simulated nodes in the main run")
	placements := flag.Int("placements", 10000, "sandboxes placed in the main run")
	conc := flag.Int("c", 50, "concurrent placements")
	scale := flag.String("scale", "10,100,1000,10000", "node counts of the scaling runs (empty: none)")
	scalePlacements := flag.Int("scale-placements", 2000, "placements per scaling run")
	strategy := flag.String("strategy", "spread", "spread or binpack")
	seed := flag.Uint64("seed", 1, "random seed of the simulated cluster")
	policies := flag.Bool("policies", true, "requests carry their team's and template's placement policies")
	ledger := flag.String("ledger", "mem", "capacity ledger: mem, sqlite, or a postgres:// URL")
	flag.Parse()
	o := opts{nodes: *nodes, placements: *placements, c: *conc, scale: *scale, scalePlacements: *scalePlacements,
		strategy: scheduler.Strategy(*strategy), seed: *seed, policies: *policies, ledger: *ledger}
	if err := run(o); err != nil {
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

// policySet is the simulated cluster's stored policies, compiled once as
// the control plane's cache keeps them: one team in five keeps out of zone
// z2 and prefers free CPU, one template in four prefers cached images.
type policySet struct{ team, template *scheduler.Policy }

func newPolicySet() (policySet, error) {
	team, err := scheduler.CompilePolicy(`node.labels["zone"] != "z2"`, "node.free_cpu / 32.0")
	if err != nil {
		return policySet{}, err
	}
	tpl, err := scheduler.CompilePolicy("", "node.cached ? 0.3 : 0.0")
	if err != nil {
		return policySet{}, err
	}
	return policySet{team, tpl}, nil
}

// withPolicies returns copies of reqs carrying the policies of their team
// and template, as control's placementPolicies returns them.
func (ps policySet) withPolicies(reqs []*scheduler.Request) []*scheduler.Request {
	out := make([]*scheduler.Request, len(reqs))
	for i, r := range reqs {
		c := *r
		var team, tpl int
		fmt.Sscanf(r.TeamID, "team-%d", &team)
		fmt.Sscanf(r.TemplateID, "tpl-%d", &tpl)
		if team%5 == 0 {
			c.Policies = append(c.Policies, ps.team)
		}
		if tpl%4 == 0 {
			c.Policies = append(c.Policies, ps.template)
		}
		out[i] = &c
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
func place(s *scheduler.Scheduler, led scheduler.Ledger, nodes []scheduler.Node, reqs []*scheduler.Request, c int, release bool) (result, error) {
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

func setup(s *scheduler.Scheduler, led scheduler.Ledger, nodes []scheduler.Node, prefill bool, rng *rand.Rand) (scheduler.Ledger, error) {
	ctx := context.Background()
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

type opts struct {
	nodes, placements, c int
	scale                string
	scalePlacements      int
	strategy             scheduler.Strategy
	seed                 uint64
	policies             bool
	ledger               string
}

// ledgers makes a fresh, empty ledger of one kind per run, and removes
// what it made.
type ledgers struct {
	kind    string
	cleanup []func()
}

func (l *ledgers) new() (scheduler.Ledger, error) {
	switch l.kind {
	case "mem":
		return scheduler.NewMemLedger(), nil
	case "sqlite":
		dir, err := os.MkdirTemp("", "cubicle-bench-ledger-")
		if err != nil {
			return nil, err
		}
		st, err := sqlite.Open(filepath.Join(dir, "cubicle.db"))
		if err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
		l.cleanup = append(l.cleanup, func() { st.Close(); os.RemoveAll(dir) })
		return storeledger.New(st), nil
	}
	return nil, fmt.Errorf("-ledger %q: want mem or sqlite", l.kind)
}

func (l *ledgers) close() {
	for _, f := range l.cleanup {
		f()
	}
}

func run(o opts) error {
	s, err := scheduler.New(scheduler.Config{Strategy: o.strategy})
	if err != nil {
		return err
	}
	leds := &ledgers{kind: o.ledger}
	defer leds.close()
	ps, err := newPolicySet()
	if err != nil {
		return err
	}
	rng := rand.New(rand.NewPCG(o.seed, 2))
	nodes := cluster(o.nodes, rng)
	plain := requests(o.placements, rng)
	reqs := plain
	if o.policies {
		reqs = ps.withPolicies(plain)
	}
	mainRun := func(reqs []*scheduler.Request, what string) (result, error) {
		led, err := leds.new()
		if err != nil {
			return result{}, err
		}
		if _, err := setup(s, led, nodes, false, rng); err != nil {
			return result{}, err
		}
		r, err := place(s, led, nodes, reqs, o.c, false)
		if err != nil {
			return r, err
		}
		p50, p95, p99 := pct(r.lat)
		fmt.Printf("main run: %d nodes, %d placements, c=%d, %s, %s ledger, %s\n", o.nodes, o.placements, o.c, o.strategy, o.ledger, what)
		fmt.Printf("  placed %d, refused with no fit %d\n", r.placed, r.noFit)
		fmt.Printf("  decisions/s %.0f   latency p50 %s  p95 %s  p99 %s\n", float64(r.decisions)/r.wall.Seconds(), ms(p50), ms(p95), ms(p99))
		fmt.Printf("  oversold nodes %d   ledger/bench disagreements %d\n", r.oversold, r.mismatch)
		if r.oversold > 0 || r.mismatch > 0 {
			return r, fmt.Errorf("%d nodes oversold, %d nodes where the ledger disagrees with the placements made", r.oversold, r.mismatch)
		}
		return r, nil
	}
	what := "no placement policies"
	if o.policies {
		what = fmt.Sprintf("placement policies on %d%% of requests", 100*withPolicy(reqs)/max(len(reqs), 1))
	}
	r, err := mainRun(reqs, what)
	if err != nil {
		return err
	}
	if o.policies {
		b, err := mainRun(plain, "baseline: the same requests without policies")
		if err != nil {
			return err
		}
		fmt.Printf("  policies: decision cost ×%.2f of the baseline (%.0f vs %.0f decisions/s)\n",
			(r.wall.Seconds()/float64(r.decisions))/(b.wall.Seconds()/float64(b.decisions)),
			float64(r.decisions)/r.wall.Seconds(), float64(b.decisions)/b.wall.Seconds())
	}

	if o.scale == "" {
		return nil
	}
	var sizes []int
	for _, f := range strings.Split(o.scale, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return fmt.Errorf("-scale: bad node count %q", f)
		}
		sizes = append(sizes, n)
	}
	fmt.Printf("scaling (steady state: nodes 30-70%% full, each placement released), %d placements per size, c=%d, %s ledger, policies %v\n",
		o.scalePlacements, o.c, o.ledger, o.policies)
	var base float64
	for i, n := range sizes {
		rng := rand.New(rand.NewPCG(o.seed, uint64(n)))
		nodes := cluster(n, rng)
		led, err := leds.new()
		if err != nil {
			return err
		}
		if _, err := setup(s, led, nodes, true, rng); err != nil {
			return err
		}
		reqs := requests(o.scalePlacements, rng)
		if o.policies {
			reqs = ps.withPolicies(reqs)
		}
		r, err := place(s, led, nodes, reqs, o.c, true)
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
		grow := float64(n) / float64(sizes[0])
		// Linear: the cost ratio is at most the node ratio (with a
		// quarter's slack for a noisy shared machine).
		verdict := "<= linear"
		if per/base > 1.25*grow {
			verdict = "WORSE than linear"
		}
		p50, p95, p99 := pct(r.lat)
		fmt.Printf("  %6d nodes: decisions/s %8.0f  cost/decision %9.1f µs  ratio %7.2f (nodes ×%.0f) %s  p50 %s  p95 %s  p99 %s  placed %d\n",
			n, float64(r.decisions)/r.wall.Seconds(), per/1e3, per/base, grow, verdict, ms(p50), ms(p95), ms(p99), r.placed)
	}
	return nil
}

func withPolicy(reqs []*scheduler.Request) int {
	n := 0
	for _, r := range reqs {
		if len(r.Policies) > 0 {
			n++
		}
	}
	return n
}
