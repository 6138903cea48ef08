package proxy

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"net/http"
	"strings"
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

// A Connect stream whose upstream ends before its end-of-stream message,
// cleanly or not, between envelopes or inside one, fails the read after
// passing on every byte that came (the reverse proxy then drops the
// transport, which e2b's SDKs read as the sandbox gone mid-request); one
// that ended properly is passed on as it came.
func TestEndStream(t *testing.T) {
	msgs := append(envelope(0, `{"event":1}`), envelope(0, `{"event":2}`)...)
	cut := errors.New("connection reset by peer")
	const why = "the connection to sandbox x ended before the stream completed"
	read := func(body io.ReadCloser) ([]byte, error) {
		return io.ReadAll(&endStream{body: body, msg: why})
	}
	for _, data := range [][]byte{msgs, msgs[:len(msgs)-4], msgs[:3], nil} {
		for _, end := range []error{cut, io.EOF, io.ErrUnexpectedEOF} {
			got, err := read(&cutBody{data: bytes.Clone(data), err: end})
			if !errors.Is(err, errStreamCut) || !bytes.Equal(got, data) || !strings.Contains(err.Error(), why) {
				t.Fatalf("%d bytes then %v: %q %v, want every byte and a cut", len(data), end, got, err)
			}
			if end != io.EOF && !errors.Is(err, end) {
				t.Fatalf("the upstream's error %v is lost: %v", end, err)
			}
		}
	}
	// Ended by the upstream itself: passed on as it came.
	full := append(bytes.Clone(msgs), envelope(connectEndStream, `{}`)...)
	if got, err := read(&cutBody{data: bytes.Clone(full), err: io.EOF}); err != nil || !bytes.Equal(got, full) {
		t.Fatalf("a stream that ended: %q %v", got, err)
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
