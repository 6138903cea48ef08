// Package phase carries a per-create trace in a context: the code on the
// create path marks the phases it runs (defer phase.Start(ctx, phase.Disk)()),
// and whoever started the trace reads their durations (the API's
// Server-Timing header, the create histogram). A context without a trace
// records nothing and costs one context lookup per mark.
package phase

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"time"
)

// The phases of a create, in path order. A phase marked more than once
// (the store is written several times) sums; a phase marked inside another
// (lock_wait inside network) is counted in both: phases overlap, and only
// total is the create's wall time.
const (
	Validate    = "validate"     // options, network policy, template resolution
	Store       = "store"        // store reads and writes on the path
	Schedule    = "schedule"     // placement (and the ledger reservation)
	LockWait    = "lock_wait"    // waiting on any lock or semaphore on the path
	Network     = "network"      // netns, veth, addresses, nftables (beside disk and rootfs)
	NetworkWait = "network_wait" // the runtime waiting for the network after its disk and rootfs
	Disk        = "disk"         // the sandbox's disk image: mkfs + loop mount
	Rootfs      = "rootfs"       // overlay mount, mount preparation, OCI spec
	Idmap       = "idmap"        // idmapped layers and staged mounts (user namespaces)
	OCIRun      = "oci_run"      // runc/runsc run --detach (create and start in one call), or runsc restore
	AgentReady  = "agent_ready"  // the agent's /health answering
	Init        = "init"         // the agent's /init
	Total       = "total"        // the whole create, as the control plane saw it
)

// Names is every phase, in path order.
var Names = []string{Validate, Store, Schedule, LockWait, Network, NetworkWait, Disk, Rootfs, Idmap, OCIRun, AgentReady, Init, Total}

// Phase is one phase's accumulated duration.
type Phase struct {
	Name     string
	Duration time.Duration
}

// Trace accumulates the phases of one create. Safe for concurrent marks.
type Trace struct {
	mu      sync.Mutex
	phases  []Phase // first-mark order
	runtime string
}

// New returns an empty trace.
func New() *Trace { return &Trace{} }

type key struct{}

// With returns ctx carrying t.
func With(ctx context.Context, t *Trace) context.Context {
	return context.WithValue(ctx, key{}, t)
}

// From returns ctx's trace, or nil.
func From(ctx context.Context) *Trace {
	t, _ := ctx.Value(key{}).(*Trace)
	return t
}

func noop() {}

// Start marks the start of phase name in ctx's trace; the returned func
// marks its end. Without a trace both do nothing.
func Start(ctx context.Context, name string) func() {
	t := From(ctx)
	if t == nil {
		return noop
	}
	start := time.Now()
	return func() { t.Add(name, time.Since(start)) }
}

// Add adds d to phase name. A nil trace ignores it.
func (t *Trace) Add(name string, d time.Duration) {
	if t == nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	for i := range t.phases {
		if t.phases[i].Name == name {
			t.phases[i].Duration += d
			return
		}
	}
	t.phases = append(t.phases, Phase{Name: name, Duration: d})
}

// Merge adds phases recorded elsewhere (a remote node's) to t.
func (t *Trace) Merge(ps []Phase) {
	for _, p := range ps {
		t.Add(p.Name, p.Duration)
	}
}

// Phases returns a copy of the recorded phases, in first-mark order.
func (t *Trace) Phases() []Phase {
	if t == nil {
		return nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]Phase, len(t.phases))
	copy(out, t.phases)
	return out
}

// SetRuntime names the runtime that booted the sandbox (the node's).
func (t *Trace) SetRuntime(name string) {
	if t == nil {
		return
	}
	t.mu.Lock()
	t.runtime = name
	t.mu.Unlock()
}

// Runtime is the name SetRuntime recorded, or "".
func (t *Trace) Runtime() string {
	if t == nil {
		return ""
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.runtime
}

// ServerTiming renders the phases as a Server-Timing header value
// (W3C Server Timing: "name;dur=<milliseconds>, ..."). Phase
// names are tokens, so nothing needs quoting.
func (t *Trace) ServerTiming() string {
	var b strings.Builder
	for i, p := range t.Phases() {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(p.Name)
		b.WriteString(";dur=")
		b.WriteString(strconv.FormatFloat(float64(p.Duration)/float64(time.Millisecond), 'f', 3, 64))
	}
	return b.String()
}
