package api

import (
	"errors"
	"net/url"
	"reflect"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/store"
)

// sdkMetadataQuery encodes md as the SDKs do before the HTTP layer's own
// encoding: each key and value escaped, the pairs joined, and the result
// escaped again pair by pair (URLSearchParams over encodeURIComponent).
func sdkMetadataQuery(md map[string]string) string {
	keys := make([]string, 0, len(md))
	for k := range md {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var pairs []string
	for _, k := range keys {
		pairs = append(pairs, url.QueryEscape(url.QueryEscape(k))+"="+url.QueryEscape(url.QueryEscape(md[k])))
	}
	return strings.Join(pairs, "&")
}

// FuzzMetadataFilter: ?metadata= either parses or fails with a
// *url.EscapeError, and whatever it parses to survives the SDK's encoding.
func FuzzMetadataFilter(f *testing.F) {
	for _, s := range []string{"user%2520id=a%2526b", "k=v&k2=v2", "a%253Db=c%2526d", "=", "&&", "k", "%zz", "k=%", "%25zz=1", "k=v=w"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		md, err := parseMetadataFilter(raw)
		if err != nil {
			var ee url.EscapeError
			if !errors.As(err, &ee) {
				t.Fatalf("error %v (%T) is not a url.EscapeError", err, err)
			}
			return
		}
		if len(md) == 0 {
			return
		}
		again, err := parseMetadataFilter(sdkMetadataQuery(md))
		if err != nil || !reflect.DeepEqual(again, md) {
			t.Fatalf("round trip of %q: %q, %v", md, again, err)
		}
	})
}

// FuzzListCursor: a nextToken either decodes or is refused; encoding what
// it decodes to gives a token that decodes to the same position.
func FuzzListCursor(f *testing.F) {
	f.Add(encodeCursor(&store.Sandbox{StartedAt: time.Unix(1700000000, 5), ID: "abc"}))
	f.Add("!!")
	f.Add("")
	f.Add("MTox")
	f.Fuzz(func(t *testing.T, tok string) {
		ts, id, err := decodeCursor(tok)
		if err != nil {
			return
		}
		ts2, id2, err := decodeCursor(encodeCursor(&store.Sandbox{StartedAt: ts, ID: id}))
		if err != nil || !ts2.Equal(ts) || id2 != id {
			t.Fatalf("cursor %q: %v %q -> %v %q %v", tok, ts, id, ts2, id2, err)
		}
	})
}
