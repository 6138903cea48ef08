package builder

import (
	"errors"
	"testing"

	"github.com/cubicle-dev/cubicle/internal/template/buildkit"
	"github.com/cubicle-dev/cubicle/internal/template/catalog"
)

// A RUN as a user the image lacks fails with e2b's words (envd refuses the
// process there), naming the step's own command rather than the rendered,
// export-prefixed RUN line; the BuildKit error stays in the chain.
func TestRunAsMissingUserHasE2BWording(t *testing.T) {
	job := catalog.Job{Start: catalog.StartRequest{Steps: []catalog.Step{
		{Type: "USER", Args: []string{"ghost"}},
		{Type: "RUN", Args: []string{"pip install x", "nobody2"}},
		{Type: "run", Args: []string{"whoami"}},
	}}}
	// What the buildkit package returns and cmd/cubicle's adapter wraps.
	solveErr := func(user string) error {
		bk := &buildkit.BuildError{Step: 3, Err: &buildkit.UnknownUserError{User: user,
			Err: errors.New(`failed to solve: unable to find user ` + user + `: no matching entries in passwd file`)}}
		return &SolveError{Line: 4, Err: bk}
	}
	for _, tc := range []struct {
		step, user, want string
	}{
		{"1", "nobody2", "failed to run command 'pip install x': command failed: unauthenticated: invalid username: 'nobody2'"},
		// The user came from an earlier USER step.
		{"2", "ghost", "failed to run command 'whoami': command failed: unauthenticated: invalid username: 'ghost'"},
	} {
		err := e2bSolveError(job, tc.step, solveErr(tc.user))
		if err.Error() != tc.want {
			t.Errorf("step %s: %q, want %q", tc.step, err, tc.want)
		}
		var uu *buildkit.UnknownUserError
		if !errors.As(err, &uu) || !errors.Is(err, buildkit.ErrBuildFailed) {
			t.Errorf("step %s: BuildKit's error left the chain: %v", tc.step, err)
		}
	}
	// Anything else keeps BuildKit's text: other failures, steps that are
	// not RUN, and steps the error cannot be placed in.
	other := &SolveError{Line: 3, Err: &buildkit.BuildError{Step: 2, Err: errors.New("exit code: 1")}}
	for _, tc := range []struct {
		step string
		err  error
	}{{"1", other}, {"0", solveErr("ghost")}, {"base", solveErr("ghost")}, {"7", solveErr("ghost")}} {
		if got := e2bSolveError(job, tc.step, tc.err); got != tc.err {
			t.Errorf("step %s: %v rewritten to %v", tc.step, tc.err, got)
		}
	}
}
