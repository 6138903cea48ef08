package jupyter

import (
	"bytes"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// ProtocolVersion is the messaging protocol version this package speaks.
const ProtocolVersion = "5.3"

// delimiter separates the routing identities from the signed message.
var delimiter = []byte("<IDS|MSG>")

// Errors of Decode.
var (
	ErrMalformed    = errors.New("jupyter: malformed message")
	ErrBadSignature = errors.New("jupyter: bad message signature")
)

// Header is a message header (and parent header; a message with no parent
// has an empty one).
type Header struct {
	MsgID    string `json:"msg_id"`
	Session  string `json:"session"`
	Username string `json:"username"`
	// Date is kept as the kernel wrote it (ISO 8601), so it can be passed on
	// unchanged.
	Date    string `json:"date"`
	MsgType string `json:"msg_type"`
	Version string `json:"version"`
}

// Message is one Jupyter message. Content stays raw JSON: each consumer
// decodes the fields of the message types it handles.
type Message struct {
	Identities   [][]byte
	Header       Header
	ParentHeader Header
	Metadata     json.RawMessage
	Content      json.RawMessage
	Buffers      [][]byte
}

// Signer signs and verifies messages with HMAC-SHA256 under a connection key.
// An empty key disables signing, as the protocol specifies.
type Signer struct{ key []byte }

// NewSigner returns a Signer for key (the connection file's key string,
// used as bytes).
func NewSigner(key string) Signer { return Signer{key: []byte(key)} }

func (s Signer) sign(parts ...[]byte) []byte {
	if len(s.key) == 0 {
		return nil
	}
	m := hmac.New(sha256.New, s.key)
	for _, p := range parts {
		m.Write(p)
	}
	out := make([]byte, hex.EncodedLen(m.Size()))
	hex.Encode(out, m.Sum(nil))
	return out
}

// Encode serializes m into ZeroMQ frames: identities, delimiter, signature,
// header, parent header, metadata, content, buffers.
func (s Signer) Encode(m *Message) ([][]byte, error) {
	header, err := json.Marshal(m.Header)
	if err != nil {
		return nil, err
	}
	parent := []byte("{}")
	if m.ParentHeader.MsgID != "" {
		if parent, err = json.Marshal(m.ParentHeader); err != nil {
			return nil, err
		}
	}
	meta := orEmptyObject(m.Metadata)
	content := orEmptyObject(m.Content)
	frames := make([][]byte, 0, len(m.Identities)+6+len(m.Buffers))
	frames = append(frames, m.Identities...)
	frames = append(frames, delimiter, s.sign(header, parent, meta, content), header, parent, meta, content)
	frames = append(frames, m.Buffers...)
	return frames, nil
}

func orEmptyObject(b json.RawMessage) []byte {
	if len(b) == 0 {
		return []byte("{}")
	}
	return b
}

// Decode parses and verifies frames received from a kernel. Frames before the
// delimiter are routing identities (or, on iopub, the topic).
func (s Signer) Decode(frames [][]byte) (*Message, error) {
	i := 0
	for i < len(frames) && !bytes.Equal(frames[i], delimiter) {
		i++
	}
	if len(frames)-i < 6 {
		return nil, fmt.Errorf("%w: %d frames, no delimiter or too few after it", ErrMalformed, len(frames))
	}
	sig, header, parent, meta, content := frames[i+1], frames[i+2], frames[i+3], frames[i+4], frames[i+5]
	if len(s.key) != 0 && !hmac.Equal(sig, s.sign(header, parent, meta, content)) {
		return nil, ErrBadSignature
	}
	m := &Message{Identities: frames[:i], Metadata: meta, Buffers: frames[i+6:]}
	if err := json.Unmarshal(header, &m.Header); err != nil {
		return nil, fmt.Errorf("%w: header: %v", ErrMalformed, err)
	}
	if err := json.Unmarshal(parent, &m.ParentHeader); err != nil {
		return nil, fmt.Errorf("%w: parent header: %v", ErrMalformed, err)
	}
	m.Content = sanitizeJSON(content)
	return m, nil
}

// NewHeader returns a fresh header of msgType in session.
func NewHeader(session, msgType string) Header {
	return Header{
		MsgID:    NewID(),
		Session:  session,
		Username: "cubicle",
		Date:     time.Now().UTC().Format(time.RFC3339Nano),
		MsgType:  msgType,
		Version:  ProtocolVersion,
	}
}

// NewID returns a random UUID-shaped identifier (version 4).
func NewID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	h := hex.EncodeToString(b[:])
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}
