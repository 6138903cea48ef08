package main

import (
	"net/http"
	"net/http/httptest"
	"testing"
)

// -probe-http is a Kubernetes httpGet probe: 200-399 is success (a
// redirect is not followed), anything else or no answer is not.
func TestProbeHTTP(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/ok":
		case "/moved":
			http.Redirect(w, r, "/broken", http.StatusFound)
		default:
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	}))
	for path, want := range map[string]int{"/ok": 0, "/moved": 0, "/broken": 1} {
		if got := probeHTTP(srv.URL + path); got != want {
			t.Errorf("%s: exit %d, want %d", path, got, want)
		}
	}
	url := srv.URL
	srv.Close()
	if probeHTTP(url+"/ok") != 1 {
		t.Fatal("a closed port probed ready")
	}
}
