package api

import (
	"net/url"
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
	st, err := parseStates("paused")
	if err != nil || len(st) != 2 {
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
