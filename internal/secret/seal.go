package secret

import (
	"bytes"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"strconv"
)

// Sealed layout: format byte | key ID (8) | nonce (12) | AES-256-GCM ciphertext+tag.
const (
	sealFormat = 1
	keyIDLen   = 8
)

// sealer encrypts values with one key. The AAD binds each ciphertext to
// its team, secret ID and version, so a row's sealed bytes copied into
// another row (or replayed as an older version) fail to open.
type sealer struct {
	aead  cipher.AEAD
	keyID []byte
}

func newSealer(key []byte) (*sealer, error) {
	if len(key) != KeySize {
		return nil, fmt.Errorf("%w: key must be %d bytes", ErrKeyFile, KeySize)
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, err
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return nil, err
	}
	return &sealer{aead: aead, keyID: keyID(key)}, nil
}

func aad(teamID, id string, version int) []byte {
	return []byte("cubicle secret v1\x00" + teamID + "\x00" + id + "\x00" + strconv.Itoa(version))
}

func (s *sealer) seal(teamID, id string, version int, value []byte) ([]byte, error) {
	nonce := make([]byte, s.aead.NonceSize())
	if _, err := rand.Read(nonce); err != nil {
		return nil, err
	}
	out := make([]byte, 0, 1+keyIDLen+len(nonce)+len(value)+s.aead.Overhead())
	out = append(out, sealFormat)
	out = append(out, s.keyID...)
	out = append(out, nonce...)
	return s.aead.Seal(out, nonce, value, aad(teamID, id, version)), nil
}

func (s *sealer) open(teamID, id string, version int, sealed []byte) ([]byte, error) {
	ns := s.aead.NonceSize()
	if len(sealed) < 1+keyIDLen+ns+s.aead.Overhead() || sealed[0] != sealFormat {
		return nil, fmt.Errorf("%w: secret %s has an unknown sealed format", ErrUnreadable, id)
	}
	if !bytes.Equal(sealed[1:1+keyIDLen], s.keyID) {
		return nil, fmt.Errorf("%w: secret %s was sealed with a different key (the secrets key file was lost or replaced); restore the key or set the value again", ErrWrongKey, id)
	}
	nonce := sealed[1+keyIDLen : 1+keyIDLen+ns]
	v, err := s.aead.Open(nil, nonce, sealed[1+keyIDLen+ns:], aad(teamID, id, version))
	if err != nil {
		return nil, fmt.Errorf("%w: secret %s failed authentication (tampered or moved between rows)", ErrUnreadable, id)
	}
	return v, nil
}

// SealField encrypts a credential that lives outside the secrets table (a
// sandbox's egress proxy password), bound to its team and scope; the
// result is printable (base64).
func (x *Secrets) SealField(teamID, scope, value string) (string, error) {
	b, err := x.s.seal(teamID, "field:"+scope, 0, []byte(value))
	if err != nil {
		return "", err
	}
	return base64.RawStdEncoding.EncodeToString(b), nil
}

// OpenField reverses SealField; ErrWrongKey or ErrUnreadable when it cannot.
func (x *Secrets) OpenField(teamID, scope, sealed string) (string, error) {
	b, err := base64.RawStdEncoding.DecodeString(sealed)
	if err != nil {
		return "", fmt.Errorf("%w: %s is not a sealed value", ErrUnreadable, scope)
	}
	v, err := x.s.open(teamID, "field:"+scope, 0, b)
	if err != nil {
		return "", err
	}
	return string(v), nil
}
