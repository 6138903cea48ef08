package secret

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"

	"github.com/cubicle-dev/cubicle/internal/store"
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

// ErrKeyMissing: the key file does not exist although the store already
// holds secrets, which were sealed under some earlier key.
var ErrKeyMissing = errors.New("secret: key file missing")

// SecretCounter is what LoadOrCreateKeyFor asks of the store: whether the
// system team or any listed team holds a secret (a team with secrets cannot
// be deleted, so that finds every secret). store.Store satisfies it.
type SecretCounter interface {
	ListTeams(ctx context.Context) ([]*store.Team, error)
	ListSecrets(ctx context.Context, f store.SecretFilter) ([]*store.Secret, error)
}

// LoadOrCreateKeyFor is serve's LoadOrCreateKey: it creates the key only on
// a fresh install. When the file is missing but st already holds secrets it
// returns ErrKeyMissing naming path, instead of silently making a new key
// under which every existing secret would be unreadable.
func LoadOrCreateKeyFor(ctx context.Context, path string, st SecretCounter) ([]byte, error) {
	if _, err := os.Lstat(path); !errors.Is(err, fs.ErrNotExist) {
		return LoadKey(path) // present (or unreadable: LoadKey says why)
	}
	teams, err := st.ListTeams(ctx)
	if err != nil {
		return nil, err
	}
	ids := []string{store.SystemTeamID} // admin keys' team has no row
	for _, t := range teams {
		ids = append(ids, t.ID)
	}
	for _, id := range ids {
		secs, err := st.ListSecrets(ctx, store.SecretFilter{TeamID: id, Limit: 1})
		if err != nil {
			return nil, err
		}
		if len(secs) > 0 {
			return nil, fmt.Errorf("%w: %s does not exist, but the database already holds secrets sealed with a key: "+
				"restore that key file (or point --secrets-key at it); if it is lost for good, create a new key file yourself "+
				"and set every secret's value again (docs/secrets.md, \"If the key file is lost\")", ErrKeyMissing, path)
		}
	}
	return LoadOrCreateKey(path)
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
