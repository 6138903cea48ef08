package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"slices"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/cubicle-dev/cubicle/internal/clusterpki"
	"github.com/cubicle-dev/cubicle/internal/network"
	"github.com/cubicle-dev/cubicle/internal/nodeclient"
	"github.com/cubicle-dev/cubicle/internal/secret"
	"github.com/cubicle-dev/cubicle/internal/store"
)

// nodeCallRoutes serves the calls node agents make (nodeclient). They carry
// no API key: the caller is the node its mTLS certificate names.
func (s *Server) nodeCallRoutes(r chi.Router) {
	r.Post(nodeclient.RegisterPath, s.nodeRegister)
	r.Post(nodeclient.HeartbeatPath, s.nodeHeartbeat)
	r.Post(nodeclient.RenewPath, s.nodeRenew)
	if s.cfg.Secrets != nil {
		r.Post(nodeclient.SecretPath, s.nodeSecret)
	}
}

// callerNode is the node the request's client certificate names; ok is
// false once a 401 is written.
func (s *Server) callerNode(w http.ResponseWriter, r *http.Request) (string, bool) {
	if r.TLS == nil || len(r.TLS.PeerCertificates) == 0 {
		writeError(w, http.StatusUnauthorized, "a node call needs the node's client certificate (mTLS to server name "+clusterpki.JoinServerName+")")
		return "", false
	}
	// One primary-key read of the node's revocation per call (no cache),
	// so a forget holds on every replica from the node's next call.
	id, err := s.cfg.Join.CA.AuthenticateNode(r.Context(), r.TLS.PeerCertificates[0], time.Now(), s.cfg.Join.Store)
	switch {
	case err == nil:
		return id, true
	case errors.Is(err, clusterpki.ErrRevoked):
		s.log.Warn("node call refused: node forgotten", "path", r.URL.Path, "from", r.RemoteAddr, "err", err)
		writeError(w, http.StatusUnauthorized, err.Error())
	case errors.Is(err, clusterpki.ErrIdentity):
		s.log.Warn("node call refused", "path", r.URL.Path, "from", r.RemoteAddr, "err", err)
		writeError(w, http.StatusUnauthorized, "the client certificate is not a node identity of this cluster")
	default:
		s.fail(w, r, err)
	}
	return "", false
}

// decodeNodeBody reads a strict JSON body; ok is false once an error is
// written.
func decodeNodeBody(w http.ResponseWriter, r *http.Request, v any) bool {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, 1<<20))
	if err != nil {
		writeError(w, http.StatusRequestEntityTooLarge, "node call body over 1 MiB")
		return false
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		if f, ok := unknownField(err); ok {
			writeError(w, http.StatusBadRequest, "unknown field "+f+" in the body")
			return false
		}
		writeError(w, http.StatusBadRequest, "malformed JSON body: "+err.Error())
		return false
	}
	if dec.More() {
		writeError(w, http.StatusBadRequest, "malformed JSON body: data after the JSON object")
		return false
	}
	return true
}

func (s *Server) nodeStatus(w http.ResponseWriter, r *http.Request) (string, *nodeclient.Status, string, bool) {
	id, ok := s.callerNode(w, r)
	if !ok {
		return "", nil, "", false
	}
	var st nodeclient.Status
	if !decodeNodeBody(w, r, &st) {
		return "", nil, "", false
	}
	if err := st.Validate(); err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return "", nil, "", false
	}
	var accels string
	if len(st.Accelerators) > 0 {
		b, err := json.Marshal(st.Accelerators)
		if err != nil {
			s.fail(w, r, err)
			return "", nil, "", false
		}
		accels = string(b)
	}
	return id, &st, accels, true
}

func (s *Server) nodeRegister(w http.ResponseWriter, r *http.Request) {
	id, st, accels, ok := s.nodeStatus(w, r)
	if !ok {
		return
	}
	labels, err := s.nodeLabels(r, id)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	n := &store.Node{ID: id, Address: st.Address, DataAddress: st.DataAddress, Labels: labels, Capacity: st.Capacity,
		Runtime: st.Runtime, Version: st.Version, VolumeDrivers: st.VolumeDrivers, Accelerators: accels, Templates: st.Templates}
	if err := s.store.RegisterNode(r.Context(), n); err != nil {
		s.fail(w, r, err)
		return
	}
	s.log.Info("node registered", "node", id, "address", st.Address, "data_address", st.DataAddress, "runtime", st.Runtime)
	writeJSON(w, http.StatusOK, struct{}{})
}

// nodeLabels are the labels a registering node gets: its row's when it has
// one (a restarted node), else those of the join token it redeemed.
func (s *Server) nodeLabels(r *http.Request, id string) (map[string]string, error) {
	row, err := s.store.GetNode(r.Context(), id)
	if err == nil {
		return row.Labels, nil
	}
	if !errors.Is(err, store.ErrNotFound) {
		return nil, err
	}
	toks, err := s.store.ListJoinTokens(r.Context())
	if err != nil {
		return nil, err
	}
	var labels map[string]string
	var at time.Time
	for _, t := range toks {
		if t.UsedBy == id && t.UsedAt.After(at) {
			labels, at = t.Labels, t.UsedAt
		}
	}
	return labels, nil
}

func (s *Server) nodeHeartbeat(w http.ResponseWriter, r *http.Request) {
	id, st, accels, ok := s.nodeStatus(w, r)
	if !ok {
		return
	}
	row, err := s.store.GetNode(r.Context(), id)
	if errors.Is(err, store.ErrNotFound) {
		writeError(w, http.StatusNotFound, "node '"+id+"' is not registered: register again")
		return
	}
	if err != nil {
		s.fail(w, r, err)
		return
	}
	err = s.store.HeartbeatNode(r.Context(), id, store.NodeHeartbeat{Address: st.Address, DataAddress: st.DataAddress, Labels: row.Labels,
		Capacity: st.Capacity, VolumeDrivers: st.VolumeDrivers, Accelerators: accels, Templates: st.Templates})
	if errors.Is(err, store.ErrNotFound) {
		// Forgotten between the read and the write.
		writeError(w, http.StatusNotFound, "node '"+id+"' is not registered: register again")
		return
	}
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, struct{}{})
}

func (s *Server) nodeRenew(w http.ResponseWriter, r *http.Request) {
	id, ok := s.callerNode(w, r)
	if !ok {
		return
	}
	var req nodeclient.RenewRequest
	if !decodeNodeBody(w, r, &req) {
		return
	}
	peer := r.TLS.PeerCertificates[0]
	addrs := slices.Clone(peer.DNSNames)
	for _, ip := range peer.IPAddresses {
		addrs = append(addrs, ip.String())
	}
	cert, err := s.cfg.Join.CA.RenewNode(r.Context(), peer, []byte(req.CSR), addrs, time.Now(), s.cfg.Join.Store)
	switch {
	case err == nil:
		s.log.Info("node certificate renewed", "node", id)
		writeJSON(w, http.StatusOK, nodeclient.RenewResponse{Certificate: string(cert)})
	case errors.Is(err, clusterpki.ErrInvalidCSR), errors.Is(err, clusterpki.ErrInvalidAddress):
		writeError(w, http.StatusBadRequest, err.Error())
	case errors.Is(err, clusterpki.ErrIdentity), errors.Is(err, clusterpki.ErrRevoked):
		writeError(w, http.StatusUnauthorized, err.Error())
	default:
		s.fail(w, r, err)
	}
}

// nodeSecret gives a node a secret's value only for a sandbox that runs on
// that node and whose current network rules name the secret: a compromised
// node learns the secrets its own sandboxes' rules use, nothing more.
func (s *Server) nodeSecret(w http.ResponseWriter, r *http.Request) {
	id, ok := s.callerNode(w, r)
	if !ok {
		return
	}
	var req nodeclient.SecretRequest
	if !decodeNodeBody(w, r, &req) {
		return
	}
	// A missing sandbox reads like another node's: a node cannot probe IDs.
	refused := "sandbox '" + req.SandboxID + "' on node '" + id + "' has no network rule using secret '" + req.Name + "'"
	sb, err := s.store.GetSandbox(r.Context(), req.SandboxID)
	if errors.Is(err, store.ErrNotFound) {
		writeError(w, http.StatusForbidden, refused)
		return
	}
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if sb.Node != id || !sb.State.Live() || !rulesName(sb.Network.Rules, req.Name) {
		s.log.Warn("node secret refused", "node", id, "sandbox", req.SandboxID, "sandbox_node", sb.Node, "secret", req.Name)
		writeError(w, http.StatusForbidden, refused)
		return
	}
	v, err := s.cfg.Secrets.Resolve(r.Context(), sb.TeamID, req.Name)
	if errors.Is(err, secret.ErrNotFound) {
		writeError(w, http.StatusNotFound, "secret '"+req.Name+"' not found")
		return
	}
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, nodeclient.SecretResponse{Value: v})
}

// rulesName: some header of rules refers to secret name.
func rulesName(rules map[string][]store.NetworkRule, name string) bool {
	want := secret.CanonicalName(name)
	for _, rs := range rules {
		for _, rule := range rs {
			for _, v := range rule.Headers {
				for _, n := range network.SecretNames(v) {
					if secret.CanonicalName(n) == want {
						return true
					}
				}
			}
		}
	}
	return false
}
