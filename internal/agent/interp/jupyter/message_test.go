package jupyter

import (
	"encoding/json"
	"errors"
	"testing"
)

func TestEncodeDecodeRoundTripVerifiesSignature(t *testing.T) {
	s := NewSigner("secret")
	m := &Message{
		Identities:   [][]byte{[]byte("peer")},
		Header:       NewHeader("sess", "execute_request"),
		ParentHeader: NewHeader("sess", "kernel_info_request"),
		Content:      json.RawMessage(`{"code":"1+1"}`),
	}
	frames, err := s.Encode(m)
	if err != nil {
		t.Fatal(err)
	}
	if string(frames[1]) != "<IDS|MSG>" || len(frames[2]) != 64 {
		t.Fatalf("frames: delimiter %q, signature %q", frames[1], frames[2])
	}
	got, err := s.Decode(frames)
	if err != nil {
		t.Fatal(err)
	}
	if got.Header != m.Header || got.ParentHeader.MsgID != m.ParentHeader.MsgID || string(got.Content) != `{"code":"1+1"}` || string(got.Identities[0]) != "peer" {
		t.Fatalf("round trip: %+v", got)
	}

	frames[6] = []byte(`{"code":"2+2"}`)
	if _, err := s.Decode(frames); !errors.Is(err, ErrBadSignature) {
		t.Fatalf("tampered content: err = %v, want ErrBadSignature", err)
	}
	if _, err := NewSigner("other").Decode(frames); !errors.Is(err, ErrBadSignature) {
		t.Fatalf("wrong key: err = %v, want ErrBadSignature", err)
	}
	if _, err := s.Decode(frames[:4]); !errors.Is(err, ErrMalformed) {
		t.Fatalf("truncated: err = %v, want ErrMalformed", err)
	}
}

func TestEmptyParentHeaderIsEmptyObject(t *testing.T) {
	frames, err := NewSigner("k").Encode(&Message{Header: NewHeader("s", "kernel_info_request")})
	if err != nil {
		t.Fatal(err)
	}
	if string(frames[3]) != "{}" || string(frames[4]) != "{}" || string(frames[5]) != "{}" {
		t.Fatalf("parent/metadata/content = %s %s %s, want {}", frames[3], frames[4], frames[5])
	}
}

func TestSanitizeJSONReplacesNonFiniteOutsideStrings(t *testing.T) {
	in := `{"a":[NaN,-Infinity,Infinity,1.5],"s":"NaN \"Infinity\""}`
	out := string(sanitizeJSON([]byte(in)))
	want := `{"a":[null,null,null,1.5],"s":"NaN \"Infinity\""}`
	if out != want {
		t.Fatalf("got %s\nwant %s", out, want)
	}
	if !json.Valid([]byte(out)) {
		t.Fatal("still invalid")
	}
}
