package api

import (
	"errors"
	"net/http"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/cubicle-dev/cubicle/internal/control"
	"github.com/cubicle-dev/cubicle/internal/store"
)

// Placement policy routes (Cubicle extension, admin keys only): a CEL
// filter and score per team or per template, which every create of that
// team or template is placed under. `cubicle scheduler policy` is their CLI.
func (s *Server) policyRoutes(r chi.Router) {
	r.Get("/scheduler/policies", s.listPolicies)
	r.Get("/scheduler/policies/{scope}/{target}", s.getPolicy)
	r.Put("/scheduler/policies/{scope}/{target}", s.putPolicy)
	r.Delete("/scheduler/policies/{scope}/{target}", s.deletePolicy)
}

type policyJSON struct {
	Scope     store.PolicyScope `json:"scope"`
	Target    string            `json:"target"`
	Filter    string            `json:"filter"`
	Score     string            `json:"score"`
	CreatedAt time.Time         `json:"createdAt"`
	UpdatedAt time.Time         `json:"updatedAt"`
}

func toPolicyJSON(p *store.PlacementPolicy) policyJSON {
	return policyJSON{Scope: p.Scope, Target: p.Target, Filter: p.Filter, Score: p.Score, CreatedAt: p.CreatedAt, UpdatedAt: p.UpdatedAt}
}

// policyBody is a PUT body. Every key is known by name: a field this
// server does not implement would change placement, so it is refused.
type policyBody struct {
	Filter string `json:"filter"`
	Score  string `json:"score"`
}

func (*policyBody) strictName() string { return "placement policy" }

// policyKey reads {scope}/{target}; ok is false once an error is written.
func policyKey(w http.ResponseWriter, r *http.Request) (store.PolicyScope, string, bool) {
	scope := store.PolicyScope(chi.URLParam(r, "scope"))
	if !scope.Valid() {
		writeError(w, http.StatusBadRequest, "placement policy scope '"+string(scope)+"': want 'team' or 'template'")
		return "", "", false
	}
	return scope, chi.URLParam(r, "target"), true
}

func (s *Server) listPolicies(w http.ResponseWriter, r *http.Request) {
	ps, err := s.store.ListPlacementPolicies(r.Context())
	if err != nil {
		s.fail(w, r, err)
		return
	}
	out := make([]policyJSON, 0, len(ps))
	for _, p := range ps {
		out = append(out, toPolicyJSON(p))
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) getPolicy(w http.ResponseWriter, r *http.Request) {
	scope, target, ok := policyKey(w, r)
	if !ok {
		return
	}
	p, err := s.store.GetPlacementPolicy(r.Context(), scope, target)
	if errors.Is(err, store.ErrNotFound) {
		writeError(w, http.StatusNotFound, "no placement policy for "+string(scope)+" '"+target+"'")
		return
	}
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, toPolicyJSON(p))
}

// putPolicy sets (creates or replaces) a policy; the expressions are
// compiled and cost-checked first, and a bad one is a 400 carrying the
// compiler's message.
func (s *Server) putPolicy(w http.ResponseWriter, r *http.Request) {
	scope, target, ok := policyKey(w, r)
	if !ok {
		return
	}
	var body policyBody
	if !s.decode(w, r, &body, false) {
		return
	}
	p := &store.PlacementPolicy{Scope: scope, Target: target, Filter: body.Filter, Score: body.Score}
	if err := control.ValidatePlacementPolicy(r.Context(), s.store, p); err != nil {
		s.fail(w, r, err)
		return
	}
	if err := s.store.PutPlacementPolicy(r.Context(), p); err != nil {
		s.fail(w, r, err)
		return
	}
	s.log.Info("placement policy set", "scope", scope, "target", target, "key", apiKeyOf(r).ID)
	writeJSON(w, http.StatusOK, toPolicyJSON(p))
}

func (s *Server) deletePolicy(w http.ResponseWriter, r *http.Request) {
	scope, target, ok := policyKey(w, r)
	if !ok {
		return
	}
	err := s.store.DeletePlacementPolicy(r.Context(), scope, target)
	if errors.Is(err, store.ErrNotFound) {
		writeError(w, http.StatusNotFound, "no placement policy for "+string(scope)+" '"+target+"'")
		return
	}
	if err != nil {
		s.fail(w, r, err)
		return
	}
	s.log.Info("placement policy deleted", "scope", scope, "target", target, "key", apiKeyOf(r).ID)
	w.WriteHeader(http.StatusNoContent)
}
