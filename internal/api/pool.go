package api

import (
	"net/http"

	"github.com/go-chi/chi/v5"

	"github.com/cubicle-dev/cubicle/internal/store"
)

// poolJSON is the warm pool of a template. Standbys are the IDs of the
// unclaimed standbys on the current ready build (the next claims, oldest
// first); they are never reachable through the sandbox routes.
type poolJSON struct {
	TemplateID string `json:"templateID"`
	PoolSize   int    `json:"poolSize"`
	// Target is what the pool refills to now: poolSize, or more while
	// recent demand asks for it (serve --pool-memory-mb).
	Target   int      `json:"target"`
	Ready    int      `json:"ready"`
	Standbys []string `json:"standbys"`
}

func (s *Server) poolOut(w http.ResponseWriter, r *http.Request, t *store.Template, owner bool) {
	ids, err := s.mgr.Standbys(r.Context(), t.ID, t.ReadyBuildID)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	target, err := s.mgr.PoolTarget(r.Context(), t.ID)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	out := poolJSON{TemplateID: t.ID, PoolSize: t.PoolSize, Target: target, Ready: len(ids), Standbys: ids}
	if !owner {
		// A claimed standby becomes the claiming team's sandbox under the
		// same ID: teams that only see a public template get no IDs.
		out.Standbys = []string{}
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) getPool(w http.ResponseWriter, r *http.Request) {
	c := s.catalog(w)
	if c == nil {
		return
	}
	t, err := c.Get(r.Context(), callerOf(r), chi.URLParam(r, "id"))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	_, werr := c.Writable(r.Context(), callerOf(r), t.ID)
	s.poolOut(w, r, t, werr == nil)
}

// setPool is PUT /templates/{id}/pool {"size": N}; the pool fills (or
// drains) in the background, so ready may still be below poolSize.
func (s *Server) setPool(w http.ResponseWriter, r *http.Request) {
	c := s.catalog(w)
	if c == nil {
		return
	}
	var req struct {
		Size *int `json:"size"`
	}
	if !s.decode(w, r, &req, false) {
		return
	}
	if req.Size == nil {
		writeError(w, http.StatusBadRequest, "size is required")
		return
	}
	t, err := c.SetPoolSize(r.Context(), callerOf(r), chi.URLParam(r, "id"), *req.Size)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	s.poolOut(w, r, t, true)
}
