package control

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/node"
	"github.com/cubicle-dev/cubicle/internal/nodeset"
	"github.com/cubicle-dev/cubicle/internal/secret"
	"github.com/cubicle-dev/cubicle/internal/store"
)

// upstreamNode runs an egress proxy and lets every upstream address pass.
type upstreamNode struct{ *fakeNode }

func (n upstreamNode) Info(ctx context.Context) (node.Info, error) {
	info, err := n.fakeNode.Info(ctx)
	info.Abilities.EnforcesDomains, info.Abilities.EgressProxy = true, true
	return info, err
}
func (upstreamNode) CheckUpstream(context.Context, string) error { return nil }

// An egress proxy's password is sealed in the sandbox row with the
// secrets key and opened only for the node.
func TestEgressProxyPasswordSealedAtRest(t *testing.T) {
	m, fn, st := newPoolManager(t)
	m.nodes = nodeset.Single("local", upstreamNode{fn})
	key := make([]byte, secret.KeySize)
	sec, err := secret.New(st, key)
	if err != nil {
		t.Fatal(err)
	}
	m.cfg.Sealer = sec
	ctx := context.Background()
	sb, err := m.Create(ctx, CreateOptions{TemplateID: "tpl", TeamID: store.DefaultTeamID, Timeout: time.Minute,
		Network: store.Network{AllowInternet: true, EgressProxy: &store.EgressProxy{Address: "proxy.example:1080", Username: "u", Password: "pw-one"}}})
	if err != nil {
		t.Fatal(err)
	}
	row, err := st.GetSandbox(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if ep := row.Network.EgressProxy; !ep.PasswordSealed || strings.Contains(ep.Password, "pw-one") {
		t.Fatalf("stored password %+v", ep)
	}
	fn.mu.Lock()
	got := fn.sbs[sb.ID].Policy.Upstream
	fn.mu.Unlock()
	if got == nil || got.Password != "pw-one" {
		t.Fatalf("node got upstream %+v", got)
	}
	if err := m.UpdateNetwork(ctx, sb.ID, store.Network{AllowInternet: true, EgressProxy: &store.EgressProxy{Address: "proxy.example:1080", Username: "u", Password: "pw-two"}}); err != nil {
		t.Fatal(err)
	}
	row, _ = st.GetSandbox(ctx, sb.ID)
	if ep := row.Network.EgressProxy; !ep.PasswordSealed || strings.Contains(ep.Password, "pw-two") {
		t.Fatalf("stored password after update %+v", ep)
	}
	if p := m.policyFor(row.TeamID, row.Network); p.Upstream.Password != "pw-two" {
		t.Fatalf("opened %q", p.Upstream.Password)
	}
	// A password that looks sealed is still a password.
	if err := m.UpdateNetwork(ctx, sb.ID, store.Network{AllowInternet: true, EgressProxy: &store.EgressProxy{Address: "proxy.example:1080", Username: "u", Password: "sealed:x"}}); err != nil {
		t.Fatal(err)
	}
	row, _ = st.GetSandbox(ctx, sb.ID)
	if p := m.policyFor(row.TeamID, row.Network); !row.Network.EgressProxy.PasswordSealed || p.Upstream.Password != "sealed:x" {
		t.Fatalf("a password starting with sealed: %+v %q", row.Network.EgressProxy, p.Upstream.Password)
	}
	// Bound to the team: another team's row does not open (fails closed).
	if p := m.policyFor("another-team", row.Network); p.Upstream == nil || p.Upstream.Password != "" {
		t.Fatalf("opened for another team: %+v", p.Upstream)
	}
}
