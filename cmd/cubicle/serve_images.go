package main

import (
	"errors"
	"net/http"
	"strings"
	"time"

	"github.com/cubicle-dev/cubicle/internal/clusterpki"
	"github.com/cubicle-dev/cubicle/internal/image"
	"github.com/cubicle-dev/cubicle/internal/node"
	"github.com/cubicle-dev/cubicle/internal/nodejoin"
	"github.com/cubicle-dev/cubicle/internal/store"
	"github.com/cubicle-dev/cubicle/internal/template/clusterbuild"
)

// nodeRegistry serves the control plane's OCI registry to cluster nodes
// under /v2/ on the cluster's TLS server name (clusterpki.JoinServerName)
// only: read-only, by digest, to a client certificate that names a node
// (image.ForCluster), and pushes from a node labelled builder=true with a
// build's credentials and was not forgotten since it was issued
// (clusterpki.RequestNode checks the revocation). Every other request
// goes to next. Without joins (no TLS) there are no nodes and nothing
// changes.
func nodeRegistry(next http.Handler, join *nodejoin.Service, nodes store.NodeStore, reg *image.Registry) http.Handler {
	if join == nil || reg == nil {
		return next
	}
	// A node labelled builder=true (its join token's labels, in its row)
	// may also push, with the password only build sessions present.
	isBuilder := func(r *http.Request, id string) (bool, error) {
		n, err := nodes.GetNode(r.Context(), id)
		if errors.Is(err, store.ErrNotFound) {
			return false, nil // joined, not registered yet
		}
		if err != nil {
			return false, err
		}
		return clusterbuild.IsBuilder(n.Labels), nil
	}
	view := image.ForCluster(reg, func(r *http.Request) (string, error) { return join.CA.RequestNode(r, time.Now(), join.Store) }, isBuilder)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.TLS != nil && r.TLS.ServerName == clusterpki.JoinServerName && (r.URL.Path == "/v2" || strings.HasPrefix(r.URL.Path, "/v2/")) {
			view.ServeHTTP(w, r)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// imageDigest is a template image's reference ("repo:tag" in the image
// store) as a node asks the registry for it: repository and manifest
// digest (control.Config.ImageDigest).
func (t *templateStack) imageDigest(ref string) (node.Image, error) {
	norm, err := image.NormalizeRef(ref)
	if err != nil {
		return node.Image{}, err
	}
	d, err := t.images.Resolve(norm)
	if err != nil {
		return node.Image{}, err
	}
	repo := norm[:strings.LastIndex(norm, ":")]
	return node.Image{Name: repo, Digest: d.Digest.String()}, nil
}
