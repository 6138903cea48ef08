package catalog

import (
	"context"
	"errors"
	"fmt"

	"github.com/cubicle-dev/cubicle/internal/store"
)

// ErrForbidden: the caller sees the template but may not change it (a
// public or built-in template, for a key that is not an admin). Templates
// the caller does not see are ErrNotFound, never this.
var ErrForbidden = errors.New("template is read-only")

// Caller is who asks the catalog: the API key's team and whether the key is
// an admin. Templates belong to one team; names are per team.
//
//   - A team sees its own templates and the public ones (base and the other
//     built-ins are public); every other template does not exist for it.
//   - It changes (rebuilds, tags, deletes, pools, uploads contexts for) its
//     own private templates; public ones only admin keys change.
type Caller struct {
	TeamID string
	Admin  bool
	system bool
}

// System is the control plane itself (the pool reconciler, serve flags):
// it sees and changes every template, and names resolve in the default
// team's namespace.
func System() Caller { return Caller{TeamID: store.DefaultTeamID, Admin: true, system: true} }

func (c Caller) sees(t *store.Template) bool { return c.system || t.TeamID == c.TeamID || t.Public }

func (c Caller) mayChange(t *store.Template) bool {
	switch {
	case c.system:
		return true
	case t.Public:
		return c.Admin
	}
	return t.TeamID == c.TeamID
}

func notFound(ref string) error { return fmt.Errorf("%w: '%s'", ErrNotFound, ref) }

// byID is the template with this ID when the caller sees it.
func (c *Catalog) byID(ctx context.Context, caller Caller, id string) (*store.Template, error) {
	t, err := c.st.GetTemplate(ctx, id)
	if err == nil && !caller.sees(t) {
		return nil, store.ErrNotFound
	}
	return t, err
}

// Writable is Get plus the right to change the template.
func (c *Catalog) Writable(ctx context.Context, caller Caller, ref string) (*store.Template, error) {
	t, err := c.Get(ctx, caller, ref)
	if err != nil {
		return nil, err
	}
	if !caller.mayChange(t) {
		return nil, fmt.Errorf("%w: template '%s' is public; only admin API keys change public and built-in templates", ErrForbidden, ref)
	}
	if err := c.frozen(ctx, t); err != nil {
		return nil, err
	}
	return t, nil
}

// frozen refuses changes to a snapshot's template: its one build is the
// snapshot, and it stays its team's (a public snapshot would hand other
// teams its memory and env).
func (c *Catalog) frozen(ctx context.Context, t *store.Template) error {
	if _, err := c.st.GetSnapshot(ctx, t.ID); err == nil {
		return fmt.Errorf("%w: template '%s' is a snapshot; snapshots cannot be rebuilt, tagged, made public or pooled (delete it with DELETE /templates/%s)", ErrConflict, t.PrimaryName, t.ID)
	} else if !errors.Is(err, store.ErrNotFound) {
		return err
	}
	return nil
}
