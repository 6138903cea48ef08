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
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		w.Header().Set("Docker-Distribution-API-Version", "registry/2.0")
		if _, err := identify(req); err != nil {
			writeErr(w, regError{http.StatusUnauthorized, "UNAUTHORIZED", "a cluster node certificate is required"})
			return
		}
		if req.Method != http.MethodGet && req.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			writeErr(w, regError{http.StatusMethodNotAllowed, "UNSUPPORTED", "the registry is read-only for nodes"})
			return
		}
		p := req.URL.Path
		if p != "/v2" && p != "/v2/" {
			rest, _ := strings.CutPrefix(p, "/v2/")
			// The cases are route's, in route's order, so a path is judged
			// as what route will serve (a tags list whose repository has a
			// "blobs" component also contains "/blobs/").
			switch {
			case strings.HasSuffix(rest, "/tags/list"):
				writeErr(w, regError{http.StatusForbidden, "DENIED", "nodes read manifests and blobs by digest only"})
				return
			case strings.Contains(rest, "/blobs/uploads"):
				w.Header().Set("Allow", "GET, HEAD")
				writeErr(w, regError{http.StatusMethodNotAllowed, "UNSUPPORTED", "the registry is read-only for nodes"})
				return
			case strings.Contains(rest, "/manifests/"):
				if ref := rest[strings.LastIndex(rest, "/manifests/")+len("/manifests/"):]; !digestRE.MatchString(ref) {
					writeErr(w, regError{http.StatusForbidden, "DENIED", "nodes read manifests by digest only"})
					return
				}
			case strings.Contains(rest, "/blobs/"):
			default: // tags/list and anything else that lists
				writeErr(w, regError{http.StatusForbidden, "DENIED", "nodes read manifests and blobs by digest only"})
				return
			}
		}
		r.route(w, req)
	})
}
