package api

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/cubicle-dev/cubicle/internal/accel"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/cubicle-dev/cubicle/internal/control"
	"github.com/cubicle-dev/cubicle/internal/hostmount"
	"github.com/cubicle-dev/cubicle/internal/phase"
	"github.com/cubicle-dev/cubicle/internal/store"
)

const clientID = "6532622b" // e2b's constant, kept for SDK compatibility

type networkConfig struct {
	AllowPublicTraffic *bool     `json:"allowPublicTraffic,omitempty"`
	AllowOut           []string  `json:"allowOut,omitempty"`
	DenyOut            []string  `json:"denyOut,omitempty"`
	MaskRequestHost    string    `json:"maskRequestHost,omitempty"`
	HTTPSPorts         []int     `json:"httpsPorts,omitempty"`
	DNSServers         *[]string `json:"dnsServers,omitempty"`
	// Parsed strictly by parseEgress; shown by egressOut.
	EgressProxy json.RawMessage `json:"egressProxy,omitempty"`
	Rules       json.RawMessage `json:"rules,omitempty"`
}

// UnmarshalJSON refuses network keys this server does not implement: a
// dropped one (deny_out for denyOut) would leave the sandbox open.
func (n *networkConfig) UnmarshalJSON(b []byte) error {
	type plain networkConfig
	return decodeStrictObject("network", b, (*plain)(n))
}

// autoResumeJSON is e2b's {"enabled": bool}.
type autoResumeJSON struct {
	Enabled bool `json:"enabled"`
}

func (a *autoResumeJSON) UnmarshalJSON(b []byte) error {
	type plain autoResumeJSON
	return decodeStrictObject("autoResume", b, (*plain)(a))
}

// lifecycleJSON is {"onTimeout": "kill"|"pause", "autoResume": bool}.
type lifecycleJSON struct {
	OnTimeout  *string `json:"onTimeout"`
	AutoResume *bool   `json:"autoResume"`
}

func (l *lifecycleJSON) UnmarshalJSON(b []byte) error {
	type plain lifecycleJSON
	return decodeStrictObject("lifecycle", b, (*plain)(l))
}

// volumeMountIn is one volumeMounts entry of a create body.
type volumeMountIn struct {
	Name string `json:"name"`
	Path string `json:"path"`
	// ReadOnly is the Cubicle/CubeSandbox extension; e2b requests omit it.
	ReadOnly bool `json:"readOnly"`
}

func (v *volumeMountIn) UnmarshalJSON(b []byte) error {
	type plain volumeMountIn
	return decodeStrictObject("volumeMounts entry", b, (*plain)(v))
}

// accelRequestIn is one accelerators entry of a create body.
type accelRequestIn accel.Request

func (a *accelRequestIn) UnmarshalJSON(b []byte) error {
	return decodeStrictObject("accelerators entry", b, (*accel.Request)(a))
}

type newSandbox struct {
	TemplateID      *string         `json:"templateID"`
	Timeout         *int64          `json:"timeout"`
	AutoPause       *bool           `json:"autoPause"`
	AutoPauseMemory *bool           `json:"autoPauseMemory"`
	AutoResume      *autoResumeJSON `json:"autoResume"`
	// Lifecycle is e2b's lifecycle object as CubeSandbox's SDK sends it
	// (and GET /sandboxes/{id} shows it): the same switches as autoPause
	// and autoResume.
	Lifecycle           *lifecycleJSON    `json:"lifecycle"`
	Secure              *bool             `json:"secure"`
	AllowInternetAccess *bool             `json:"allow_internet_access"`
	Network             *networkConfig    `json:"network"`
	Metadata            map[string]string `json:"metadata"`
	EnvVars             map[string]string `json:"envVars"`
	VolumeMounts        []volumeMountIn   `json:"volumeMounts"`
	// Accelerators is Cubicle's extension: [{"class":"gpu","count":1,...}].
	Accelerators []accelRequestIn `json:"accelerators"`
	// IAM is e2b's workload identity: refused when it names tokens.
	IAM json.RawMessage `json:"iam"`
	// MCP is the SDK's own business: it picks the mcp-gateway template
	// and starts the gateway in the sandbox; the server has nothing to do.
	MCP json.RawMessage `json:"mcp"`
}

type volumeMountJSON struct {
	Name     string `json:"name"`
	Path     string `json:"path"`
	ReadOnly bool   `json:"readOnly,omitempty"`
}

type sandboxJSON struct {
	TemplateID         string  `json:"templateID"`
	SandboxID          string  `json:"sandboxID"`
	ClientID           string  `json:"clientID"`
	EnvdVersion        string  `json:"envdVersion"`
	EnvdAccessToken    string  `json:"envdAccessToken,omitempty"`
	TrafficAccessToken *string `json:"trafficAccessToken"`
	Domain             *string `json:"domain"`
	Alias              string  `json:"alias,omitempty"`
}

type listedSandbox struct {
	TemplateID   string            `json:"templateID"`
	Alias        string            `json:"alias,omitempty"`
	SandboxID    string            `json:"sandboxID"`
	ClientID     string            `json:"clientID"`
	StartedAt    time.Time         `json:"startedAt"`
	EndAt        time.Time         `json:"endAt"`
	CPUCount     int               `json:"cpuCount"`
	MemoryMB     int               `json:"memoryMB"`
	DiskSizeMB   int               `json:"diskSizeMB"`
	Metadata     map[string]string `json:"metadata,omitempty"`
	State        string            `json:"state"`
	EnvdVersion  string            `json:"envdVersion"`
	VolumeMounts []volumeMountJSON `json:"volumeMounts,omitempty"`
	Accelerators []accel.Request   `json:"accelerators,omitempty"`
}

type sandboxDetail struct {
	listedSandbox
	EnvdAccessToken     string        `json:"envdAccessToken,omitempty"`
	AllowInternetAccess *bool         `json:"allowInternetAccess"`
	Domain              *string       `json:"domain"`
	Network             networkConfig `json:"network"`
	Lifecycle           struct {
		AutoResume bool   `json:"autoResume"`
		OnTimeout  string `json:"onTimeout"`
	} `json:"lifecycle"`
}

// decode reads a JSON body with a size cap. An empty body is allowed when
// optional is true (the v2 connect body is optional).
func (s *Server) decode(w http.ResponseWriter, r *http.Request, v any, optional bool) bool {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.cfg.MaxBodyBytes))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			writeError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("request body larger than %d bytes", s.cfg.MaxBodyBytes))
			return false
		}
		writeError(w, http.StatusBadRequest, "reading body: "+err.Error())
		return false
	}
	unknown, msg := decodeBody(body, v, optional)
	if msg != "" {
		writeError(w, http.StatusBadRequest, msg)
		return false
	}
	if len(unknown) > 0 {
		route := r.Method + " unmatched"
		if rc := chi.RouteContext(r.Context()); rc != nil {
			route = r.Method + " " + rc.RoutePattern()
		}
		s.metrics.unknown.note(route, unknown, func(name string) {
			s.log.Info("request body field not known to this server: ignored (counted in cubicle_api_unknown_fields_total)", "route", route, "field", name)
		})
	}
	return true
}

func (s *Server) domain() *string {
	if s.cfg.Domain == "" {
		return nil
	}
	d := s.cfg.Domain
	return &d
}

func (s *Server) sandboxResponse(sb *store.Sandbox) sandboxJSON {
	tt := sb.TrafficToken
	return sandboxJSON{
		TemplateID: sb.TemplateID, SandboxID: sb.ID, ClientID: clientID, EnvdVersion: control.EnvdVersion,
		EnvdAccessToken: sb.EnvdToken, TrafficAccessToken: &tt, Domain: s.domain(), Alias: sb.Alias,
	}
}

// e2b knows two states. A lost sandbox (its node stopped heartbeating)
// is listed as paused: like a paused one it is there but answers nothing
// until something brings it back (its node), and clients that list
// "running" to find sandboxes to talk to skip it. Its events say why.
func listed(sb *store.Sandbox, volumeNames map[string]string) listedSandbox {
	state := "running"
	if sb.State == store.StatePaused || sb.State == store.StatePausing || sb.State == store.StateLost {
		state = "paused"
	}
	ls := listedSandbox{
		TemplateID: sb.TemplateID, Alias: sb.Alias, SandboxID: sb.ID, ClientID: clientID,
		StartedAt: sb.StartedAt, EndAt: sb.EndAt, CPUCount: sb.CPUCount, MemoryMB: sb.MemoryMB,
		DiskSizeMB: sb.DiskSizeMB, Metadata: sb.Metadata, State: state, EnvdVersion: control.EnvdVersion,
	}
	for _, vm := range sb.Volumes {
		// e2b names a mount by the volume's name; a team's volume IDs are
		// not their names (one deleted since keeps its ID).
		name := vm.VolumeID
		if n, ok := volumeNames[vm.VolumeID]; ok {
			name = n
		}
		ls.VolumeMounts = append(ls.VolumeMounts, volumeMountJSON{Name: name, Path: vm.Path, ReadOnly: vm.ReadOnly})
	}
	ls.Accelerators = control.SandboxAccelerators(sb)
	return ls
}

// volumeNames maps the IDs of the volumes rows mount to their names, one
// store read per team that has any (nil when none mounts a volume).
func (s *Server) volumeNames(ctx context.Context, rows ...*store.Sandbox) (map[string]string, error) {
	var names map[string]string
	done := map[string]bool{}
	for _, sb := range rows {
		if len(sb.Volumes) == 0 || done[sb.TeamID] {
			continue
		}
		done[sb.TeamID] = true
		vs, err := s.mgr.ListVolumes(ctx, sb.TeamID)
		if err != nil {
			return nil, err
		}
		if names == nil {
			names = map[string]string{}
		}
		for _, v := range vs {
			names[v.ID] = v.Name
		}
	}
	return names, nil
}

func (s *Server) create(w http.ResponseWriter, r *http.Request, v2 bool) {
	var req newSandbox
	if !s.decode(w, r, &req, false) {
		return
	}
	opts, msg := req.options(v2)
	if msg != "" {
		writeError(w, http.StatusBadRequest, msg)
		return
	}
	if k := apiKeyOf(r); k != nil {
		opts.APIKeyID = k.ID
		opts.HostMounts = k.Admin
	}
	opts.TeamID = teamOf(r)
	if _, asks := opts.Metadata[hostmount.Key]; asks && !opts.HostMounts {
		opts.HostMounts = s.hostMountTeam(r.Context(), opts.TeamID)
	}
	// Server-Timing carries the create's phases (phase.Names) to whoever
	// measures: browsers and HTTP clients ignore a header they don't read.
	tr := phase.New()
	sb, err := s.mgr.Create(phase.With(r.Context(), tr), opts)
	w.Header().Set("Server-Timing", tr.ServerTiming())
	var rt *control.ReadyTimeoutError
	if errors.As(err, &rt) {
		// The CEP's body: the sandbox stays so its start-command log can be read.
		writeJSON(w, http.StatusServiceUnavailable, map[string]any{"code": http.StatusServiceUnavailable,
			"message": "template ready command timed out: " + rt.Err.Error(), "sandboxID": rt.SandboxID, "logPath": rt.LogPath})
		return
	}
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, s.sandboxResponse(sb))
}

// hostMountTeam: serve --host-mount-team names the team, by ID or name
// (read at each ask, so a team made after the server started counts).
func (s *Server) hostMountTeam(ctx context.Context, teamID string) bool {
	if len(s.cfg.HostMountTeams) == 0 {
		return false
	}
	if slices.Contains(s.cfg.HostMountTeams, teamID) {
		return true
	}
	t, err := s.store.GetTeam(ctx, teamID)
	return err == nil && slices.Contains(s.cfg.HostMountTeams, t.Name)
}

func (s *Server) createV1(w http.ResponseWriter, r *http.Request) { s.create(w, r, false) }
func (s *Server) createV2(w http.ResponseWriter, r *http.Request) { s.create(w, r, true) }

// parseMetadataFilter undoes the SDK's triple encoding: the framework has
// decoded the parameter once; the value is itself a query string of
// escaped keys and values.
func parseMetadataFilter(raw string) (map[string]string, error) {
	if raw == "" {
		return nil, nil
	}
	whole, err := url.QueryUnescape(raw)
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, pair := range strings.Split(whole, "&") {
		if pair == "" {
			continue
		}
		k, v, _ := strings.Cut(pair, "=")
		if k, err = url.QueryUnescape(k); err != nil {
			return nil, err
		}
		if v, err = url.QueryUnescape(v); err != nil {
			return nil, err
		}
		out[k] = v
	}
	return out, nil
}

func parseStates(raw string) ([]store.SandboxState, error) {
	if raw == "" {
		return []store.SandboxState{store.StateRunning, store.StatePausing, store.StatePaused, store.StateResuming, store.StateLost}, nil
	}
	var out []store.SandboxState
	for _, st := range strings.Split(raw, ",") {
		switch strings.TrimSpace(st) {
		case "running":
			out = append(out, store.StateRunning, store.StateResuming)
		case "paused":
			out = append(out, store.StatePaused, store.StatePausing, store.StateLost)
		default:
			return nil, fmt.Errorf("unknown state %q (want running or paused)", st)
		}
	}
	return out, nil
}

func encodeCursor(sb *store.Sandbox) string {
	return base64.RawURLEncoding.EncodeToString([]byte(strconv.FormatInt(sb.StartedAt.UnixNano(), 10) + ":" + sb.ID))
}

func decodeCursor(tok string) (time.Time, string, error) {
	b, err := base64.RawURLEncoding.DecodeString(tok)
	if err != nil {
		return time.Time{}, "", err
	}
	ns, id, ok := strings.Cut(string(b), ":")
	if !ok {
		return time.Time{}, "", errors.New("malformed token")
	}
	n, err := strconv.ParseInt(ns, 10, 64)
	if err != nil {
		return time.Time{}, "", err
	}
	return time.Unix(0, n), id, nil
}

func (s *Server) listV2(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	f := store.SandboxFilter{TeamID: teamOf(r), Template: q.Get("template")}
	var err error
	if f.Metadata, err = parseMetadataFilter(q.Get("metadata")); err != nil {
		writeError(w, http.StatusBadRequest, "invalid metadata filter: "+err.Error())
		return
	}
	if f.States, err = parseStates(q.Get("state")); err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	switch q.Get("order") {
	case "", "desc":
	case "asc":
		f.Ascending = true
	default:
		writeError(w, http.StatusBadRequest, "order must be asc or desc")
		return
	}
	if v := q.Get("startedAfter"); v != "" {
		if f.StartedAfter, err = time.Parse(time.RFC3339, v); err != nil {
			writeError(w, http.StatusBadRequest, "startedAfter must be RFC3339: "+err.Error())
			return
		}
	}
	limit := 100
	if v := q.Get("limit"); v != "" {
		if limit, err = strconv.Atoi(v); err != nil || limit < 1 || limit > 100 {
			writeError(w, http.StatusBadRequest, "limit must be an integer between 1 and 100")
			return
		}
	}
	if tok := q.Get("nextToken"); tok != "" {
		if f.AfterStarted, f.AfterID, err = decodeCursor(tok); err != nil {
			writeError(w, http.StatusBadRequest, "invalid nextToken")
			return
		}
	}
	running, err := s.mgr.CountRunning(r.Context(), teamOf(r))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	f.Limit = limit + 1 // one extra row tells whether another page exists
	rows, err := s.mgr.List(r.Context(), f)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if len(rows) > limit {
		rows = rows[:limit]
		w.Header().Set("X-Next-Token", encodeCursor(rows[limit-1]))
	}
	w.Header().Set("X-Total-Running", strconv.Itoa(running))
	names, err := s.volumeNames(r.Context(), rows...)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	out := make([]listedSandbox, 0, len(rows))
	for _, sb := range rows {
		out = append(out, listed(sb, names))
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) listV1(w http.ResponseWriter, r *http.Request) {
	md, err := parseMetadataFilter(r.URL.Query().Get("metadata"))
	if err != nil {
		writeError(w, http.StatusBadRequest, "invalid metadata filter: "+err.Error())
		return
	}
	rows, err := s.mgr.List(r.Context(), store.SandboxFilter{TeamID: teamOf(r), States: []store.SandboxState{store.StateRunning}, Metadata: md})
	if err != nil {
		s.fail(w, r, err)
		return
	}
	names, err := s.volumeNames(r.Context(), rows...)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	out := make([]listedSandbox, 0, len(rows))
	for _, sb := range rows {
		out = append(out, listed(sb, names))
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) get(w http.ResponseWriter, r *http.Request) {
	sb, err := s.mgr.Get(r.Context(), chi.URLParam(r, "id"))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	names, err := s.volumeNames(r.Context(), sb)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	d := sandboxDetail{listedSandbox: listed(sb, names), EnvdAccessToken: sb.EnvdToken, Domain: s.domain()}
	ai := sb.Network.AllowInternet
	d.AllowInternetAccess = &ai
	apt := sb.Network.AllowPublicTraffic
	d.Network = networkConfig{AllowPublicTraffic: &apt, AllowOut: sb.Network.AllowOut, DenyOut: sb.Network.DenyOut, MaskRequestHost: sb.Network.MaskRequestHost, HTTPSPorts: sb.Network.HTTPSPorts}
	d.Network.EgressProxy, d.Network.Rules = egressOut(sb.Network)
	d.Network.DNSServers = sb.Network.DNSServers
	d.Lifecycle.AutoResume = sb.AutoResume
	d.Lifecycle.OnTimeout = "kill"
	if sb.AutoPause {
		d.Lifecycle.OnTimeout = "pause"
	}
	writeJSON(w, http.StatusOK, d)
}

func (s *Server) kill(w http.ResponseWriter, r *http.Request) {
	if err := s.mgr.Kill(r.Context(), chi.URLParam(r, "id"), "killed by request"); err != nil {
		s.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) setTimeout(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Timeout *int64 `json:"timeout"`
	}
	if !s.decode(w, r, &req, false) {
		return
	}
	if req.Timeout == nil {
		writeError(w, http.StatusBadRequest, "timeout (seconds, >= 0) is required")
		return
	}
	d, msg := timeoutDuration(*req.Timeout)
	if msg != "" {
		writeError(w, http.StatusBadRequest, msg)
		return
	}
	if err := s.mgr.SetTimeout(r.Context(), chi.URLParam(r, "id"), d); err != nil {
		s.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) refresh(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Duration *int64 `json:"duration"`
	}
	if !s.decode(w, r, &req, true) {
		return
	}
	d := int64(0)
	if req.Duration != nil {
		d = *req.Duration
	}
	if d < 0 || d > 3600 {
		writeError(w, http.StatusBadRequest, "duration must be between 0 and 3600 seconds")
		return
	}
	if err := s.mgr.Refresh(r.Context(), chi.URLParam(r, "id"), time.Duration(d)*time.Second); err != nil {
		s.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) pause(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Memory *bool `json:"memory"`
	}
	if !s.decode(w, r, &req, true) {
		return
	}
	if err := s.mgr.Pause(r.Context(), chi.URLParam(r, "id"), req.Memory == nil || *req.Memory); err != nil {
		s.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) connectCommon(w http.ResponseWriter, r *http.Request, timeout *int64, def int64, alwaysCreated, reboot bool) {
	t := def
	if timeout != nil {
		t = *timeout
	}
	d, msg := timeoutDuration(t)
	if msg != "" {
		writeError(w, http.StatusBadRequest, msg)
		return
	}
	sb, resumed, err := s.mgr.Connect(r.Context(), chi.URLParam(r, "id"), d, reboot)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	status := http.StatusOK
	if resumed || alwaysCreated {
		status = http.StatusCreated
	}
	writeJSON(w, status, s.sandboxResponse(sb))
}

func (s *Server) connectV1(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Timeout *int64 `json:"timeout"`
	}
	if !s.decode(w, r, &req, true) {
		return
	}
	// No timeout (CubeSandbox's connect(id)) keeps the sandbox's own unless
	// it ends sooner than the default: a connect only ever extends.
	s.connectCommon(w, r, req.Timeout, int64(control.DefaultTimeout/time.Second), false, false)
}

func (s *Server) connectV2(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Timeout *int64 `json:"timeout"`
		// Memory false is e2b's onResume: 'reboot'.
		Memory *bool `json:"memory"`
	}
	if !s.decode(w, r, &req, true) {
		return
	}
	s.connectCommon(w, r, req.Timeout, int64(control.DefaultTimeout/time.Second), false, req.Memory != nil && !*req.Memory)
}

// resume is the deprecated route: it only resumes paused sandboxes.
func (s *Server) resume(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Timeout *int64 `json:"timeout"`
	}
	if !s.decode(w, r, &req, true) {
		return
	}
	sb, err := s.mgr.Get(r.Context(), chi.URLParam(r, "id"))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	// A lost sandbox was running or paused: Connect resumes it on another
	// node from its pause package, or names why it cannot.
	if sb.State != store.StatePaused && sb.State != store.StateLost {
		writeError(w, http.StatusConflict, fmt.Sprintf("sandbox '%s' is not paused", sb.ID))
		return
	}
	s.connectCommon(w, r, req.Timeout, 15, true, false)
}

func (s *Server) updateNetwork(w http.ResponseWriter, r *http.Request) {
	var req networkUpdate
	if !s.decode(w, r, &req, false) {
		return
	}
	n, msg := req.network()
	if msg != "" {
		writeError(w, http.StatusBadRequest, msg)
		return
	}
	if err := s.mgr.UpdateNetwork(r.Context(), chi.URLParam(r, "id"), n); err != nil {
		s.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
