package storetest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/store"
)

func runCluster(t *testing.T, open func(t *testing.T) store.Store) {
	t.Run("ClusterCAOnce", func(t *testing.T) { testClusterCAOnce(t, open(t)) })
	t.Run("JoinTokens", func(t *testing.T) { testJoinTokens(t, open(t)) })
	t.Run("JoinTokenRedeemRace", func(t *testing.T) { testJoinTokenRace(t, open(t)) })
	t.Run("JoinReservesNodeID", func(t *testing.T) { testJoinReservesNodeID(t, open(t)) })
	t.Run("JoinSameNodeIDRace", func(t *testing.T) { testJoinSameIDRace(t, open(t)) })
	t.Run("ForgetRevokes", func(t *testing.T) { testForgetRevokes(t, open(t)) })
}

func mkTokens(t *testing.T, s store.Store, now time.Time, ids ...string) {
	t.Helper()
	for _, id := range ids {
		if err := s.CreateJoinToken(context.Background(), &store.JoinToken{ID: id, SecretHash: "h-" + id, ExpiresAt: now.Add(time.Hour)}); err != nil {
			t.Fatal(err)
		}
	}
}

// testJoinReservesNodeID: a redeemed join holds its node ID before the
// node registers; a second token for it is ErrNodeExists and stays
// unused; forgetting the joined-but-unregistered ID frees it.
func testJoinReservesNodeID(t *testing.T, s store.Store) {
	ctx := context.Background()
	now := time.Now().UTC()
	mkTokens(t, s, now, "a", "b", "c")
	got, err := s.RedeemJoinToken(ctx, "a", "h-a", "n1", now)
	if err != nil || !got.NodeRevokedAt.IsZero() {
		t.Fatalf("first join = %+v, %v", got, err)
	}
	if _, err := s.RedeemJoinToken(ctx, "b", "h-b", "n1", now); !errors.Is(err, store.ErrNodeExists) {
		t.Fatalf("second token, joined ID: want ErrNodeExists, got %v", err)
	}
	if toks, err := s.ListJoinTokens(ctx); err != nil || toks[1].ID != "b" || !toks[1].UsedAt.IsZero() {
		t.Fatalf("refused token b was spent: %+v, %v", toks, err)
	}
	if at, err := s.NodeRevokedAt(ctx, "n1"); err != nil || !at.IsZero() {
		t.Fatalf("NodeRevokedAt before any forget = %v, %v", at, err)
	}
	// Never registered, but joined: forget frees the ID and revokes it.
	before := time.Now().UTC()
	if err := s.ForgetNode(ctx, "n1"); err != nil {
		t.Fatalf("forget a joined, unregistered node: %v", err)
	}
	revoked, err := s.NodeRevokedAt(ctx, "n1")
	if err != nil || revoked.Before(before.Truncate(time.Second)) || revoked.After(time.Now().UTC()) || !revoked.Equal(revoked.Truncate(time.Second)) {
		t.Fatalf("NodeRevokedAt after forget = %v, %v (forget began %v)", revoked, err, before)
	}
	if err := s.ForgetNode(ctx, "n1"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("second forget: want ErrNotFound, got %v", err)
	}
	got, err = s.RedeemJoinToken(ctx, "b", "h-b", "n1", now)
	if err != nil || !got.NodeRevokedAt.Equal(revoked) {
		t.Fatalf("re-join after forget = %+v, %v; want NodeRevokedAt %v", got, err, revoked)
	}
	// The re-join does not clear the revocation: the old certificates stay refused.
	if at, err := s.NodeRevokedAt(ctx, "n1"); err != nil || !at.Equal(revoked) {
		t.Fatalf("NodeRevokedAt after re-join = %v, %v; want %v", at, err, revoked)
	}
	if _, err := s.RedeemJoinToken(ctx, "c", "h-c", "n1", now); !errors.Is(err, store.ErrNodeExists) {
		t.Fatalf("third token after re-join: want ErrNodeExists, got %v", err)
	}
}

// testJoinSameIDRace: 8 tokens redeemed for one node ID at once, exactly
// one wins and the others stay unused.
func testJoinSameIDRace(t *testing.T, s store.Store) {
	ctx := context.Background()
	now := time.Now().UTC()
	const n = 8
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("t%d", i)
	}
	mkTokens(t, s, now, ids...)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = s.RedeemJoinToken(ctx, ids[i], "h-"+ids[i], "same", now)
		}()
	}
	wg.Wait()
	won := 0
	for _, err := range errs {
		switch {
		case err == nil:
			won++
		case !errors.Is(err, store.ErrNodeExists):
			t.Fatalf("losing join: want ErrNodeExists, got %v", err)
		}
	}
	if won != 1 {
		t.Fatalf("%d joins of one node ID succeeded, want 1", won)
	}
	toks, err := s.ListJoinTokens(ctx)
	if err != nil {
		t.Fatal(err)
	}
	used := 0
	for _, tk := range toks {
		if !tk.UsedAt.IsZero() {
			used++
		}
	}
	if used != 1 {
		t.Fatalf("%d tokens spent, want 1", used)
	}
}

// testForgetRevokes: forgetting a registered node records the revocation
// time, also for a node that registered without a join (as one joined
// before the join state existed would).
func testForgetRevokes(t *testing.T, s store.Store) {
	ctx := context.Background()
	if err := s.RegisterNode(ctx, &store.Node{ID: "old"}); err != nil {
		t.Fatal(err)
	}
	if at, err := s.NodeRevokedAt(ctx, "old"); err != nil || !at.IsZero() {
		t.Fatalf("NodeRevokedAt of a registered node = %v, %v", at, err)
	}
	if at, err := s.NodeRevokedAt(ctx, "unknown"); err != nil || !at.IsZero() {
		t.Fatalf("NodeRevokedAt of an unknown ID = %v, %v", at, err)
	}
	if joined, err := s.NodeJoined(ctx, "old"); err != nil || joined {
		t.Fatalf("NodeJoined of a node that registered without a join = %v, %v", joined, err)
	}
	if err := s.CreateJoinToken(ctx, &store.JoinToken{ID: "jt-old", SecretHash: "h", CreatedAt: time.Now(), ExpiresAt: time.Now().Add(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.RedeemJoinToken(ctx, "jt-old", "h", "joiner", time.Now()); err != nil {
		t.Fatal(err)
	}
	if joined, err := s.NodeJoined(ctx, "joiner"); err != nil || !joined {
		t.Fatalf("NodeJoined after a redeem = %v, %v", joined, err)
	}
	if err := s.ForgetNode(ctx, "joiner"); err != nil {
		t.Fatal(err)
	}
	if joined, err := s.NodeJoined(ctx, "joiner"); err != nil || joined {
		t.Fatalf("NodeJoined after a forget = %v, %v", joined, err)
	}
	before := time.Now().UTC()
	if err := s.ForgetNode(ctx, "old"); err != nil {
		t.Fatal(err)
	}
	first, err := s.NodeRevokedAt(ctx, "old")
	if err != nil || first.Before(before.Truncate(time.Second)) {
		t.Fatalf("NodeRevokedAt after forget = %v, %v", first, err)
	}
	// It registers again (a stale certificate the API would refuse): a
	// second forget moves the revocation forward, by a second at least
	// (certificate times are whole seconds), even within one second.
	if err := s.RegisterNode(ctx, &store.Node{ID: "old"}); err != nil {
		t.Fatal(err)
	}
	if err := s.ForgetNode(ctx, "old"); err != nil {
		t.Fatal(err)
	}
	if second, err := s.NodeRevokedAt(ctx, "old"); err != nil || second.Before(first.Add(time.Second)) {
		t.Fatalf("second forget: NodeRevokedAt = %v, %v; first was %v", second, err, first)
	}
}

// testClusterCAOnce: replicas racing to store the first CA all get the
// same one back, and it stays.
func testClusterCAOnce(t *testing.T, s store.Store) {
	ctx := context.Background()
	if _, err := s.ClusterCA(ctx); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("no CA yet: want ErrNotFound, got %v", err)
	}
	const n = 8
	got := make([]*store.ClusterCA, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			got[i], errs[i] = s.InitClusterCA(ctx, &store.ClusterCA{
				CertPEM: fmt.Appendf(nil, "cert-%d", i), KeySealed: fmt.Appendf(nil, "key-%d", i)})
		}()
	}
	wg.Wait()
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("InitClusterCA %d: %v", i, errs[i])
		}
		if !bytes.Equal(got[i].CertPEM, got[0].CertPEM) || !bytes.Equal(got[i].KeySealed, got[0].KeySealed) {
			t.Fatalf("two CAs: %q and %q", got[0].CertPEM, got[i].CertPEM)
		}
	}
	// The pair stored is one caller's pair, never a mix.
	if want := bytes.Replace(got[0].CertPEM, []byte("cert"), []byte("key"), 1); !bytes.Equal(got[0].KeySealed, want) {
		t.Fatalf("stored cert %q with key %q", got[0].CertPEM, got[0].KeySealed)
	}
	ca, err := s.ClusterCA(ctx)
	if err != nil || !bytes.Equal(ca.CertPEM, got[0].CertPEM) || ca.CreatedAt.IsZero() {
		t.Fatalf("ClusterCA = %+v, %v", ca, err)
	}
}

// testJoinTokens: create, list, redeem once, then used; expired; unknown;
// wrong secret; revoke.
func testJoinTokens(t *testing.T, s store.Store) {
	ctx := context.Background()
	now := time.Now().UTC().Truncate(time.Microsecond)
	tok := &store.JoinToken{ID: "jt1", SecretHash: "h1", Labels: map[string]string{"zone": "a"}, CreatedAt: now, ExpiresAt: now.Add(time.Hour)}
	if err := s.CreateJoinToken(ctx, tok); err != nil {
		t.Fatal(err)
	}
	if err := s.CreateJoinToken(ctx, &store.JoinToken{ID: "jt1", SecretHash: "h", ExpiresAt: now}); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("duplicate ID: want ErrConflict, got %v", err)
	}
	old := &store.JoinToken{ID: "jt0", SecretHash: "h0", CreatedAt: now.Add(-2 * time.Hour), ExpiresAt: now.Add(-time.Hour)}
	if err := s.CreateJoinToken(ctx, old); err != nil {
		t.Fatal(err)
	}
	list, err := s.ListJoinTokens(ctx)
	if err != nil || len(list) != 2 || list[0].ID != "jt0" || list[1].ID != "jt1" {
		t.Fatalf("ListJoinTokens = %v, %v", list, err)
	}
	if l := list[1]; l.SecretHash != "h1" || l.Labels["zone"] != "a" || !l.ExpiresAt.Equal(tok.ExpiresAt) || !l.UsedAt.IsZero() {
		t.Fatalf("listed %+v", l)
	}
	if _, err := s.RedeemJoinToken(ctx, "jt1", "wrong", "n1", now); !errors.Is(err, store.ErrTokenUnknown) {
		t.Fatalf("wrong secret: want ErrTokenUnknown, got %v", err)
	}
	if _, err := s.RedeemJoinToken(ctx, "nope", "h1", "n1", now); !errors.Is(err, store.ErrTokenUnknown) {
		t.Fatalf("unknown ID: want ErrTokenUnknown, got %v", err)
	}
	if _, err := s.RedeemJoinToken(ctx, "jt0", "h0", "n1", now); !errors.Is(err, store.ErrTokenExpired) {
		t.Fatalf("expired: want ErrTokenExpired, got %v", err)
	}
	if _, err := s.RedeemJoinToken(ctx, "jt1", "h1", "n1", tok.ExpiresAt); !errors.Is(err, store.ErrTokenExpired) {
		t.Fatalf("at its expiry: want ErrTokenExpired, got %v", err)
	}
	// A registered node's ID cannot join again (it is forgotten first),
	// and the refusal leaves the token unused.
	if err := s.RegisterNode(ctx, &store.Node{ID: "taken"}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.RedeemJoinToken(ctx, "jt1", "h1", "taken", now); !errors.Is(err, store.ErrNodeExists) {
		t.Fatalf("registered node ID: want ErrNodeExists, got %v", err)
	}
	got, err := s.RedeemJoinToken(ctx, "jt1", "h1", "n1", now)
	if err != nil || got.UsedBy != "n1" || !got.UsedAt.Equal(now) || got.Labels["zone"] != "a" {
		t.Fatalf("redeem = %+v, %v", got, err)
	}
	if _, err := s.RedeemJoinToken(ctx, "jt1", "h1", "n2", now); !errors.Is(err, store.ErrTokenUsed) {
		t.Fatalf("second redeem: want ErrTokenUsed, got %v", err)
	}
	if err := s.DeleteJoinToken(ctx, "jt0"); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteJoinToken(ctx, "jt0"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("second revoke: want ErrNotFound, got %v", err)
	}
	if _, err := s.RedeemJoinToken(ctx, "jt0", "h0", "n1", now.Add(-3*time.Hour)); !errors.Is(err, store.ErrTokenUnknown) {
		t.Fatalf("revoked: want ErrTokenUnknown, got %v", err)
	}
}

// testJoinTokenRace: 16 concurrent redeems of one token, exactly one wins.
func testJoinTokenRace(t *testing.T, s store.Store) {
	ctx := context.Background()
	now := time.Now().UTC()
	if err := s.CreateJoinToken(ctx, &store.JoinToken{ID: "jtr", SecretHash: "h", ExpiresAt: now.Add(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	const n = 16
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = s.RedeemJoinToken(ctx, "jtr", "h", fmt.Sprintf("node-%d", i), now)
		}()
	}
	wg.Wait()
	won := 0
	for _, err := range errs {
		switch {
		case err == nil:
			won++
		case !errors.Is(err, store.ErrTokenUsed):
			t.Fatalf("losing redeem: want ErrTokenUsed, got %v", err)
		}
	}
	if won != 1 {
		t.Fatalf("%d redeems of one token succeeded, want 1", won)
	}
}
