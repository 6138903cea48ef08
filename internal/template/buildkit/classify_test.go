package buildkit

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// The executor's text is all that crosses BuildKit's gRPC boundary; classify
// must recognise it and nothing else.
func TestClassifyUnknownUser(t *testing.T) {
	for _, tc := range []struct {
		msg  string
		user string // "" = not an unknown user
	}{
		{`failed to solve: unable to find user ghost: no matching entries in passwd file`, "ghost"},
		{`process "/bin/sh -c true" failed: unable to find user app-1.x: no matching entries in passwd file`, "app-1.x"},
		{`failed to solve: unable to find group staff: no matching entries in group file`, ""},
		{`failed to solve: process "/bin/sh -c false" did not complete successfully: exit code: 1`, ""},
	} {
		err := classify(errors.New(tc.msg))
		var uu *UnknownUserError
		if got := errors.As(err, &uu); got != (tc.user != "") || (got && uu.User != tc.user) {
			t.Errorf("%q: UnknownUserError %v %+v, want user %q", tc.msg, got, uu, tc.user)
		}
		if err.Error() != tc.msg {
			t.Errorf("classify changed the message: %q", err)
		}
	}
}

// buildkitd never starts in the host's network namespace: the builder's
// netns is required.
func TestStartRequiresNetNS(t *testing.T) {
	_, err := Start(context.Background(), Config{Root: t.TempDir()})
	if !errors.Is(err, ErrNoNetNS) {
		t.Fatalf("Start without NetNS: %v, want ErrNoNetNS", err)
	}
	plain := filepath.Join(t.TempDir(), "plain")
	if err := os.WriteFile(plain, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, ns := range []string{filepath.Join(t.TempDir(), "missing"), plain} {
		if _, err := Start(context.Background(), Config{Root: t.TempDir(), NetNS: ns}); !errors.Is(err, ErrNoNetNS) {
			t.Fatalf("Start with NetNS %s: %v, want ErrNoNetNS", ns, err)
		}
	}
}
