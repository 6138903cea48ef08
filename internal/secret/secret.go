// Package secret holds the team secrets: write-only values sealed with
// AES-256-GCM under a key kept outside the store. Only the node's egress
// proxy reads a value back (Resolve), at request time; no API route does.
package secret

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/cubicle-dev/cubicle/internal/store"
)

// Typed errors; messages name the field or the secret, never a value.
var (
	ErrNotFound = errors.New("secret not found")
	ErrInvalid  = errors.New("invalid secret")
	ErrConflict = errors.New("secret conflict")
	// ErrWrongKey: the value was sealed under another key (key file lost or
	// replaced). The row is intact; setting a new value repairs it.
	ErrWrongKey = errors.New("secret sealed with a different key")
	// ErrUnreadable: the sealed bytes fail authentication.
	ErrUnreadable = errors.New("secret unreadable")
)

// Limits (docs/secrets.md). Metadata limits are e2b's schema's.
const (
	MaxNameBytes      = 128
	MaxValueBytes     = 32 << 10
	MaxMetadata       = 32
	MaxMetaKeyBytes   = 128
	MaxMetaValueBytes = 1024
	MaxMetadataBytes  = 8192
	IDPrefix          = "sec_"
	// MaxPerTeam bounds a team's secrets (a key must not grow the
	// database without bound); beyond it create answers 429.
	MaxPerTeam = 1000
	// updateRetries bounds the compare-and-set loop of Update.
	updateRetries = 5
)

// Secrets is the service: validation, sealing and the team-scoped store.
type Secrets struct {
	st store.SecretStore
	s  *sealer
}

// New returns the service over st with a 32-byte key.
func New(st store.SecretStore, key []byte) (*Secrets, error) {
	s, err := newSealer(key)
	if err != nil {
		return nil, err
	}
	return &Secrets{st: st, s: s}, nil
}

// ValidateName is the server's rule for a canonical name (see
// CanonicalName): 1..128 bytes of UTF-8 with no '{', '}' or control
// characters (the SDK's rule: a name is interpolated into
// ${e2b.secrets.<name>}), no surrounding whitespace, not starting with
// "sec_" (e2b's schema reserves that prefix for secret IDs, and a ref that
// starts with it is looked up as an ID first), and not "." or ".." (an HTTP
// client removes those path segments, so no SDK could address the secret by
// name). Names are unique per team.
func ValidateName(name string) error {
	switch {
	case name == "":
		return fmt.Errorf("%w: name must not be empty", ErrInvalid)
	case len(name) > MaxNameBytes:
		return fmt.Errorf("%w: name must be at most %d bytes", ErrInvalid, MaxNameBytes)
	case !utf8.ValidString(name):
		return fmt.Errorf("%w: name must be UTF-8", ErrInvalid)
	case strings.TrimSpace(name) != name:
		return fmt.Errorf("%w: name must not begin or end with whitespace", ErrInvalid)
	case strings.ContainsFunc(name, func(r rune) bool { return r == '{' || r == '}' || unicode.IsControl(r) }):
		return fmt.Errorf("%w: name must not contain '{', '}' or control characters", ErrInvalid)
	case strings.HasPrefix(strings.ToLower(name), IDPrefix):
		return fmt.Errorf("%w: name must not begin with %q, the prefix of secret IDs", ErrInvalid, IDPrefix)
	case name == "." || name == "..":
		return fmt.Errorf("%w: name must not be \".\" or \"..\" (a URL path cannot carry it)", ErrInvalid)
	}
	return nil
}

// CanonicalName is the form a name is stored, returned and looked up in:
// e2b's schema says names are lower-cased before storage and returned in
// that canonical form. Invalid UTF-8 is returned unchanged (ValidateName
// refuses it) rather than having its bytes replaced.
func CanonicalName(name string) string {
	if !utf8.ValidString(name) {
		return name
	}
	return strings.ToLower(name)
}

func validateValue(v string) error {
	if v == "" {
		return fmt.Errorf("%w: value must not be empty", ErrInvalid)
	}
	if len(v) > MaxValueBytes {
		return fmt.Errorf("%w: value must be at most %d bytes", ErrInvalid, MaxValueBytes)
	}
	return nil
}

// ValidateMetadata checks e2b's limits.
func ValidateMetadata(m map[string]string) error {
	if len(m) > MaxMetadata {
		return fmt.Errorf("%w: metadata must have at most %d entries", ErrInvalid, MaxMetadata)
	}
	total := 0
	for k, v := range m {
		switch {
		case k == "":
			return fmt.Errorf("%w: metadata keys must not be empty", ErrInvalid)
		case len(k) > MaxMetaKeyBytes:
			return fmt.Errorf("%w: metadata key %.32q... must be at most %d bytes", ErrInvalid, k, MaxMetaKeyBytes)
		case len(v) > MaxMetaValueBytes:
			return fmt.Errorf("%w: metadata.%s must be at most %d bytes", ErrInvalid, k, MaxMetaValueBytes)
		}
		total += len(k) + len(v)
	}
	if total > MaxMetadataBytes {
		return fmt.Errorf("%w: metadata must be at most %d bytes in total", ErrInvalid, MaxMetadataBytes)
	}
	return nil
}

func newID() string {
	b := make([]byte, 12)
	if _, err := rand.Read(b); err != nil {
		panic(err) // crypto/rand does not fail on Linux
	}
	return IDPrefix + hex.EncodeToString(b)
}

func mapErr(err error, ref string) error {
	switch {
	case errors.Is(err, store.ErrNotFound):
		return fmt.Errorf("%w: %q", ErrNotFound, ref)
	case errors.Is(err, store.ErrConflict):
		return fmt.Errorf("%w: %w", ErrConflict, err)
	}
	return err
}

// Create stores a new secret at version 1.
// The name is stored in its canonical (lower-case) form.
func (x *Secrets) Create(ctx context.Context, teamID, name, value string, metadata map[string]string) (*store.Secret, error) {
	name = CanonicalName(name)
	if err := ValidateName(name); err != nil {
		return nil, err
	}
	if err := validateValue(value); err != nil {
		return nil, err
	}
	if err := ValidateMetadata(metadata); err != nil {
		return nil, err
	}
	sec := &store.Secret{ID: newID(), TeamID: teamID, Name: name, Version: 1, Metadata: metadata}
	sealed, err := x.s.seal(teamID, sec.ID, 1, []byte(value))
	if err != nil {
		return nil, err
	}
	sec.Sealed = sealed
	if err := x.st.CreateSecret(ctx, sec, MaxPerTeam); err != nil {
		if errors.Is(err, store.ErrConflict) {
			return nil, fmt.Errorf("%w: a secret named %q already exists", ErrConflict, name)
		}
		return nil, err
	}
	return sec, nil
}

// Get finds a team's secret by ID ("sec_…") or, failing that, by name
// (see byName). Another team's secret is ErrNotFound like a missing one.
func (x *Secrets) Get(ctx context.Context, teamID, ref string) (*store.Secret, error) {
	if strings.HasPrefix(ref, IDPrefix) {
		sec, err := x.st.GetSecret(ctx, teamID, ref)
		if !errors.Is(err, store.ErrNotFound) {
			return sec, mapErr(err, ref)
		}
	}
	sec, err := x.byName(ctx, teamID, ref)
	return sec, mapErr(err, ref)
}

// byName looks name up in its canonical form, then as given: a row stored
// before names were canonicalised may hold upper-case letters.
func (x *Secrets) byName(ctx context.Context, teamID, name string) (*store.Secret, error) {
	c := CanonicalName(name)
	sec, err := x.st.SecretByName(ctx, teamID, c)
	if errors.Is(err, store.ErrNotFound) && c != name {
		sec, err = x.st.SecretByName(ctx, teamID, name)
	}
	return sec, err
}

// List pages a team's secrets oldest first.
func (x *Secrets) List(ctx context.Context, f store.SecretFilter) ([]*store.Secret, error) {
	return x.st.ListSecrets(ctx, f)
}

// Update seals value as the next version; metadata replaces the old when
// non-nil. Concurrent updates serialize through the store's version
// compare-and-set (each sealed under its own version's AAD).
func (x *Secrets) Update(ctx context.Context, teamID, ref, value string, metadata map[string]string) (*store.Secret, error) {
	if err := validateValue(value); err != nil {
		return nil, err
	}
	if err := ValidateMetadata(metadata); err != nil {
		return nil, err
	}
	for i := 0; ; i++ {
		cur, err := x.Get(ctx, teamID, ref)
		if err != nil {
			return nil, err
		}
		sealed, err := x.s.seal(teamID, cur.ID, cur.Version+1, []byte(value))
		if err != nil {
			return nil, err
		}
		up, err := x.st.UpdateSecret(ctx, teamID, cur.ID, cur.Version, sealed, metadata)
		if errors.Is(err, store.ErrConflict) && i < updateRetries {
			continue
		}
		return up, mapErr(err, ref)
	}
}

// Delete removes a secret and its value.
func (x *Secrets) Delete(ctx context.Context, teamID, ref string) error {
	sec, err := x.Get(ctx, teamID, ref)
	if err != nil {
		return err
	}
	return mapErr(x.st.DeleteSecret(ctx, teamID, sec.ID), ref)
}

// Resolve returns the current value of teamID's secret called name: the
// egress proxy's call when it expands ${e2b.secrets.<name>} at request
// time. ErrNotFound when there is none; ErrWrongKey when the key that
// sealed it is gone. The name is matched like a ref's (canonical form
// first). Callers must not log or keep the value.
func (x *Secrets) Resolve(ctx context.Context, teamID, name string) (string, error) {
	sec, err := x.byName(ctx, teamID, name)
	if err != nil {
		return "", mapErr(err, name)
	}
	v, err := x.s.open(teamID, sec.ID, sec.Version, sec.Sealed)
	if err != nil {
		return "", err
	}
	out := string(v)
	clear(v)
	return out, nil
}
