package api

import (
	"net/http"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/cubicle-dev/cubicle/internal/store"
)

type newVolume struct {
	Name *string `json:"name"`
	// Driver is the CubeSandbox extension; e2b clients omit it and get the
	// first configured plugin.
	Driver string `json:"driver"`
	// Size is Cubicle's extension: the volume's size in bytes, a whole
	// number of MiB. e2b clients omit it and get the server default.
	Size *int64 `json:"size"`
}

// volumeJSON is e2b's VolumeAndToken (token omitted in lists) plus driver.
type volumeJSON struct {
	VolumeID string  `json:"volumeID"`
	Name     string  `json:"name"`
	Token    *string `json:"token,omitempty"`
	Driver   string  `json:"driver,omitempty"`
	// Size in bytes; absent for a volume without one (a driver that does
	// not enforce sizes, or a volume made before sizes existed).
	Size int64 `json:"size,omitempty"`
}

type volumeDetail struct {
	volumeJSON
	State       string          `json:"state"`
	CreatedAt   time.Time       `json:"createdAt"`
	Attachments []attachmentRef `json:"attachments"`
}

type attachmentRef struct {
	SandboxID string `json:"sandboxID"`
	Path      string `json:"path"`
	ReadOnly  bool   `json:"readOnly"`
}

func volumeOut(v *store.Volume, withToken bool) volumeJSON {
	out := volumeJSON{VolumeID: v.ID, Name: v.Name, Driver: v.Driver, Size: int64(v.SizeMB) << 20}
	if withToken {
		t := v.Token
		out.Token = &t
	}
	return out
}

func (s *Server) createVolume(w http.ResponseWriter, r *http.Request) {
	var req newVolume
	if !s.decode(w, r, &req, true) {
		return
	}
	name, msg := req.volumeName()
	if msg != "" {
		writeError(w, http.StatusBadRequest, msg)
		return
	}
	sizeMB, msg := req.sizeMB()
	if msg != "" {
		writeError(w, http.StatusBadRequest, msg)
		return
	}
	v, err := s.mgr.CreateVolume(r.Context(), teamOf(r), name, req.Driver, sizeMB)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, volumeOut(v, true))
}

func (s *Server) listVolumes(w http.ResponseWriter, r *http.Request) {
	vs, err := s.mgr.ListVolumes(r.Context(), teamOf(r))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	out := make([]volumeJSON, 0, len(vs))
	for _, v := range vs {
		out = append(out, volumeOut(v, false))
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) getVolume(w http.ResponseWriter, r *http.Request) {
	v, err := s.mgr.GetVolume(r.Context(), teamOf(r), chi.URLParam(r, "volumeID"))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	atts, err := s.mgr.VolumeAttachments(r.Context(), v.ID)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	d := volumeDetail{volumeJSON: volumeOut(v, true), State: string(v.State), CreatedAt: v.CreatedAt, Attachments: []attachmentRef{}}
	for _, a := range atts {
		d.Attachments = append(d.Attachments, attachmentRef{SandboxID: a.SandboxID, Path: a.Path, ReadOnly: a.ReadOnly})
	}
	writeJSON(w, http.StatusOK, d)
}

func (s *Server) deleteVolume(w http.ResponseWriter, r *http.Request) {
	if err := s.mgr.DeleteVolume(r.Context(), teamOf(r), chi.URLParam(r, "volumeID")); err != nil {
		s.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
