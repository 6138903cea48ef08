package api

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"

	"github.com/go-chi/chi/v5"

	"github.com/cubicle-dev/cubicle/internal/store"
	"github.com/cubicle-dev/cubicle/internal/template/catalog"
)

// CubeSandbox's template routes (CubeAPI), beside e2b's on the same paths:
// POST /templates with an "image" is CubeAPI's create-from-image,
// POST /templates/{id} its rebuild and PUT /templates/{id}/alias its alias
// change. The catalog holds the semantics (catalog/cubeapi.go).

// isImageRequest tells CubeAPI's create body from e2b's: only CubeAPI's
// has "image" (e2b's v1 had "dockerfile", v2/v3 "name"/"alias").
func isImageRequest(body []byte) bool {
	var keys map[string]json.RawMessage
	if json.Unmarshal(body, &keys) != nil {
		return false
	}
	_, ok := keys["image"]
	return ok
}

func (s *Server) createFromImage(w http.ResponseWriter, r *http.Request, c *catalog.Catalog, body []byte) {
	var req catalog.ImageRequest
	if msg := decodeStrict(body, &req); msg != "" {
		writeError(w, http.StatusBadRequest, msg)
		return
	}
	job, err := c.CreateFromImage(r.Context(), callerOf(r), req)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusAccepted, job)
}

func (s *Server) rebuildFromImage(w http.ResponseWriter, r *http.Request) {
	c := s.catalog(w)
	if c == nil {
		return
	}
	// The SDK sends {} (its keyword arguments, none by default): a rebuild
	// repeats the stored request, so any field would go unused.
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.cfg.MaxBodyBytes))
	if err != nil {
		writeError(w, http.StatusRequestEntityTooLarge, "request body too large")
		return
	}
	if t := bytes.TrimSpace(body); len(t) > 0 {
		var fields map[string]json.RawMessage
		if err := json.Unmarshal(t, &fields); err != nil {
			writeError(w, http.StatusBadRequest, "malformed JSON body: "+err.Error())
			return
		}
		for k := range fields {
			writeError(w, http.StatusBadRequest, "unknown field \""+k+"\": a rebuild repeats the template's create request and takes no fields (create a new template to change it)")
			return
		}
	}
	job, err := c.RebuildFromImage(r.Context(), callerOf(r), chi.URLParam(r, "id"))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusAccepted, job)
}

func (s *Server) setTemplateAlias(w http.ResponseWriter, r *http.Request) {
	c := s.catalog(w)
	if c == nil {
		return
	}
	var req struct {
		Alias *string `json:"alias"`
	}
	if !s.decode(w, r, &req, false) {
		return
	}
	if req.Alias == nil {
		writeError(w, http.StatusBadRequest, `alias is required ("" removes the template's alias)`)
		return
	}
	t, err := c.SetAlias(r.Context(), callerOf(r), chi.URLParam(r, "id"), strings.TrimSpace(*req.Alias))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, templateOut(t))
}

// cubeStatus is a build status as CubeAPI words it.
func cubeStatus(status string) string {
	if status == store.BuildError {
		return "FAILED"
	}
	return strings.ToUpper(catalog.APIStatus(status))
}

// cubeTemplateJSON is what CubeAPI's template detail adds to e2b's.
type cubeTemplateJSON struct {
	// ImageInfo is the image a CubeAPI-made template was built from.
	ImageInfo string `json:"imageInfo,omitempty"`
	// LastError is the latest build's failure, when it failed.
	LastError string `json:"lastError,omitempty"`
	// JobID is the latest build (CubeAPI's name for it).
	JobID string `json:"jobID,omitempty"`
	// CreateRequest is a CubeAPI-made template's create request in
	// CubeMaster's vocabulary, as CubeAPI shows it.
	CreateRequest map[string]any `json:"createRequest,omitempty"`
}

func (s *Server) cubeDetail(r *http.Request, c *catalog.Catalog, t *store.Template, builds []*store.TemplateBuild) (cubeTemplateJSON, error) {
	out := cubeTemplateJSON{JobID: t.LatestBuildID}
	for _, b := range builds {
		if b.ID == t.LatestBuildID && b.Status == store.BuildError {
			out.LastError = b.Reason
		}
	}
	req, err := c.ImageRequestOf(r.Context(), t)
	if err != nil || req == nil {
		return out, err
	}
	out.ImageInfo = req.Image
	out.CreateRequest = cubeCreateRequest(t, req)
	return out, nil
}

// cubeCreateRequest renders the stored request as CubeMaster's create
// request: annotations, one container, the writable layer as a volume.
func cubeCreateRequest(t *store.Template, req *catalog.ImageRequest) map[string]any {
	annotations := map[string]string{}
	if len(req.ExposedPorts) > 0 {
		ports := make([]string, len(req.ExposedPorts))
		for i, p := range req.ExposedPorts {
			ports[i] = strconv.Itoa(p)
		}
		annotations["com.exposed_ports"] = strings.Join(ports, ":")
	}
	container := map[string]any{
		"image":     map[string]any{"image": req.Image},
		"resources": map[string]any{"cpu": strconv.Itoa(t.CPUCount*1000) + "m", "mem": strconv.Itoa(t.MemoryMB) + "Mi"},
	}
	if len(req.Env) > 0 {
		envs := make([]map[string]string, 0, len(req.Env))
		for _, kv := range req.Env {
			k, v, _ := strings.Cut(kv, "=")
			envs = append(envs, map[string]string{"key": k, "value": v})
		}
		container["envs"] = envs
	}
	if len(req.Command) > 0 {
		container["command"] = req.Command
	}
	if len(req.Args) > 0 {
		container["args"] = req.Args
	}
	if req.ProbePort != nil {
		path := req.ProbePath
		if path == "" {
			path = "/"
		}
		container["probe"] = map[string]any{"probe_handler": map[string]any{"http_get": map[string]any{"port": *req.ProbePort, "path": path}}}
	}
	out := map[string]any{"annotations": annotations, "containers": []any{container}}
	if req.WritableLayerSize != "" {
		annotations["cube.master.rootfs.writable_layer_size"] = req.WritableLayerSize
		out["volumes"] = []any{map[string]any{"name": "writable-layer", "volume_source": map[string]any{"empty_dir": map[string]any{"size_limit": req.WritableLayerSize}}}}
	}
	return out
}
