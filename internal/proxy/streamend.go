package proxy

import (
	"encoding/binary"
	"encoding/json"
	"io"
	"mime"
	"net/http"
	"strings"
)

// A Connect stream (a command's output, a watch) whose sandbox ends mid-way
// loses its connection to the agent. Passed on as it is, the client sees a
// body cut short ("request or response body error") and cannot tell why.
// e2b's proxy ends such a stream with a Connect error instead, code
// unavailable, "the connection to sandbox <id> ended before the stream
// completed"; the SDKs then ask the sandbox's /health, which answers 502
// "The sandbox was not found" once it was killed, and raise "the sandbox was
// killed or reached its end of life". So does this proxy: endStream wraps the
// body of every Connect streaming response from the agent.

// connectStreaming reports whether res is a Connect streaming response
// (application/connect+proto, application/connect+json, ...).
func connectStreaming(res *http.Response) bool {
	mt, _, err := mime.ParseMediaType(res.Header.Get("Content-Type"))
	return err == nil && strings.HasPrefix(mt, "application/connect+")
}

// endStream passes the upstream's envelopes through and, when the upstream
// fails or ends before its end-of-stream message, ends the stream with an
// unavailable error, provided it failed between two envelopes (a cut inside
// one cannot be repaired and is passed on as a failure).
type endStream struct {
	body io.ReadCloser
	msg  string

	hdr   [5]byte // the envelope prefix being read: flags, big-endian length
	hdrN  int
	left  uint64 // payload bytes of the current envelope still to come
	ended bool   // the upstream sent its end-of-stream envelope
	tail  []byte // the synthesized end-of-stream envelope, once due
	eof   bool
}

func (s *endStream) Read(p []byte) (int, error) {
	if s.tail != nil {
		n := copy(p, s.tail)
		s.tail = s.tail[n:]
		if len(s.tail) == 0 {
			s.tail, s.eof = nil, true
		}
		return n, nil
	}
	if s.eof {
		return 0, io.EOF
	}
	n, err := s.body.Read(p)
	s.track(p[:n])
	if err == nil || s.ended || s.hdrN != 0 || s.left != 0 {
		return n, err
	}
	// Cut (or ended) between envelopes without an end of stream.
	s.tail = endStreamEnvelope(s.msg)
	if n == 0 {
		return s.Read(p)
	}
	return n, nil
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

func endStreamEnvelope(msg string) []byte {
	var end struct {
		Error struct {
			Code    string `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}
	end.Error.Code, end.Error.Message = "unavailable", msg
	payload, _ := json.Marshal(end)
	out := make([]byte, 5, 5+len(payload))
	out[0] = connectEndStream
	binary.BigEndian.PutUint32(out[1:], uint32(len(payload)))
	return append(out, payload...)
}
