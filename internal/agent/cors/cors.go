// Package cors answers cross-origin requests the way envd does: any origin,
// preflights included. Browsers reach the agent's servers (envd on 49983,
// the code interpreter on 49999) through the proxy from any page.
package cors

import "net/http"

// Handler wraps next; expose lists the response headers scripts may read
// ("" for none).
func Handler(next http.Handler, expose string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Access-Control-Allow-Origin", "*")
		h.Set("Access-Control-Allow-Methods", "GET, POST, PUT, PATCH, DELETE, OPTIONS")
		h.Set("Access-Control-Allow-Headers", "*")
		if expose != "" {
			h.Set("Access-Control-Expose-Headers", expose)
		}
		h.Set("Access-Control-Max-Age", "7200")
		if r.Method == http.MethodOptions {
			w.WriteHeader(http.StatusNoContent)
			return
		}
		next.ServeHTTP(w, r)
	})
}
