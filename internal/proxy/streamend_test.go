package proxy

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"testing"
)

func envelope(flags byte, payload string) []byte {
	b := make([]byte, 5, 5+len(payload))
	b[0] = flags
	binary.BigEndian.PutUint32(b[1:], uint32(len(payload)))
	return append(b, payload...)
}

// cutBody yields data in small reads, then fails with err.
type cutBody struct {
	data []byte
	err  error
}

func (c *cutBody) Read(p []byte) (int, error) {
	if len(c.data) == 0 {
		return 0, c.err
	}
	n := copy(p[:min(len(p), 3)], c.data) // split envelopes across reads
	c.data = c.data[n:]
	return n, nil
}
func (c *cutBody) Close() error { return nil }

// A Connect stream cut between envelopes ends with an unavailable error, as
// e2b's proxy ends it; one that ended properly, or was cut inside an
// envelope, is passed on as it came.
func TestEndStream(t *testing.T) {
	msgs := append(envelope(0, `{"event":1}`), envelope(0, `{"event":2}`)...)
	cut := errors.New("connection reset by peer")
	const why = "the connection to sandbox x ended before the stream completed"
	read := func(body io.ReadCloser) ([]byte, error) {
		return io.ReadAll(&endStream{body: body, msg: why})
	}

	for _, end := range []error{cut, io.EOF, io.ErrUnexpectedEOF} {
		got, err := read(&cutBody{data: bytes.Clone(msgs), err: end})
		if err != nil || !bytes.HasPrefix(got, msgs) {
			t.Fatalf("cut by %v between envelopes: %q %v", end, got, err)
		}
		tail := got[len(msgs):]
		if len(tail) < 5 || tail[0] != connectEndStream || int(binary.BigEndian.Uint32(tail[1:5])) != len(tail)-5 {
			t.Fatalf("cut by %v: no end-of-stream envelope: %q", end, tail)
		}
		var e struct {
			Error struct{ Code, Message string } `json:"error"`
		}
		if err := json.Unmarshal(tail[5:], &e); err != nil || e.Error.Code != "unavailable" || e.Error.Message != why {
			t.Fatalf("end-of-stream payload %q: %v", tail[5:], err)
		}
	}

	// Ended by the upstream itself: nothing added.
	full := append(bytes.Clone(msgs), envelope(connectEndStream, `{}`)...)
	if got, err := read(&cutBody{data: bytes.Clone(full), err: io.EOF}); err != nil || !bytes.Equal(got, full) {
		t.Fatalf("a stream that ended: %q %v", got, err)
	}
	// Cut inside an envelope: cannot be mended, the failure passes on.
	half := msgs[:len(msgs)-4]
	if got, err := read(&cutBody{data: bytes.Clone(half), err: cut}); !errors.Is(err, cut) || !bytes.Equal(got, half) {
		t.Fatalf("cut inside an envelope: %q %v", got, err)
	}
	if got, err := read(&cutBody{data: msgs[:3], err: cut}); !errors.Is(err, cut) || len(got) != 3 {
		t.Fatalf("cut inside a prefix: %q %v", got, err)
	}

	for ct, want := range map[string]bool{
		"application/connect+proto": true, "application/connect+json; charset=utf-8": true,
		"application/proto": false, "application/json": false, "": false,
	} {
		if got := connectStreaming(&http.Response{Header: http.Header{"Content-Type": {ct}}}); got != want {
			t.Errorf("connectStreaming(%q) = %v", ct, got)
		}
	}
}
