// Package clusterbuild runs template builds on a cluster's builder nodes:
// nodes joined with the label builder=true run buildkitd (`cubicle node
// run`), and a control plane without an in-process node sends each build
// with steps to one of them (docs/cluster.md, "Builds on builder nodes").
//
// The control plane reaches a builder's buildkitd only through the node's
// mTLS data plane (dataplane.BuilderTarget), and serves the build's
// session (context files, secrets, registry credentials) from its own
// process as it does for its own buildkitd. buildkitd pulls the base and
// pushes the result through the relay in its network namespace, which on
// a builder node forwards to the control plane's registry over TLS with
// the node's certificate: RegistryHost is the name that relay answers to,
// so the references the control plane writes are the same on every
// builder.
package clusterbuild

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/store"
	"github.com/cubicle-dev/cubicle/internal/template/builder"
	"github.com/cubicle-dev/cubicle/internal/template/buildkit"
)

// Label is the node label (value "true") that makes a node a builder. A
// node's labels are its join token's, so a node cannot make itself one.
const Label = "builder"

// RegistryHost is the control plane's registry as buildkitd on a builder
// node names it: the relay's address inside buildkitd's network namespace
// (which has nothing else listening), forwarded to the control plane.
const RegistryHost = "127.0.0.1:5000"

// ErrNoBuilder: no ready, uncordoned node is labelled builder=true.
var ErrNoBuilder = errdefs.New(errdefs.ErrFailedPrecondition, "no node labelled "+Label+"=true is ready to build")

// IsBuilder reports whether a node with these labels builds templates.
func IsBuilder(labels map[string]string) bool { return labels[Label] == "true" }

// Solver is a builder.Solver that runs each build on a builder node.
type Solver struct {
	// Nodes lists the registered nodes (store.NodeStore.ListNodes).
	Nodes func(ctx context.Context) ([]*store.Node, error)
	// TTL: a node whose heartbeat is older is not ready (the scheduler's
	// lease TTL).
	TTL time.Duration
	// Dial opens the builder tunnel to a node's data plane
	// (dataplane.Client.DialBuilder).
	Dial func(ctx context.Context, nodeID, dataAddr string) (net.Conn, error)
	// Grant makes the credentials of one build for the control plane's
	// registry (image.Registry.GrantBuild), valid until revoke, for
	// writing only the build's image repo:tag and resolving tags only of
	// repo and reads (the Dockerfile's images in that registry): the
	// build's session hands them to the builder's buildkitd for
	// RegistryHost.
	Grant func(repo, tag string, reads []string) (creds buildkit.Credentials, revoke func(), err error)
	// Now is the clock (default time.Now).
	Now func() time.Time

	mu   sync.Mutex
	busy map[string]int // builds in flight from this process, by node
}

var _ builder.Solver = (*Solver)(nil)

// Available is nil when a builder node is ready now, else ErrNoBuilder
// (builder.Builder refuses a build with steps up front).
func (s *Solver) Available(ctx context.Context) error {
	_, err := s.ready(ctx)
	return err
}

// ready lists the nodes a build may go to.
func (s *Solver) ready(ctx context.Context) ([]*store.Node, error) {
	if s.Dial == nil || s.Grant == nil {
		return nil, fmt.Errorf("%w: this control plane has no cluster identity to reach nodes with", ErrNoBuilder)
	}
	rows, err := s.Nodes(ctx)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	if s.Now != nil {
		now = s.Now()
	}
	var out []*store.Node
	for _, n := range rows {
		if IsBuilder(n.Labels) && !n.Cordoned && n.DataAddress != "" && now.Sub(n.HeartbeatAt) <= s.TTL {
			out = append(out, n)
		}
	}
	if len(out) == 0 {
		return nil, ErrNoBuilder
	}
	return out, nil
}

// pick chooses the ready builder with the fewest builds in flight from
// this process (ties: by ID) and counts the new one until release.
func (s *Solver) pick(ctx context.Context) (*store.Node, func(), error) {
	nodes, err := s.ready(ctx)
	if err != nil {
		return nil, nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.busy == nil {
		s.busy = map[string]int{}
	}
	sort.SliceStable(nodes, func(i, j int) bool { return s.busy[nodes[i].ID] < s.busy[nodes[j].ID] })
	n := nodes[0]
	s.busy[n.ID]++
	return n, func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.busy[n.ID]--; s.busy[n.ID] <= 0 {
			delete(s.busy, n.ID)
		}
	}, nil
}

// Solve implements builder.Solver on a builder node.
func (s *Solver) Solve(ctx context.Context, dockerfile []byte, contextDir string, noCache bool, push string, secrets map[string][]byte,
	log func(level, msg string, line int)) error {
	// The credentials write this image only, so the push must name it
	// in the control plane's registry.
	ref, ok := strings.CutPrefix(push, RegistryHost+"/")
	i := strings.LastIndex(ref, ":")
	if !ok || i <= 0 || strings.Contains(ref[i:], "/") {
		return fmt.Errorf("clusterbuild: push %q is not a repository:tag in %s", push, RegistryHost)
	}
	n, release, err := s.pick(ctx)
	if err != nil {
		return err
	}
	defer release()
	log("info", "building on node "+n.ID, 0)
	creds, revoke, err := s.Grant(ref[:i], ref[i+1:], registryRepos(dockerfile))
	if err != nil {
		return fmt.Errorf("registry credentials for the build: %w", err)
	}
	defer revoke()
	r := &buildkit.Remote{
		Dial:         func(ctx context.Context) (net.Conn, error) { return s.Dial(ctx, n.ID, n.DataAddress) },
		RegistryAuth: map[string]buildkit.Credentials{RegistryHost: creds},
	}
	_, err = r.Build(ctx, buildkit.BuildRequest{Dockerfile: dockerfile, ContextDir: contextDir, NoCache: noCache, Push: push, Secrets: secrets},
		func(l buildkit.Log) { log(l.Level, l.Message, l.Step+1) })
	if err != nil && !errors.As(err, new(*buildkit.BuildError)) && ctx.Err() == nil {
		err = fmt.Errorf("builder node %s: %w", n.ID, err)
	}
	return SolveError(err)
}

// registryRepos is the repository in the control plane's registry that
// dockerfile builds FROM, if any: the tags a build's credentials may
// resolve besides its own image's. The renderer writes FROM as the first
// line and the user's steps after it, so only the first line is read.
func registryRepos(dockerfile []byte) []string {
	line, _, _ := strings.Cut(string(dockerfile), "\n")
	f := strings.Fields(line)
	if len(f) < 2 || !strings.EqualFold(f[0], "FROM") {
		return nil
	}
	ref, ok := strings.CutPrefix(f[1], RegistryHost+"/")
	if !ok {
		return nil
	}
	if i := strings.IndexByte(ref, '@'); i >= 0 {
		ref = ref[:i]
	}
	if i := strings.LastIndexByte(ref, ':'); i >= 0 && !strings.Contains(ref[i:], "/") {
		ref = ref[:i]
	}
	if ref == "" {
		return nil
	}
	return []string{ref}
}

// SolveError gives a buildkit build error the builder's type (the
// Dockerfile line it failed at); other errors pass unchanged. The
// renderer writes one instruction per line, so BuildKit's instruction
// index k is Dockerfile line k+1.
func SolveError(err error) error {
	var be *buildkit.BuildError
	if errors.As(err, &be) {
		return &builder.SolveError{Line: be.Step + 1, Err: err}
	}
	return err
}
