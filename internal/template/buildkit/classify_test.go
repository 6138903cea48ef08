package buildkit

import (
	"errors"
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
