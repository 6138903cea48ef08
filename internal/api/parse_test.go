package api

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/store"
)

// The JS SDK sends {"user id":"a&b"} as metadata=user%252520id%3Da%252526b.
func TestMetadataFilterTripleEncoding(t *testing.T) {
	q, err := url.ParseQuery("metadata=user%252520id%3Da%252526b&state=running,paused")
	if err != nil {
		t.Fatal(err)
	}
	md, err := parseMetadataFilter(q.Get("metadata"))
	if err != nil {
		t.Fatal(err)
	}
	if len(md) != 1 || md["user id"] != "a&b" {
		t.Fatalf("got %#v", md)
	}
	if _, err := parseMetadataFilter("%zz"); err == nil {
		t.Fatal("want error for bad escape")
	}
}

func TestStatesAndCursor(t *testing.T) {
	if _, err := parseStates("running,bogus"); err == nil {
		t.Fatal("want error for unknown state")
	}
	// A lost sandbox (node silent) is listed as paused.
	st, err := parseStates("paused")
	if err != nil || len(st) != 3 || st[2] != store.StateLost {
		t.Fatalf("%v %v", st, err)
	}
	ts := time.Unix(1700000000, 123456789)
	tok := encodeCursor(&store.Sandbox{StartedAt: ts, ID: "abc"})
	gt, id, err := decodeCursor(tok)
	if err != nil || !gt.Equal(ts) || id != "abc" {
		t.Fatalf("cursor round trip: %v %v %v", gt, id, err)
	}
	if _, _, err := decodeCursor("!!!"); err == nil {
		t.Fatal("want error for garbage token")
	}
}

func TestTimeoutDuration(t *testing.T) {
	for _, tc := range []struct {
		secs int64
		want time.Duration
		ok   bool
	}{
		{0, 0, true},
		{300, 5 * time.Minute, true},
		{maxTimeoutSeconds, time.Duration(maxTimeoutSeconds) * time.Second, true},
		{-1, 0, false},
		{maxTimeoutSeconds + 1, 0, false},
		{18446744074, 0, false}, // wrapped to 0.29 s before the check
		{1<<63 - 1, 0, false},
	} {
		d, msg := timeoutDuration(tc.secs)
		if (msg == "") != tc.ok || d != tc.want || d < 0 {
			t.Errorf("timeoutDuration(%d) = %v, %q; want %v ok=%v", tc.secs, d, msg, tc.want, tc.ok)
		}
	}
}

// Out-of-range timeouts are refused with an e2b-shaped 400 before the
// manager is asked (the Server here has none).
func TestTimeoutOverflowIs400(t *testing.T) {
	s := &Server{cfg: Config{MaxBodyBytes: 1 << 20}}
	for _, tc := range []struct {
		name string
		h    http.HandlerFunc
		body string
	}{
		{"create v1", s.createV1, `{"templateID":"base","timeout":18446744074}`},
		{"create v2", s.createV2, `{"templateID":"base","timeout":18446744074}`},
		{"create negative", s.createV2, `{"templateID":"base","timeout":-1}`},
		{"setTimeout", s.setTimeout, `{"timeout":18446744074}`},
		{"setTimeout max int64", s.setTimeout, `{"timeout":9223372036854775807}`},
		{"setTimeout past int64", s.setTimeout, `{"timeout":9223372036854775808}`},
		{"connect v1", s.connectV1, `{"timeout":18446744074}`},
		{"connect v2", s.connectV2, `{"timeout":18446744074}`},
	} {
		rec := httptest.NewRecorder()
		tc.h(rec, httptest.NewRequest(http.MethodPost, "/", strings.NewReader(tc.body)))
		var e struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
		}
		if err := json.Unmarshal(rec.Body.Bytes(), &e); err != nil || rec.Code != http.StatusBadRequest || e.Code != http.StatusBadRequest || e.Message == "" {
			t.Errorf("%s: %d %s", tc.name, rec.Code, rec.Body)
		}
	}
}
