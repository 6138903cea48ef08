package control

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/scheduler"
	"github.com/cubicle-dev/cubicle/internal/store"
)

func putPolicy(t *testing.T, st store.Store, scope store.PolicyScope, target, filter, score string) {
	t.Helper()
	p := &store.PlacementPolicy{Scope: scope, Target: target, Filter: filter, Score: score}
	if err := ValidatePlacementPolicy(context.Background(), st, p); err != nil {
		t.Fatal(err)
	}
	if err := st.PutPlacementPolicy(context.Background(), p); err != nil {
		t.Fatal(err)
	}
}

// The create path applies the template's and the team's stored policies:
// a filter that refuses the only node fails the create with the
// scheduler's no-fit error naming the filter (the API's 429), a filter
// that errors on the node names CEL's message, and nothing is created.
func TestCreateAppliesStoredPlacementPolicies(t *testing.T) {
	ctx := context.Background()
	m, n, st := newPoolManager(t)
	if err := st.RegisterNode(ctx, &store.Node{ID: "local", Labels: map[string]string{"zone": "a"}}); err != nil {
		t.Fatal(err)
	}
	if err := st.CreateTeam(ctx, &store.Team{ID: "t1", Name: "one"}); err != nil {
		t.Fatal(err)
	}
	create := func(team string) error {
		_, err := m.Create(ctx, CreateOptions{TeamID: team, TemplateID: "tpl", Timeout: time.Minute})
		return err
	}
	refused := func(team, want string) {
		t.Helper()
		before := n.count()
		err := create(team)
		if !errors.Is(err, scheduler.ErrNoFit) || !strings.Contains(err.Error(), "placement policy") || !strings.Contains(err.Error(), want) {
			t.Fatalf("create: %v; want a no-fit error naming the policy and %q", err, want)
		}
		if n.count() != before {
			t.Fatal("a refused create made a sandbox")
		}
	}

	putPolicy(t, st, store.PolicyTemplate, "tpl", `node.labels["zone"] == "b"`, "")
	refused("", `filter "node.labels[\"zone\"] == \"b\"" is false`)
	putPolicy(t, st, store.PolicyTemplate, "tpl", `node.labels["rack"] == "1"`, "")
	refused("", "no such key: rack")
	putPolicy(t, st, store.PolicyTemplate, "tpl", `node.labels["zone"] == "a" && request.template == "tpl"`, "")
	if err := create(""); err != nil {
		t.Fatalf("a filter the node passes: %v", err)
	}
	// The team's policy applies on top of the template's.
	putPolicy(t, st, store.PolicyTeam, "t1", `node.id != "local"`, "")
	refused("t1", `node.id != \"local\"`)
	if err := create(""); err != nil {
		t.Fatalf("another team is not bound by t1's policy: %v", err)
	}
	if err := st.DeletePlacementPolicy(ctx, store.PolicyTeam, "t1"); err != nil {
		t.Fatal(err)
	}
	if err := create("t1"); err != nil {
		t.Fatalf("after deleting the team's policy: %v", err)
	}
}

// A warm-pool claim skips placement, so policies are judged before it: a
// standby is not handed out on a node the policy refuses, and node.warm
// counts the template's idle standbys on the node.
func TestPoolClaimObeysPlacementPolicies(t *testing.T) {
	ctx := context.Background()
	m, _, st := newPoolManager(t)
	if err := st.CreateTeam(ctx, &store.Team{ID: "t1", Name: "one"}); err != nil {
		t.Fatal(err)
	}
	// The team's policy, so that the pool's own boots (another team's)
	// are not bound by it.
	putPolicy(t, st, store.PolicyTeam, "t1", `node.warm >= 1`, "")
	setPool(t, st, 1, "b1")
	// No standby yet: node.warm is 0 and the filter refuses the node.
	if _, err := m.Create(ctx, CreateOptions{TeamID: "t1", TemplateID: "tpl", Timeout: time.Minute}); !errors.Is(err, scheduler.ErrNoFit) {
		t.Fatalf("create with no standby and filter node.warm >= 1: %v, want no fit", err)
	}
	if err := m.reconcilePool(ctx); err != nil {
		t.Fatal(err)
	}
	if ids := standbys(t, m, "b1"); len(ids) != 1 {
		t.Fatalf("standbys %v", ids)
	}
	// One standby: node.warm is 1, and the create claims it.
	sb, err := m.Create(ctx, CreateOptions{TeamID: "t1", TemplateID: "tpl", Timeout: time.Minute})
	if err != nil {
		t.Fatalf("create with a standby: %v", err)
	}
	if ids := standbys(t, m, "b1"); len(ids) != 0 {
		t.Fatalf("the standby was not claimed (%s created): %v", sb.ID, ids)
	}
	if err := m.reconcilePool(ctx); err != nil {
		t.Fatal(err)
	}
	if ids := standbys(t, m, "b1"); len(ids) != 1 {
		t.Fatalf("refill: standbys %v", ids)
	}
	putPolicy(t, st, store.PolicyTeam, "t1", `node.id == "elsewhere"`, "")
	if _, err := m.Create(ctx, CreateOptions{TeamID: "t1", TemplateID: "tpl", Timeout: time.Minute}); !errors.Is(err, scheduler.ErrNoFit) {
		t.Fatalf("create on a refused node: %v, want no fit", err)
	}
	if ids := standbys(t, m, "b1"); len(ids) != 1 {
		t.Fatalf("a standby on a refused node was handed out: standbys %v", ids)
	}
}

// ValidatePlacementPolicy: a bad expression is the compiler's
// PolicyError; a team that does not exist, an unknown scope and an empty
// target are ErrInvalid.
func TestValidatePlacementPolicy(t *testing.T) {
	ctx := context.Background()
	_, _, st := newPoolManager(t)
	var pe *scheduler.PolicyError
	err := ValidatePlacementPolicy(ctx, st, &store.PlacementPolicy{Scope: store.PolicyTemplate, Target: "tpl", Filter: "node.cpu"})
	if !errors.As(err, &pe) || pe.Field != "filter" || !strings.Contains(err.Error(), "want bool") {
		t.Fatalf("non-bool filter: %v", err)
	}
	for _, p := range []store.PlacementPolicy{
		{Scope: store.PolicyTeam, Target: "nope", Filter: "true"},
		{Scope: "cluster", Target: "x", Filter: "true"},
		{Scope: store.PolicyTemplate, Target: "", Filter: "true"},
		{Scope: store.PolicyTemplate, Target: "a b", Filter: "true"},
	} {
		if err := ValidatePlacementPolicy(ctx, st, &p); !errors.Is(err, ErrInvalid) {
			t.Fatalf("%+v: %v, want ErrInvalid", p, err)
		}
	}
}

// In cluster mode a claim hands out only a standby on a node the
// placement policies accept: with standbys on two nodes and a team policy
// refusing the node of the oldest one (the one a claim takes first), the
// claim takes the other, and the refused node's standby stays in the pool.
func TestPoolClaimObeysPlacementPoliciesAcrossNodes(t *testing.T) {
	ctx := context.Background()
	c := newCluster(t, openSQLite(t), map[string]int{"node-a": 4, "node-b": 4})
	if err := c.st.CreateTeam(ctx, &store.Team{ID: "t1", Name: "one"}); err != nil {
		t.Fatal(err)
	}
	// One standby, then a second with the first's node cordoned: one on
	// each node.
	setPool(t, c.st, 1, "b1")
	if err := c.m.reconcilePool(ctx); err != nil {
		t.Fatal(err)
	}
	first := standbys(t, c.m, "b1")
	if len(first) != 1 {
		t.Fatalf("standbys %v", first)
	}
	firstSB, err := c.st.GetSandbox(ctx, first[0])
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.st.SetNodeFlags(ctx, firstSB.Node, true, false); err != nil {
		t.Fatal(err)
	}
	setPool(t, c.st, 2, "b1")
	if err := c.m.reconcilePool(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := c.st.SetNodeFlags(ctx, firstSB.Node, false, false); err != nil {
		t.Fatal(err)
	}
	ids := standbys(t, c.m, "b1")
	if len(ids) != 2 {
		t.Fatalf("standbys %v", ids)
	}
	oldest, err := c.st.GetSandbox(ctx, ids[0])
	if err != nil {
		t.Fatal(err)
	}
	other, err := c.st.GetSandbox(ctx, ids[1])
	if err != nil {
		t.Fatal(err)
	}
	if oldest.Node == other.Node {
		t.Fatalf("both standbys on %s", oldest.Node)
	}
	putPolicy(t, c.st, store.PolicyTeam, "t1", `node.id != "`+oldest.Node+`"`, "")
	sb, err := c.m.Create(ctx, CreateOptions{TeamID: "t1", TemplateID: "tpl", Timeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if sb.Node == oldest.Node {
		t.Fatalf("the claim placed %s on %s, which the team's policy refuses", sb.ID, sb.Node)
	}
	if sb.ID != other.ID {
		t.Fatalf("created %s instead of claiming the standby %s on the accepted node", sb.ID, other.ID)
	}
	if left := standbys(t, c.m, "b1"); len(left) != 1 || left[0] != oldest.ID {
		t.Fatalf("standbys after the claim: %v, want [%s]", left, oldest.ID)
	}
}
