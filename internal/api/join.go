package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"math"
	"net/http"
	"strconv"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/cubicle-dev/cubicle/internal/clientrate"
	"github.com/cubicle-dev/cubicle/internal/clusterpki"
	"github.com/cubicle-dev/cubicle/internal/nodejoin"
	"github.com/cubicle-dev/cubicle/internal/store"
)

// Joins carry no API key (the token is the credential), so they are
// limited per client address: a join is a store write and a signature,
// and a fleet joining at once comes from many addresses.
const (
	joinRate  = 1
	joinBurst = 10
)

// joinRoutes serves POST /nodes/join when the control plane has a cluster
// CA to sign with (cfg.Join).
func (s *Server) joinRoutes(r chi.Router) {
	lim := clientrate.New(joinRate, joinBurst, clientrate.MaxClients)
	r.Post(nodejoin.Path, func(w http.ResponseWriter, r *http.Request) { s.join(w, r, lim) })
}

func (s *Server) join(w http.ResponseWriter, r *http.Request, lim *clientrate.Limiter) {
	if ok, retry := lim.Allow(clientrate.RemoteAddr(r), time.Now()); !ok {
		w.Header().Set("Retry-After", strconv.Itoa(int(math.Ceil(retry.Seconds()))))
		writeError(w, http.StatusTooManyRequests, "too many join requests from this address")
		return
	}
	// The node checked, before sending its token, that this connection
	// presents the cluster certificate, which it asks for by server name.
	// A join arriving any other way was sent by a client that did not
	// check, so its token may have gone to anyone: refuse it.
	if r.TLS == nil || r.TLS.ServerName != clusterpki.JoinServerName {
		writeError(w, http.StatusBadRequest, "a join must come over TLS to server name "+clusterpki.JoinServerName+
			" (as `cubicle node join` sends it), so the node can verify the cluster CA before it sends its token")
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, 64<<10))
	if err != nil {
		writeError(w, http.StatusRequestEntityTooLarge, "join request body over 64 KiB")
		return
	}
	var req nodejoin.Request
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		if f, ok := unknownField(err); ok {
			writeError(w, http.StatusBadRequest, "unknown field "+f+" in the join request")
			return
		}
		writeError(w, http.StatusBadRequest, "malformed JSON body: "+err.Error())
		return
	}
	if dec.More() {
		writeError(w, http.StatusBadRequest, "malformed JSON body: data after the JSON object")
		return
	}
	out, err := s.cfg.Join.Join(r.Context(), req)
	switch {
	case err == nil:
		s.log.Info("node joined", "node", out.NodeID, "from", r.RemoteAddr)
		writeJSON(w, http.StatusOK, out)
	case errors.Is(err, nodejoin.ErrTokenRefused):
		// Unknown, used, expired or malformed all read alike to the caller.
		s.log.Warn("node join refused", "node", req.NodeID, "from", r.RemoteAddr, "err", err)
		writeError(w, http.StatusUnauthorized, "join token refused: it is unknown, already used or expired")
	case errors.Is(err, store.ErrNodeExists):
		writeError(w, http.StatusConflict, "node '"+req.NodeID+"' has joined already (registered or not): forget it first (`cubicle node forget "+req.NodeID+"`), or join with another node ID; the token was not used")
	case errors.Is(err, clusterpki.ErrInvalidNodeID), errors.Is(err, clusterpki.ErrInvalidCSR), errors.Is(err, clusterpki.ErrInvalidAddress):
		writeError(w, http.StatusBadRequest, err.Error())
	default:
		s.fail(w, r, err)
	}
}
