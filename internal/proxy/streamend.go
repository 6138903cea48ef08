package proxy

import (
	"encoding/binary"
	"errors"
	"io"
	"mime"
	"net/http"
	"strings"
)

// A Connect stream (a command's output, a watch) whose sandbox ends mid-way
// loses its connection to the agent, often as a clean EOF between two
// envelopes. Passed on as that, the response ends properly without the
// stream's end-of-stream message and the client reports a body error it
// cannot explain. e2b's SDKs recognise the sandbox dying mid-request by the
// transport dropping the stream (undici's "terminated", an HTTP/2 reset,
// httpx/pyqwest's read error): they then ask the sandbox's /health, which
// answers 502 "The sandbox was not found" once it was killed, and raise
// "The sandbox was killed or reached its end of life while the request was
// in flight". Every version does that for a dropped transport, while an
// unavailable end-stream is read as a sandbox timeout by the JS SDKs (up to
// at least 2.51), so this proxy drops the transport: endStream turns any
// end of the upstream before the end-of-stream message into a read error,
// on which the reverse proxy aborts the response (the connection is closed
// without the final chunk, or the HTTP/2 stream is reset).

// connectStreaming reports whether res is a Connect streaming response
// (application/connect+proto, application/connect+json, ...).
func connectStreaming(res *http.Response) bool {
	mt, _, err := mime.ParseMediaType(res.Header.Get("Content-Type"))
	return err == nil && strings.HasPrefix(mt, "application/connect+")
}

// errStreamCut is the read error of a Connect stream whose upstream ended
// before its end-of-stream message.
var errStreamCut = errors.New("the upstream ended before the stream completed")

// endStream passes the upstream's envelopes through and fails the read
// when the upstream ends (cleanly or not) before its end-of-stream
// envelope.
type endStream struct {
	body io.ReadCloser
	msg  string // for the error, naming the sandbox

	hdr   [5]byte // the envelope prefix being read: flags, big-endian length
	hdrN  int
	left  uint64 // payload bytes of the current envelope still to come
	ended bool   // the upstream sent its end-of-stream envelope
}

func (s *endStream) Read(p []byte) (int, error) {
	n, err := s.body.Read(p)
	s.track(p[:n])
	if err == nil || s.ended {
		return n, err
	}
	// Ended without an end of stream: whatever the upstream's error, the
	// client must see the transport fail, not a body that ended.
	cut := &streamCutError{msg: s.msg, err: err}
	if n > 0 {
		// Deliver what came first; the body's next read fails again.
		s.body = failedBody{cut}
		return n, nil
	}
	return 0, cut
}

func (s *endStream) track(b []byte) {
	for len(b) > 0 {
		if s.left > 0 {
			k := min(s.left, uint64(len(b)))
			s.left -= k
			b = b[k:]
			continue
		}
		s.hdr[s.hdrN] = b[0]
		s.hdrN++
		b = b[1:]
		if s.hdrN == len(s.hdr) {
			s.hdrN = 0
			s.left = uint64(binary.BigEndian.Uint32(s.hdr[1:]))
			if s.hdr[0]&connectEndStream != 0 {
				s.ended = true
			}
		}
	}
}

func (s *endStream) Close() error { return s.body.Close() }

// connectEndStream is the envelope flag of a Connect end-of-stream message.
const connectEndStream = 0x02

type streamCutError struct {
	msg string
	err error
}

func (e *streamCutError) Error() string { return e.msg + ": " + e.err.Error() }

func (e *streamCutError) Is(target error) bool { return target == errStreamCut }

func (e *streamCutError) Unwrap() error { return e.err }

// failedBody is a body whose reads fail with err (its close is a no-op:
// the upstream's body was already read to its end).
type failedBody struct{ err error }

func (f failedBody) Read([]byte) (int, error) { return 0, f.err }
func (f failedBody) Close() error             { return nil }
