package api

import (
	"errors"
	"net/http"
	"strconv"

	"github.com/go-chi/chi/v5"

	"github.com/cubicle-dev/cubicle/internal/accel"
	"github.com/cubicle-dev/cubicle/internal/node"
	"github.com/cubicle-dev/cubicle/internal/nodeset"
)

// Node routes: the inventory each node reports and the operator actions on
// its accelerators (Cubicle extension; e2b has no node API).
func (s *Server) nodeRoutes(r chi.Router) {
	r.Get("/nodes", s.listNodes)
	r.Get("/nodes/{node}/accelerators", s.listAccelerators)
	r.Get("/nodes/{node}/accelerators/events", s.acceleratorEvents)
	r.Get("/nodes/{node}/accelerators/{dev}", s.getAccelerator)
	r.Post("/nodes/{node}/accelerators/{dev}/{action}", s.acceleratorAction)
}

type nodeJSON struct {
	NodeID       string         `json:"nodeID"`
	Accelerators map[string]int `json:"accelerators"` // count by state
	// Error says why a node's facts could not be read (it is listed
	// all the same, without accelerators).
	Error string `json:"error,omitempty"`
}

func (s *Server) listNodes(w http.ResponseWriter, r *http.Request) {
	members, err := s.mgr.Nodes().Members(r.Context())
	if err != nil {
		s.fail(w, r, err)
		return
	}
	out := []nodeJSON{}
	for _, mb := range members {
		j := nodeJSON{NodeID: mb.ID, Accelerators: map[string]int{}}
		n, err := s.mgr.NodeByID(r.Context(), mb.ID)
		var info node.Info
		if err == nil {
			info, err = n.Info(r.Context())
		}
		if err != nil {
			j.Error = err.Error()
		}
		for state, c := range info.Accelerators {
			j.Accelerators[string(state)] = c
		}
		out = append(out, j)
	}
	writeJSON(w, http.StatusOK, out)
}

// accelNode resolves {node}; ok is false once an error is written. has
// is false for a node without accelerators, whose inventory is empty.
func (s *Server) accelNode(w http.ResponseWriter, r *http.Request) (n node.Node, has, ok bool) {
	id := chi.URLParam(r, "node")
	n, err := s.mgr.NodeByID(r.Context(), id)
	if errors.Is(err, nodeset.ErrUnknownNode) {
		writeError(w, http.StatusNotFound, "node '"+id+"' not found")
		return nil, false, false
	}
	if err != nil {
		s.fail(w, r, err)
		return nil, false, false
	}
	info, err := n.Info(r.Context())
	if err != nil {
		s.fail(w, r, err)
		return nil, false, false
	}
	return n, info.Accelerators != nil, true
}

func (s *Server) listAccelerators(w http.ResponseWriter, r *http.Request) {
	n, has, ok := s.accelNode(w, r)
	if !ok {
		return
	}
	out := []accel.Device{}
	if has {
		inv, err := n.AcceleratorInventory(r.Context())
		if err != nil {
			s.fail(w, r, err)
			return
		}
		out = append(out, inv...)
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) getAccelerator(w http.ResponseWriter, r *http.Request) {
	n, has, ok := s.accelNode(w, r)
	if !ok {
		return
	}
	id := chi.URLParam(r, "dev")
	if !has {
		writeError(w, http.StatusNotFound, "accelerator '"+id+"' not found")
		return
	}
	d, err := n.Accelerator(r.Context(), id)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, d)
}

func (s *Server) acceleratorEvents(w http.ResponseWriter, r *http.Request) {
	n, has, ok := s.accelNode(w, r)
	if !ok {
		return
	}
	limit := 100
	if v := r.URL.Query().Get("limit"); v != "" {
		l, err := strconv.Atoi(v)
		if err != nil || l < 1 || l > 1000 {
			writeError(w, http.StatusBadRequest, "limit must be between 1 and 1000")
			return
		}
		limit = l
	}
	out := []accel.Event{}
	if has {
		evs, err := n.AcceleratorEvents(r.Context(), limit)
		if err != nil {
			s.fail(w, r, err)
			return
		}
		out = append(out, evs...)
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) acceleratorAction(w http.ResponseWriter, r *http.Request) {
	n, has, ok := s.accelNode(w, r)
	if !ok {
		return
	}
	id, action := chi.URLParam(r, "dev"), chi.URLParam(r, "action")
	var req struct {
		Reason string `json:"reason"`
	}
	if r.ContentLength != 0 && !s.decode(w, r, &req, true) {
		return
	}
	if !has {
		writeError(w, http.StatusNotFound, "accelerator '"+id+"' not found")
		return
	}
	var d accel.Device
	var err error
	switch action {
	case "disable":
		if req.Reason == "" {
			req.Reason = "disabled by operator"
		}
		d, err = n.DisableAccelerator(r.Context(), id, req.Reason)
	case "enable":
		d, err = n.EnableAccelerator(r.Context(), id)
	case "recover":
		d, err = n.RecoverAccelerator(r.Context(), id)
	default:
		writeError(w, http.StatusNotFound, "unknown action '"+action+"' (disable, enable, recover)")
		return
	}
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, d)
}
