// Package contextstore keeps the build-context tars the e2b SDK uploads for
// COPY steps, keyed by the step's filesHash.
//
// The key is the SDK's own content hash (calculateFilesHash), not a digest of
// the body, so the store cannot verify it; it only guarantees that one key
// never maps to two different archives. Uploads are kept per team (Team):
// a hash one team uploaded is absent for every other team, so no team can
// plant the context another team's build copies in. Bodies are gzip (the SDK default) or
// plain tar and are stored decompressed as dir/<hash>.tar. Every member is
// checked before the tar becomes visible, so a stored tar always extracts
// inside its own directory.
package contextstore

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"time"
)

// DefaultMaxBytes is the decompressed size limit per tar (CEP: 512Mi, 413).
const DefaultMaxBytes int64 = 512 << 20

var (
	ErrNotFound    = errors.New("contextstore: context tar not found")
	ErrConflict    = errors.New("contextstore: a different archive is already stored under this hash")
	ErrTooLarge    = errors.New("contextstore: archive exceeds the size limit")
	ErrBadArchive  = errors.New("contextstore: body is not a valid gzip or tar archive")
	ErrUnsafePath  = errors.New("contextstore: archive member escapes the context")
	ErrInvalidHash = errors.New("contextstore: hash must be 64 lowercase hex characters")
	ErrInvalidTeam = errors.New("contextstore: invalid team ID")
)

var (
	hashRe = regexp.MustCompile(`^[0-9a-f]{64}$`)
	teamRe = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$`)
)

// teamsDir holds one sub-store per team under the root directory.
const teamsDir = "teams"

const (
	tarSuffix     = ".tar"
	partialSuffix = ".partial"
)

// Store is a directory of validated context tars. One Store should own a
// directory: Open removes partial files left by a previous process.
type Store struct {
	dir      string
	maxBytes int64
	// mu serialises the commit step (compare-or-rename) so two uploads of
	// one hash cannot both think they created it.
	mu sync.Mutex
	// teams are the per-team sub-stores handed out by Team (root only).
	teams sync.Map // team ID -> *Store
}

// Team returns the store of one team's uploads (<dir>/teams/<team>), the
// same *Store for every call with one team, so uploads of one hash by two
// requests still commit one at a time.
func (s *Store) Team(team string) (*Store, error) {
	if !teamRe.MatchString(team) {
		return nil, fmt.Errorf("%w: %q", ErrInvalidTeam, team)
	}
	if t, ok := s.teams.Load(team); ok {
		return t.(*Store), nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if t, ok := s.teams.Load(team); ok {
		return t.(*Store), nil
	}
	t, err := Open(filepath.Join(s.dir, teamsDir, team), s.maxBytes)
	if err != nil {
		return nil, err
	}
	s.teams.Store(team, t)
	return t, nil
}

// Open creates dir if needed and returns a Store limiting each decompressed
// archive to maxBytes (DefaultMaxBytes when maxBytes <= 0).
func Open(dir string, maxBytes int64) (*Store, error) {
	if maxBytes <= 0 {
		maxBytes = DefaultMaxBytes
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("contextstore: %w", err)
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("contextstore: %w", err)
	}
	for _, e := range ents {
		if strings.HasSuffix(e.Name(), partialSuffix) {
			_ = os.Remove(filepath.Join(dir, e.Name()))
		}
	}
	return &Store{dir: dir, maxBytes: maxBytes}, nil
}

// Path is where the tar for hash lives (whether or not it is present).
func (s *Store) Path(hash string) string {
	return filepath.Join(s.dir, hash+tarSuffix)
}

// Has reports whether a complete tar is stored for hash.
func (s *Store) Has(hash string) bool {
	if !hashRe.MatchString(hash) {
		return false
	}
	fi, err := os.Stat(s.Path(hash))
	return err == nil && fi.Mode().IsRegular()
}

// Put stores body under hash. body is a gzip stream (magic 1f 8b) or a plain
// tar; it is streamed to a temporary file, never held in memory. The tar
// becomes visible only after the whole body was read and every member passed
// validation, so a failed or interrupted upload leaves nothing behind.
// Storing the same decompressed bytes again is a no-op that refreshes the
// tar's mtime (GC age); different bytes return ErrConflict.
func (s *Store) Put(hash string, body io.Reader) error {
	if !hashRe.MatchString(hash) {
		return ErrInvalidHash
	}
	tmp, err := os.CreateTemp(s.dir, "."+hash+".*"+partialSuffix)
	if err != nil {
		return fmt.Errorf("contextstore: %w", err)
	}
	defer func() {
		if tmp != nil {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()

	src := &trackingReader{r: body}
	br := bufio.NewReaderSize(src, 64<<10)
	var stream io.Reader = br
	if magic, _ := br.Peek(2); len(magic) == 2 && magic[0] == 0x1f && magic[1] == 0x8b {
		zr, zerr := gzip.NewReader(br)
		if zerr != nil {
			return classify(src, zerr)
		}
		defer zr.Close()
		stream = zr
	}
	if src.err != nil {
		return classify(src, src.err)
	}

	sum := sha256.New()
	lim := &limitedReader{r: stream, left: s.maxBytes}
	zt := &zeroTail{}
	tee := io.TeeReader(lim, io.MultiWriter(tmp, sum, zt))
	if err := validate(tar.NewReader(tee), nil); err != nil {
		return classify(src, err)
	}
	// The tar reader stops at the end-of-archive blocks. Require that they
	// were there (a plain tar cut at a member boundary would otherwise pass)
	// and drain the padding so gzip verifies its CRC and the stored file is
	// the exact decompressed stream.
	if zt.run < 2*512 {
		return classify(src, fmt.Errorf("%w: missing end-of-archive marker", ErrBadArchive))
	}
	zt.nonZero = false
	if _, err := io.Copy(io.Discard, tee); err != nil {
		return classify(src, err)
	}
	if zt.nonZero {
		return classify(src, fmt.Errorf("%w: data after end-of-archive marker", ErrBadArchive))
	}
	if err := tmp.Sync(); err != nil {
		return fmt.Errorf("contextstore: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("contextstore: %w", err)
	}
	name := tmp.Name()
	digest := sum.Sum(nil)

	s.mu.Lock()
	defer s.mu.Unlock()
	final := s.Path(hash)
	if _, err := os.Stat(final); err == nil {
		old, err := fileDigest(final)
		if err != nil {
			return fmt.Errorf("contextstore: %w", err)
		}
		if !bytes.Equal(old, digest) {
			return ErrConflict
		}
		now := time.Now()
		if err := os.Chtimes(final, now, now); err != nil {
			return fmt.Errorf("contextstore: %w", err)
		}
		return nil // deferred cleanup removes the duplicate temp file
	}
	if err := os.Rename(name, final); err != nil {
		return fmt.Errorf("contextstore: %w", err)
	}
	tmp = nil
	syncDir(s.dir)
	return nil
}

// classify turns a failure while reading the upload into the error the
// caller maps to HTTP: the body's own read error (disconnect) wins, then the
// size limit, then anything else is a malformed archive.
func classify(src *trackingReader, err error) error {
	switch {
	case src.err != nil:
		return fmt.Errorf("contextstore: reading upload: %w", src.err)
	case errors.Is(err, ErrTooLarge), errors.Is(err, ErrUnsafePath), errors.Is(err, ErrBadArchive):
		return err
	default:
		return fmt.Errorf("%w: %v", ErrBadArchive, err)
	}
}

// trackingReader remembers the body's first real read error, so a client
// disconnect is not reported as a malformed archive.
type trackingReader struct {
	r   io.Reader
	err error
}

func (t *trackingReader) Read(p []byte) (int, error) {
	n, err := t.r.Read(p)
	if err != nil && err != io.EOF && t.err == nil {
		t.err = err
	}
	return n, err
}

// limitedReader fails with ErrTooLarge once more than left bytes are read.
type limitedReader struct {
	r    io.Reader
	left int64
}

func (l *limitedReader) Read(p []byte) (int, error) {
	if l.left < 0 {
		return 0, ErrTooLarge
	}
	if int64(len(p)) > l.left+1 {
		p = p[:l.left+1]
	}
	n, err := l.r.Read(p)
	l.left -= int64(n)
	if l.left < 0 {
		return 0, ErrTooLarge
	}
	return n, err
}

// zeroTail tracks the run of trailing zero bytes written so far, and
// whether any non-zero byte was seen.
type zeroTail struct {
	run     int64
	nonZero bool
}

func (z *zeroTail) Write(p []byte) (int, error) {
	for i := len(p) - 1; i >= 0; i-- {
		if p[i] != 0 {
			z.run = int64(len(p) - 1 - i)
			z.nonZero = true
			return len(p), nil
		}
	}
	z.run += int64(len(p))
	return len(p), nil
}

func fileDigest(name string) ([]byte, error) {
	f, err := os.Open(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return nil, err
	}
	return h.Sum(nil), nil
}

// syncDir makes a rename durable; failure only weakens crash safety.
func syncDir(dir string) {
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync()
		d.Close()
	}
}

// GC removes stored tars (and stray partial files) whose mtime is older
// than maxAge, and reports how many tars it removed.
func (s *Store) GC(maxAge time.Duration) (int, error) { return s.GCExcept(maxAge, nil) }

// GCExcept is GC that keeps the tars whose hash keep reports (those a
// queued or running build still reads), whatever their age.
func (s *Store) GCExcept(maxAge time.Duration, keep func(hash string) bool) (int, error) {
	removed, err := s.gc(maxAge, keep)
	// Every team's uploads age out the same way, also those of teams no
	// request named since this process started.
	teams, _ := os.ReadDir(filepath.Join(s.dir, teamsDir))
	errs := []error{err}
	for _, e := range teams {
		if !e.IsDir() || !teamRe.MatchString(e.Name()) {
			continue
		}
		t, err := s.Team(e.Name())
		if err != nil {
			errs = append(errs, err)
			continue
		}
		n, err := t.gc(maxAge, keep)
		removed += n
		errs = append(errs, err)
	}
	return removed, errors.Join(errs...)
}

func (s *Store) gc(maxAge time.Duration, keep func(string) bool) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ents, err := os.ReadDir(s.dir)
	if err != nil {
		return 0, fmt.Errorf("contextstore: %w", err)
	}
	cutoff := time.Now().Add(-maxAge)
	removed := 0
	var errs []error
	for _, e := range ents {
		name := e.Name()
		isTar := strings.HasSuffix(name, tarSuffix) && hashRe.MatchString(strings.TrimSuffix(name, tarSuffix))
		if !isTar && !strings.HasSuffix(name, partialSuffix) {
			continue
		}
		if isTar && keep != nil && keep(strings.TrimSuffix(name, tarSuffix)) {
			continue
		}
		fi, err := e.Info()
		if err != nil || !fi.Mode().IsRegular() || !fi.ModTime().Before(cutoff) {
			continue
		}
		if err := os.Remove(filepath.Join(s.dir, name)); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
			continue
		}
		if isTar {
			removed++
		}
	}
	return removed, errors.Join(errs...)
}
