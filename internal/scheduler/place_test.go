package scheduler_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/accel"
	"github.com/cubicle-dev/cubicle/internal/scheduler"
)

func newSched(t *testing.T, cfg scheduler.Config) *scheduler.Scheduler {
	t.Helper()
	s, err := scheduler.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func node(id string, cpus, memMiB int64) scheduler.Node {
	return scheduler.Node{ID: id, Capacity: scheduler.Resources{MilliCPU: cpus * 1000, MemoryMiB: memMiB, DiskMiB: 100 << 10}}
}

func small() *scheduler.Request {
	return &scheduler.Request{TemplateID: "base", Resources: scheduler.Resources{MilliCPU: 1000, MemoryMiB: 2048, DiskMiB: 1024}}
}

func ids(cs []scheduler.Candidate) []string {
	var out []string
	for _, c := range cs {
		out = append(out, c.NodeID)
	}
	return out
}

func noFit(t *testing.T, err error) *scheduler.NoFitError {
	t.Helper()
	var nf *scheduler.NoFitError
	if !errors.As(err, &nf) || !errors.Is(err, scheduler.ErrNoFit) {
		t.Fatalf("got %v, want a *NoFitError", err)
	}
	return nf
}

// The no-fit error sums the reasons up by class, with what was needed and
// the most any node of the class had.
func TestNoFitSummarisesReasonsByClass(t *testing.T) {
	s := newSched(t, scheduler.Config{})
	a, b, c := node("a", 8, 4096), node("b", 8, 4096), node("c", 64, 1<<20)
	a.Committed.MemoryMiB = 3072 // 1024 free
	b.Committed.MemoryMiB = 3584 // 512 free
	c.Cordoned = true
	_, err := s.Place(small(), []scheduler.Node{a, b, c})
	nf := noFit(t, err)
	want := "no node can run this sandbox: 2 nodes lack memory (need 2048 MiB, most free 1024 MiB), 1 node is cordoned"
	if err.Error() != want {
		t.Fatalf("error:\n %s\nwant\n %s", err, want)
	}
	if nf.Nodes != 3 || nf.Classes[scheduler.ReasonMemory].Nodes != 2 || nf.Classes[scheduler.ReasonCordoned].Nodes != 1 {
		t.Fatalf("classes %+v", nf.Classes)
	}
	if nf.Accel != nil || errors.Is(err, accel.ErrIncompatible) {
		t.Fatalf("a resource shortage must not read as an accelerator incompatibility: %v", nf.Accel)
	}
}

func TestEachHardConstraintFilters(t *testing.T) {
	s := newSched(t, scheduler.Config{})
	base := func(id string) scheduler.Node {
		n := node(id, 8, 16384)
		n.VolumeDrivers = []string{"local", "s3"}
		return n
	}
	cases := []struct {
		name   string
		mod    func(*scheduler.Node, *scheduler.Request)
		reason scheduler.Reason
		msg    string
	}{
		{"cpu", func(n *scheduler.Node, r *scheduler.Request) { n.Committed.MilliCPU = 7500 }, scheduler.ReasonCPU, "1 node lacks CPU (need 1 CPU, most free 0.5 CPU)"},
		{"disk", func(n *scheduler.Node, r *scheduler.Request) { r.Resources.DiskMiB = 200 << 10 }, scheduler.ReasonDisk, "lacks disk (need 204800 MiB, most free 102400 MiB)"},
		{"volume driver", func(n *scheduler.Node, r *scheduler.Request) { r.VolumeDrivers = []string{"s3", "nfs"} }, scheduler.ReasonVolumeDriver, `lacks volume driver "nfs"`},
		{"pinned", func(n *scheduler.Node, r *scheduler.Request) {
			r.Pin, r.PinReason = "n2", "volume 'v' of the local driver is a directory of node n2"
		}, scheduler.ReasonPinned, "1 node is excluded (volume 'v' of the local driver is a directory of node n2)"},
		{"cordoned", func(n *scheduler.Node, r *scheduler.Request) { n.Cordoned = true }, scheduler.ReasonCordoned, "1 node is cordoned"},
		{"lease", func(n *scheduler.Node, r *scheduler.Request) { n.HeartbeatAge = time.Minute }, scheduler.ReasonLeaseExpired, "1 node is lost (no heartbeat)"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			n, req := base("n1"), small()
			if _, err := s.Place(req, []scheduler.Node{n}); err != nil {
				t.Fatalf("unmodified node refused: %v", err)
			}
			c.mod(&n, req)
			_, err := s.Place(req, []scheduler.Node{n})
			nf := noFit(t, err)
			if nf.Classes[c.reason] == nil || len(nf.Classes) != 1 {
				t.Fatalf("classes %v, want only %s", nf.Classes, c.reason)
			}
			if !strings.Contains(err.Error(), c.msg) {
				t.Fatalf("error %q does not say %q", err, c.msg)
			}
		})
	}
}

func TestCPUOvercommit(t *testing.T) {
	n := node("n1", 2, 1<<20)
	n.Committed.MilliCPU = 3000
	if _, err := newSched(t, scheduler.Config{}).Place(small(), []scheduler.Node{n}); !errors.Is(err, scheduler.ErrNoFit) {
		t.Fatalf("without overcommit a node with 3 of 2 CPUs committed took more: %v", err)
	}
	s := newSched(t, scheduler.Config{CPUOvercommit: 2})
	if _, err := s.Place(small(), []scheduler.Node{n}); err != nil {
		t.Fatalf("overcommit 2: 4 CPUs allocatable, 3 committed, 1 asked: %v", err)
	}
	n.Committed.MilliCPU = 4000
	if _, err := s.Place(small(), []scheduler.Node{n}); !errors.Is(err, scheduler.ErrNoFit) {
		t.Fatalf("overcommit beyond the ratio: %v", err)
	}
	// Memory is never overcommitted.
	m := node("m", 64, 4096)
	m.Committed.MemoryMiB = 3000
	if _, err := s.Place(small(), []scheduler.Node{m}); !errors.Is(err, scheduler.ErrNoFit) {
		t.Fatalf("memory overcommitted: %v", err)
	}
}

func TestConfigValidation(t *testing.T) {
	for _, cfg := range []scheduler.Config{
		{Strategy: "random"}, {CPUOvercommit: 0.5}, {CPUOvercommit: 1000}, {LeaseTTL: -1}, {WarmBonus: -1}, {Candidates: -2},
	} {
		if _, err := scheduler.New(cfg); !errors.Is(err, scheduler.ErrInvalid) {
			t.Errorf("config %+v: %v, want ErrInvalid", cfg, err)
		}
	}
	r := small()
	r.Resources.MemoryMiB = -1
	if _, err := newSched(t, scheduler.Config{}).Place(r, []scheduler.Node{node("n", 1, 1)}); !errors.Is(err, scheduler.ErrInvalid) {
		t.Fatalf("negative request: %v", err)
	}
}

func gpu(id, driver string, state accel.State) accel.Device {
	return accel.Device{ID: id, Class: accel.ClassGPU, Vendor: "nvidia", VendorID: "0x10de", Backend: accel.BackendPassthrough,
		DriverVersion: driver, CUDAVersion: "12.4", State: state, MemoryMB: 81920}
}

func gpuReq(n int) *scheduler.Request {
	r := small()
	r.Accelerator = &accel.Request{Class: accel.ClassGPU, Count: n}
	return r
}

func TestAcceleratorRequestsLandOnlyOnNodesWithThem(t *testing.T) {
	s := newSched(t, scheduler.Config{})
	plain1, plain2, withGPU := node("a", 64, 1<<20), node("b", 64, 1<<20), node("z", 8, 65536)
	withGPU.Accelerators = []accel.Device{gpu("gpu-0000:3b:00.0", "550.54", accel.StateAllocatable)}
	cands, err := s.Place(gpuReq(1), []scheduler.Node{plain1, plain2, withGPU})
	if err != nil {
		t.Fatal(err)
	}
	if got := ids(cands); len(got) != 1 || got[0] != "z" {
		t.Fatalf("candidates %v, want only the GPU node", got)
	}
	// A CPU-only request may still use it.
	if cands, err := s.Place(small(), []scheduler.Node{plain1, plain2, withGPU}); err != nil || len(cands) != 3 {
		t.Fatalf("cpu request: %v %v", cands, err)
	}
}

// When every node fails on accelerators, the error is the closest node's
// accel error, so the API keeps answering 400 naming the layer.
func TestAllNodesIncompatibleGivesClosestLayer(t *testing.T) {
	s := newSched(t, scheduler.Config{})
	noGPU := node("a", 64, 1<<20)     // hardware: no GPU at all
	oldDriver := node("b", 64, 1<<20) // passes hardware and backend, fails driver
	oldDriver.Accelerators = []accel.Device{gpu("gpu-0000:01:00.0", "470.10", accel.StateAllocatable)}
	amd := node("c", 64, 1<<20) // hardware: wrong vendor
	amd.Accelerators = []accel.Device{{ID: "gpu-0000:02:00.0", Class: accel.ClassGPU, Vendor: "amd", Backend: accel.BackendPassthrough, State: accel.StateAllocatable}}
	req := gpuReq(1)
	req.Contract = &accel.Contract{Class: accel.ClassGPU, Vendor: "nvidia", DriverVersion: ">=535"}
	_, err := s.Place(req, []scheduler.Node{noGPU, oldDriver, amd})
	nf := noFit(t, err)
	var ce *accel.CompatError
	if !errors.As(err, &ce) || !errors.Is(err, accel.ErrIncompatible) {
		t.Fatalf("got %v, want an accel.CompatError through the no-fit error", err)
	}
	if ce.Layer != accel.LayerDriver || ce.Stage != accel.StageScheduling || ce.Device != "gpu-0000:01:00.0" {
		t.Fatalf("closest error %+v, want node b's driver layer", ce)
	}
	if nf.Classes[scheduler.ReasonAccelIncompatible].Nodes != 3 {
		t.Fatalf("classes %+v", nf.Classes)
	}
	if !strings.Contains(err.Error(), "3 nodes have no compatible accelerator") {
		t.Fatalf("message %q", err)
	}

	// One node failing on memory instead: not every node failed on
	// accelerators, so the request is not "incompatible" everywhere.
	full := node("d", 64, 1024)
	full.Accelerators = []accel.Device{gpu("gpu-0000:04:00.0", "550.54", accel.StateAllocatable)}
	_, err = s.Place(req, []scheduler.Node{noGPU, oldDriver, amd, full})
	if nf := noFit(t, err); nf.Accel != nil || errors.Is(err, accel.ErrIncompatible) {
		t.Fatalf("with a node short of memory: %v", err)
	}
}

func TestAcceleratorsAllHeldIsNoCapacity(t *testing.T) {
	s := newSched(t, scheduler.Config{})
	busy := node("a", 64, 1<<20)
	busy.Accelerators = []accel.Device{gpu("gpu-1", "550.54", accel.StateAttached), gpu("gpu-2", "550.54", accel.StateQuarantined)}
	noGPU := node("b", 64, 1<<20)
	_, err := s.Place(gpuReq(1), []scheduler.Node{busy, noGPU})
	nf := noFit(t, err)
	if !errors.Is(err, accel.ErrNoCapacity) || errors.Is(err, accel.ErrIncompatible) {
		t.Fatalf("got %v, want accel.ErrNoCapacity (the busy node is closest)", err)
	}
	if nf.Classes[scheduler.ReasonAccelBusy].Nodes != 1 || nf.Classes[scheduler.ReasonAccelIncompatible].Nodes != 1 {
		t.Fatalf("classes %+v", nf.Classes)
	}
	// Two asked, one matching on the node: incompatible at hardware.
	free := node("c", 64, 1<<20)
	free.Accelerators = []accel.Device{gpu("gpu-3", "550.54", accel.StateAllocatable)}
	_, err = s.Place(gpuReq(2), []scheduler.Node{free})
	var ce *accel.CompatError
	if !errors.As(err, &ce) || ce.Layer != accel.LayerHardware {
		t.Fatalf("2 GPUs on a 1-GPU node: %v", err)
	}
}

func TestSpreadAndBinPack(t *testing.T) {
	empty, half, full := node("a-empty", 8, 16384), node("b-half", 8, 16384), node("c-nearly", 8, 16384)
	half.Committed = scheduler.Resources{MilliCPU: 4000, MemoryMiB: 8192}
	full.Committed = scheduler.Resources{MilliCPU: 6000, MemoryMiB: 12288}
	nodes := []scheduler.Node{half, full, empty}
	cands, err := newSched(t, scheduler.Config{Strategy: scheduler.Spread}).Place(small(), nodes)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(ids(cands), ","); got != "a-empty,b-half,c-nearly" {
		t.Fatalf("spread order %s", got)
	}
	cands, err = newSched(t, scheduler.Config{Strategy: scheduler.BinPack}).Place(small(), nodes)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(ids(cands), ","); got != "c-nearly,b-half,a-empty" {
		t.Fatalf("binpack order %s", got)
	}
}

func TestTieBreakIsDeterministicAndCandidatesBounded(t *testing.T) {
	s := newSched(t, scheduler.Config{Candidates: 3})
	var nodes []scheduler.Node
	for _, id := range []string{"n7", "n2", "n9", "n1", "n5"} {
		nodes = append(nodes, node(id, 4, 8192))
	}
	for i := 0; i < 5; i++ {
		cands, err := s.Place(small(), nodes)
		if err != nil {
			t.Fatal(err)
		}
		if got := strings.Join(ids(cands), ","); got != "n1,n2,n5" {
			t.Fatalf("equal nodes ranked %s, want by ID and at most 3", got)
		}
		nodes[0], nodes[4] = nodes[4], nodes[0] // input order must not matter
	}
}

func TestCachedImageAndWarmStandbyBonus(t *testing.T) {
	s := newSched(t, scheduler.Config{})
	a, b, c := node("a", 8, 16384), node("b", 8, 16384), node("c", 8, 16384)
	b.Templates = []string{"other", "base"}
	c.WarmStandbys = map[string]int{"base": 1}
	// a is the emptiest: without bonuses it would win.
	b.Committed = scheduler.Resources{MilliCPU: 1000, MemoryMiB: 2048}
	c.Committed = scheduler.Resources{MilliCPU: 1000, MemoryMiB: 2048}
	cands, err := s.Place(small(), []scheduler.Node{a, b, c})
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(ids(cands), ","); got != "c,b,a" {
		t.Fatalf("order %s, want warm standby, then cached image, then empty", got)
	}
	other := small()
	other.TemplateID = "unrelated"
	cands, _ = s.Place(other, []scheduler.Node{a, b, c})
	if got := strings.Join(ids(cands), ","); got != "a,b,c" {
		t.Fatalf("bonus applied to another template: %s", got)
	}
}

// Schedule is the whole decision: rank, reserve, try the next on a lost
// race. 50 concurrent creates against room for exactly 30: 30 placed, 20
// refused with a no-fit error, and no node holds more than it has.
func TestScheduleConcurrentNeverOversells(t *testing.T) {
	ctx := context.Background()
	led := scheduler.NewMemLedger()
	for _, strategy := range []scheduler.Strategy{scheduler.Spread, scheduler.BinPack} {
		t.Run(string(strategy), func(t *testing.T) {
			s := newSched(t, scheduler.Config{Strategy: strategy})
			led := scheduler.NewMemLedger()
			nodes := []scheduler.Node{node(string(strategy)+"-1", 10, 1<<20), node(string(strategy)+"-2", 12, 1<<20), node(string(strategy)+"-3", 8, 1<<20)}
			for i := range nodes {
				if err := led.SetNode(ctx, nodes[i].ID, s.Allocatable(&nodes[i])); err != nil {
					t.Fatal(err)
				}
			}
			var mu sync.Mutex
			placed := map[string]int{}
			refused := 0
			var wg sync.WaitGroup
			for g := 0; g < 50; g++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					p, err := s.Schedule(ctx, led, nodes, small(), fmt.Sprintf("sb-%d", g))
					mu.Lock()
					defer mu.Unlock()
					switch {
					case err == nil:
						placed[p.NodeID]++
					case errors.Is(err, scheduler.ErrNoFit):
						refused++
					default:
						t.Error(err)
					}
				}()
			}
			wg.Wait()
			total := 0
			for i, n := range nodes {
				if placed[n.ID] > int(n.Capacity.MilliCPU/1000) {
					t.Errorf("node %d oversold: %d sandboxes on %d CPUs", i, placed[n.ID], n.Capacity.MilliCPU/1000)
				}
				total += placed[n.ID]
			}
			if total != 30 || refused != 20 {
				t.Fatalf("%d placed, %d refused; want 30 and 20 (%v)", total, refused, placed)
			}
			c, _ := led.Committed(ctx)
			for _, n := range nodes {
				if got := c[n.ID].MilliCPU; got != int64(placed[n.ID])*1000 {
					t.Errorf("ledger has %d mCPU on %s, %d placed", got, n.ID, placed[n.ID])
				}
			}
		})
	}
	_ = led
}

// A reservation lost to a concurrent placement moves on to the next
// candidate instead of failing.
func TestScheduleTriesNextCandidate(t *testing.T) {
	ctx := context.Background()
	s := newSched(t, scheduler.Config{})
	led := scheduler.NewMemLedger()
	a, b := node("a", 4, 1<<20), node("b", 2, 1<<20)
	for _, n := range []*scheduler.Node{&a, &b} {
		if err := led.SetNode(ctx, n.ID, s.Allocatable(n)); err != nil {
			t.Fatal(err)
		}
	}
	// The ledger already knows a is full (another replica's placement)
	// though a's own report still says it is empty.
	if err := led.Reserve(ctx, "elsewhere", "a", scheduler.Resources{MilliCPU: 4000}); err != nil {
		t.Fatal(err)
	}
	p, err := s.Schedule(ctx, led, []scheduler.Node{a, b}, small(), "sb")
	if err != nil || p.NodeID != "b" {
		t.Fatalf("placement %+v, %v; want node b", p, err)
	}
	if _, err := s.Schedule(ctx, led, []scheduler.Node{a, b}, small(), "sb2"); err != nil {
		t.Fatal(err)
	}
	_, err = s.Schedule(ctx, led, []scheduler.Node{a, b}, small(), "sb3")
	if nf := noFit(t, err); nf.Classes[scheduler.ReasonCPU].Nodes != 2 {
		t.Fatalf("full cluster: %v", err)
	}
}

// A node that reports state before the ledger has its capacity is not a
// candidate: there is nothing to reserve against.
func TestScheduleSkipsNodesUnknownToTheLedger(t *testing.T) {
	ctx := context.Background()
	s := newSched(t, scheduler.Config{})
	led := scheduler.NewMemLedger()
	known, fresh := node("b-known", 2, 8192), node("a-fresh", 64, 1<<20)
	if err := led.SetNode(ctx, known.ID, s.Allocatable(&known)); err != nil {
		t.Fatal(err)
	}
	p, err := s.Schedule(ctx, led, []scheduler.Node{fresh, known}, small(), "sb")
	if err != nil || p.NodeID != "b-known" {
		t.Fatalf("placement %+v, %v; want the registered node", p, err)
	}
	_, err = s.Schedule(ctx, scheduler.NewMemLedger(), []scheduler.Node{fresh}, small(), "sb2")
	if nf := noFit(t, err); nf.Nodes != 0 || !strings.Contains(err.Error(), "no nodes are registered") {
		t.Fatalf("empty ledger: %v", err)
	}
}

// A contract that leaves the class open matches any device, as on the
// node itself: the effective request is judged by accel's rules only.
func TestContractWithoutClassMatchesAsOnTheNode(t *testing.T) {
	s := newSched(t, scheduler.Config{})
	n := node("a", 8, 16384)
	n.Accelerators = []accel.Device{gpu("gpu-1", "550.54", accel.StateAllocatable)}
	c := &accel.Contract{Vendor: "nvidia"}
	eff, err := accel.Effective(nil, c)
	if err != nil {
		t.Fatal(err)
	}
	req := small()
	req.Accelerator, req.Contract = &eff, c
	if _, err := s.Place(req, []scheduler.Node{n}); err != nil {
		t.Fatalf("class-less contract on a node with a matching GPU: %v", err)
	}
}

// The cache and warm scores hold under bin-packing too: they are added to
// the strategy's 0..1 fill score (a half-full node, 0.5, loses to an empty
// one with a standby, 0.125+0.5, and beats an empty one with the image
// cached, 0.125+0.25). A standby count of 0 earns nothing, and a policy
// score over node.cached and node.warm adds on top of both.
func TestWarmAndCachedScoresWithBinPackAndPolicies(t *testing.T) {
	s := newSched(t, scheduler.Config{Strategy: scheduler.BinPack})
	full, cached, warm, zero := node("a-full", 8, 16384), node("b-cached", 8, 16384), node("c-warm", 8, 16384), node("d-zero", 8, 16384)
	full.Committed = scheduler.Resources{MilliCPU: 3000, MemoryMiB: 6144}
	cached.Templates = []string{"base"}
	warm.WarmStandbys = map[string]int{"base": 2}
	zero.WarmStandbys = map[string]int{"base": 0}
	nodes := []scheduler.Node{zero, warm, cached, full}
	cands, err := s.Place(small(), nodes)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(ids(cands), ","); got != "c-warm,a-full,b-cached,d-zero" {
		t.Fatalf("binpack order %s, want warm, half-full, cached, and no bonus for 0 standbys", got)
	}
	// An operator who values a cached image above a warm standby says so
	// in a policy score.
	p, err := scheduler.CompilePolicy("", "(node.cached && node.warm == 0) ? 1.0 : 0.0")
	if err != nil {
		t.Fatal(err)
	}
	req := small()
	req.Policies = []*scheduler.Policy{p}
	cands, err = s.Place(req, nodes)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(ids(cands), ","); got != "b-cached,c-warm,a-full,d-zero" {
		t.Fatalf("with the policy score: %s", got)
	}
	// A filter on node.warm keeps only the nodes with a standby.
	f, err := scheduler.CompilePolicy("node.warm > 0", "")
	if err != nil {
		t.Fatal(err)
	}
	req.Policies = []*scheduler.Policy{f}
	cands, err = s.Place(req, nodes)
	if err != nil || strings.Join(ids(cands), ",") != "c-warm" {
		t.Fatalf("filter node.warm > 0: %v %v", ids(cands), err)
	}
}
