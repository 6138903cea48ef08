// Package sqlstore is the store.Store implementation over database/sql,
// shared by the SQLite and PostgreSQL backends. Each query and method exists
// once here; a Dialect carries what the two databases spell differently.
// The backends keep opening the database and their migrations.
package sqlstore

import (
	"database/sql"
	"strconv"
	"strings"
	"sync"

	"github.com/cubicle-dev/cubicle/internal/store"
)

// Dialect is what one SQL database does differently. Queries are written
// with ? placeholders and SQL both databases accept; the fields below
// cover the rest.
type Dialect struct {
	// Numbered rewrites ? placeholders as $1, $2... (PostgreSQL).
	Numbered bool
	// Isolation is the level every multi-statement transaction runs at.
	Isolation sql.IsolationLevel
	// Retryable reports a transaction failure that a rerun from the start
	// can get past (a serialization failure); nil when none is.
	Retryable func(error) bool
	// IsConstraint reports a primary-key or unique violation.
	IsConstraint func(error) bool
	// Typed spells a placeholder whose type the database cannot infer
	// (in INSERT ... SELECT ?, or compared with a literal); nil: plain ?.
	Typed func(sqlType string) string
	// MetadataHas is a condition on sandboxes.metadata (a JSON object
	// of strings) taking two arguments, a key and a value: the key is
	// there with that value.
	MetadataHas string
	// MetadataHasNot is a condition on sandboxes.metadata taking one
	// argument, a key: the key is absent.
	MetadataHasNot string
	// MetadataWithout is sandboxes.metadata less two keys, taking two
	// arguments MetadataPath(key).
	MetadataWithout string
	// MetadataPath is the argument that names a key in MetadataWithout.
	MetadataPath func(key string) string
	// NoLimit is the LIMIT argument that means no limit.
	NoLimit int
}

// Store is a store.Store over one database/sql handle.
type Store struct {
	d  *Dialect
	db db
}

var _ store.Store = (*Store)(nil)

// New returns the store over sqlDB, which already has the schema. Close
// closes sqlDB.
func New(sqlDB *sql.DB, d *Dialect) *Store {
	return &Store{d: d, db: db{sqlDB, d}}
}

// Close closes the database handle.
func (s *Store) Close() error { return s.db.Close() }

// typed is the placeholder of one argument of type sqlType.
func (d *Dialect) typed(sqlType string) string {
	if d.Typed == nil {
		return "?"
	}
	return d.Typed(sqlType)
}

func (d *Dialect) rebind(q string) string {
	if !d.Numbered {
		return q
	}
	return rebind(q)
}

var rebound sync.Map // query text -> rewritten text

// rebind numbers ? placeholders outside quoted literals. No query here
// uses PostgreSQL's jsonb ? operator (jsonb_exists is used instead).
func rebind(q string) string {
	if v, ok := rebound.Load(q); ok {
		return v.(string)
	}
	var b strings.Builder
	n, quoted := 0, false
	for i := 0; i < len(q); i++ {
		c := q[i]
		switch {
		case c == '\'':
			quoted = !quoted
		case c == '?' && !quoted:
			n++
			b.WriteString("$" + strconv.Itoa(n))
			continue
		}
		b.WriteByte(c)
	}
	out := b.String()
	rebound.Store(q, out)
	return out
}
