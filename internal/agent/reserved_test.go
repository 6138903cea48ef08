package agent

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

// Only /health answers before the thread reserve is complete; everything
// else (the API, /init and its start command) waits for it.
func TestUntilReserved(t *testing.T) {
	reserved := make(chan struct{})
	served := make(chan string, 4)
	h := UntilReserved(reserved, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		served <- r.Method + " " + r.URL.Path
	}))
	srv := httptest.NewServer(h)
	defer srv.Close()

	resp, err := http.Get(srv.URL + "/health")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if got := <-served; got != "GET /health" {
		t.Fatalf("served %q", got)
	}
	done := make(chan error, 1)
	go func() {
		resp, err := http.Post(srv.URL+"/init", "application/json", nil)
		if err == nil {
			resp.Body.Close()
		}
		done <- err
	}()
	// POST /init is held: nothing reaches the handler until the reserve
	// is closed. A HEAD /health is held too (only GET passes).
	head, _ := http.NewRequest(http.MethodHead, srv.URL+"/health", nil)
	go func() {
		if resp, err := http.DefaultClient.Do(head); err == nil {
			resp.Body.Close()
		}
	}()
	select {
	case got := <-served:
		t.Fatalf("%q served before the reserve was complete", got)
	case err := <-done:
		t.Fatalf("POST /init returned before the reserve was complete: %v", err)
	case <-time.After(200 * time.Millisecond): // held, as it should be
	}
	close(reserved)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{<-served: true, <-served: true}
	if !seen["POST /init"] || !seen["HEAD /health"] {
		t.Fatalf("after the reserve: %v", seen)
	}
}
