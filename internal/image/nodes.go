package image

import (
	"net/http"
	"strings"
)

// ForNodes serves the registry to cluster nodes, which pull the images
// their sandboxes boot from. identify names the node a request comes from
// (in serve: its client certificate, checked by the cluster CA); a request
// it refuses gets 401, whatever it asks.
//
// Nodes only read, and only by digest: no pushes, no tags, no listing. A
// node learns an image's digest from the create requests it is sent, so a
// node cannot enumerate the templates of teams it runs nothing for (blobs
// are global to the store, so the digest is the capability). BuildKit keeps
// its own password-protected loopback view (RequireBasicAuth), which this
// handler does not use.
func ForNodes(r *Registry, identify func(*http.Request) (string, error)) http.Handler {
	return ForCluster(r, identify, nil)
}

// ForCluster is ForNodes where some nodes build templates. isBuilder says
// whether the identified node is one (in serve: its row is labelled
// builder=true); nil: none is. A builder's buildkitd pulls bases by name
// and pushes its result, so a builder node that presents a build's
// credentials (GrantBuild, handed out by the control plane's session for
// that build only) gets the whole registry:
//
//   - credentials from a node that is not a builder: 403;
//   - a builder without credentials asking for more than a read by digest:
//     401 with a Basic challenge (which makes buildkitd ask its session);
//   - a builder with wrong credentials: 401;
//   - a push by a node that is not a builder: 403.
//
// Reads by digest stay open to every node, builders included.
func ForCluster(r *Registry, identify func(*http.Request) (string, error), isBuilder func(req *http.Request, nodeID string) (bool, error)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		w.Header().Set("Docker-Distribution-API-Version", "registry/2.0")
		id, err := identify(req)
		if err != nil {
			writeErr(w, regError{http.StatusUnauthorized, "UNAUTHORIZED", "a cluster node certificate is required"})
			return
		}
		builder := false
		if isBuilder != nil {
			if builder, err = isBuilder(req, id); err != nil {
				writeErr(w, regError{http.StatusServiceUnavailable, "UNAVAILABLE", "looking up node " + id + ": " + err.Error()})
				return
			}
		}
		if _, _, withCreds := req.BasicAuth(); withCreds {
			if !builder || r.user == "" {
				writeErr(w, regError{http.StatusForbidden, "DENIED", "only a node labelled builder=true, during a build, uses the registry beyond reads by digest"})
				return
			}
			r.ServeHTTP(w, req) // checks the credentials
			return
		}
		if e := nodeRead(req); e != nil {
			switch {
			case builder:
				w.Header().Set("WWW-Authenticate", `Basic realm="cubicle"`)
				writeErr(w, regError{http.StatusUnauthorized, "UNAUTHORIZED", "a build's registry credentials are required"})
			case isBuilder != nil && req.Method != http.MethodGet && req.Method != http.MethodHead:
				writeErr(w, regError{http.StatusForbidden, "DENIED", "only a node labelled builder=true pushes, with a build's credentials"})
			default:
				if e.status == http.StatusMethodNotAllowed {
					w.Header().Set("Allow", "GET, HEAD")
				}
				writeErr(w, *e)
			}
			return
		}
		r.route(w, req)
	})
}

// nodeRead refuses what is not a read by digest: the answer to a node
// without the build's credentials.
func nodeRead(req *http.Request) *regError {
	if req.Method != http.MethodGet && req.Method != http.MethodHead {
		return &regError{http.StatusMethodNotAllowed, "UNSUPPORTED", "the registry is read-only for nodes"}
	}
	p := req.URL.Path
	if p == "/v2" || p == "/v2/" {
		return nil
	}
	rest, _ := strings.CutPrefix(p, "/v2/")
	// The cases are route's, in route's order, so a path is judged as what
	// route will serve (a tags list whose repository has a "blobs"
	// component also contains "/blobs/").
	switch {
	case strings.HasSuffix(rest, "/tags/list"):
		return &regError{http.StatusForbidden, "DENIED", "nodes read manifests and blobs by digest only"}
	case strings.Contains(rest, "/blobs/uploads"):
		return &regError{http.StatusMethodNotAllowed, "UNSUPPORTED", "the registry is read-only for nodes"}
	case strings.Contains(rest, "/manifests/"):
		if ref := rest[strings.LastIndex(rest, "/manifests/")+len("/manifests/"):]; !digestRE.MatchString(ref) {
			return &regError{http.StatusForbidden, "DENIED", "nodes read manifests by digest only"}
		}
		return nil
	case strings.Contains(rest, "/blobs/"):
		return nil
	default: // anything else that lists
		return &regError{http.StatusForbidden, "DENIED", "nodes read manifests and blobs by digest only"}
	}
}
