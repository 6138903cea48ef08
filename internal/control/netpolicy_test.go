package control

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/node"
	"github.com/cubicle-dev/cubicle/internal/nodeset"
	"github.com/cubicle-dev/cubicle/internal/store"
)

// A domain entry is refused by name at create and at update on a node
// without an egress proxy: accepting it would be fail-open.
func TestDomainEntriesAreRefusedByName(t *testing.T) {
	m, _, _ := newPoolManager(t)
	ctx := context.Background()
	for _, c := range []struct {
		n    store.Network
		want string
	}{
		{store.Network{AllowInternet: false, AllowOut: []string{"1.1.1.1", "pypi.org"}}, `network.allowOut[1]: "pypi.org" is a domain entry, and domain entries are not enforced yet`},
		{store.Network{AllowInternet: true, DenyOut: []string{"*.evil.test"}}, `network.denyOut[0]: "*.evil.test" is a domain entry`},
		{store.Network{AllowInternet: true, DenyOut: []string{"a.*.b"}}, `network.denyOut[0]: "a.*.b" is not an IP, CIDR or domain name`},
	} {
		sb, err := m.Create(ctx, CreateOptions{TemplateID: "tpl", TeamID: store.DefaultTeamID, Timeout: time.Minute, Network: c.n})
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), c.want) || sb != nil {
			t.Errorf("%+v: want ErrInvalid naming %q, got %v", c.n, c.want, err)
		}
	}
	sb, err := m.Create(ctx, CreateOptions{TemplateID: "tpl", TeamID: store.DefaultTeamID, Timeout: time.Minute,
		Network: store.Network{AllowInternet: false, AllowOut: []string{"1.1.1.1"}}})
	if err != nil {
		t.Fatal(err)
	}
	err = m.UpdateNetwork(ctx, sb.ID, store.Network{AllowInternet: true, DenyOut: []string{"0.0.0.0/0", "example.com"}})
	if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), `denyOut[1]: "example.com" is a domain entry`) {
		t.Fatalf("update: %v", err)
	}
	got, err := m.Get(ctx, sb.ID)
	if err != nil || len(got.Network.AllowOut) != 1 || len(got.Network.DenyOut) != 0 || got.Network.AllowInternet {
		t.Fatalf("a refused update changed the stored policy: %+v, %v", got.Network, err)
	}
	if err := m.UpdateNetwork(ctx, sb.ID, store.Network{AllowInternet: true, DenyOut: []string{"10.0.0.0/8"}}); err != nil {
		t.Fatalf("IP-only update: %v", err)
	}
}

// enforcingNode is a node whose network manager runs the egress proxy.
type enforcingNode struct{ node.Node }

func (n enforcingNode) Info(ctx context.Context) (node.Info, error) {
	info, err := n.Node.Info(ctx)
	info.Abilities.EnforcesDomains = true
	return info, err
}

// On a node that enforces domain entries they are accepted and reach the
// node's policy; malformed ones are still refused by name.
func TestDomainEntriesAcceptedWhenEnforced(t *testing.T) {
	m, _, _ := newPoolManager(t)
	m.nodes = nodeset.Single("local", enforcingNode{m.nodes.LocalNode()})
	ctx := context.Background()
	sb, err := m.Create(ctx, CreateOptions{TemplateID: "tpl", TeamID: store.DefaultTeamID, Timeout: time.Minute,
		Network: store.Network{AllowOut: []string{"pypi.org", "*.npmjs.org"}, DenyOut: []string{"0.0.0.0/0"}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.UpdateNetwork(ctx, sb.ID, store.Network{AllowInternet: true, DenyOut: []string{"*.evil.test"}}); err != nil {
		t.Fatalf("update: %v", err)
	}
	got, err := m.Get(ctx, sb.ID)
	if err != nil || len(got.Network.DenyOut) != 1 || got.Network.DenyOut[0] != "*.evil.test" {
		t.Fatalf("stored policy %+v, %v", got.Network, err)
	}
	if err := m.UpdateNetwork(ctx, sb.ID, store.Network{AllowOut: []string{"*"}}); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "allowOut[0]") {
		t.Fatalf("bare *: %v", err)
	}
}
