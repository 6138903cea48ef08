package secret

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"
)

// KeySize is AES-256's key length.
const KeySize = 32

// ErrKeyFile: the key file is unusable (bad permissions, bad content).
var ErrKeyFile = errors.New("secret: key file unusable")

// LoadOrCreateKey reads the hex-encoded key at path, creating it (0600,
// crypto/rand) when it does not exist. A key file that group or others can
// read, or that is not 64 hex digits, is refused: the key is the only thing
// between a copy of the database and every secret in it.
func LoadOrCreateKey(path string) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err == nil {
		key := make([]byte, KeySize)
		if _, err := rand.Read(key); err != nil {
			f.Close()
			os.Remove(path)
			return nil, err
		}
		_, werr := f.WriteString(hex.EncodeToString(key) + "\n")
		if cerr := f.Close(); werr == nil {
			werr = cerr
		}
		if werr != nil {
			os.Remove(path)
			return nil, werr
		}
		return key, nil
	}
	if !errors.Is(err, fs.ErrExist) {
		return nil, err
	}
	return LoadKey(path)
}

// LoadKey reads an existing key file; see LoadOrCreateKey for the checks.
func LoadKey(path string) ([]byte, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("%w: %s is not a regular file", ErrKeyFile, path)
	}
	if st.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("%w: %s is readable by group or others (mode %#o); chmod 600 it", ErrKeyFile, path, st.Mode().Perm())
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	key, err := hex.DecodeString(strings.TrimSpace(string(b)))
	if err != nil || len(key) != KeySize {
		return nil, fmt.Errorf("%w: %s must hold %d hex digits", ErrKeyFile, path, 2*KeySize)
	}
	return key, nil
}

// keyID fingerprints a key so a value sealed under another key is reported
// as "sealed with a different key" rather than as corruption.
func keyID(key []byte) []byte {
	h := sha256.Sum256(append([]byte("cubicle secrets key id\x00"), key...))
	return h[:keyIDLen]
}
