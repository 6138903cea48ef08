package snapstore

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
)

var digestRe = regexp.MustCompile(`^sha256:[0-9a-f]{64}$`)

// Push packs each target's part of snapDir (a node's <snapshot-dir>/<id>)
// into a temp file beside it, hashing as it writes, and PUTs it to the
// target's URL. It returns the targets with Digest and Size set (URLs
// cleared: they are the control plane's to hand out again).
func Push(ctx context.Context, hc *http.Client, snapDir string, targets []Object) ([]Object, error) {
	out := make([]Object, 0, len(targets))
	for _, t := range targets {
		if t.Part != PartRootfs && t.Part != PartCheckpoint {
			return nil, fmt.Errorf("%w: part %q", ErrBadPackage, t.Part)
		}
		o, err := pushPart(ctx, hc, snapDir, t)
		if err != nil {
			return nil, err
		}
		out = append(out, o)
	}
	return out, nil
}

func pushPart(ctx context.Context, hc *http.Client, snapDir string, t Object) (Object, error) {
	f, err := os.CreateTemp(filepath.Dir(snapDir), ".push-*.tar")
	if err != nil {
		return Object{}, err
	}
	defer os.Remove(f.Name())
	defer f.Close()
	h := sha256.New()
	if err := pack(filepath.Join(snapDir, t.Part), io.MultiWriter(f, h)); err != nil {
		return Object{}, fmt.Errorf("pack %s: %w", t.Part, err)
	}
	size, err := f.Seek(0, io.SeekCurrent)
	if err != nil {
		return Object{}, err
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return Object{}, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, t.URL, io.NopCloser(f))
	if err != nil {
		return Object{}, fmt.Errorf("%w: %s: %v", ErrTransfer, t.Part, err)
	}
	req.ContentLength = size // S3 takes no chunked PUT to a presigned URL
	resp, err := hc.Do(req)
	if err != nil {
		return Object{}, fmt.Errorf("%w: put %s: %v", ErrTransfer, t.Part, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return Object{}, fmt.Errorf("%w: put %s: %s: %s", ErrTransfer, t.Part, resp.Status, body)
	}
	return Object{Part: t.Part, Digest: "sha256:" + hex.EncodeToString(h.Sum(nil)), Size: size}, nil
}

// Fetch GETs each source, refuses it (ErrDigestMismatch) unless its bytes
// are exactly Size long with SHA-256 Digest, and unpacks the verified
// parts into snapDir, which must not exist: they are built in a sibling
// dir and renamed in at the end, so a failed fetch leaves nothing.
func Fetch(ctx context.Context, hc *http.Client, snapDir string, sources []Object) (err error) {
	if len(sources) == 0 {
		return fmt.Errorf("%w: no parts", ErrBadPackage)
	}
	if _, err := os.Lstat(snapDir); err == nil {
		return fmt.Errorf("%w: %s exists", os.ErrExist, snapDir)
	}
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	stage := filepath.Join(filepath.Dir(snapDir), ".fetch-"+filepath.Base(snapDir)+"-"+hex.EncodeToString(b))
	if err := os.Mkdir(stage, 0o700); err != nil {
		return err
	}
	defer func() {
		if err != nil {
			os.RemoveAll(stage)
		}
	}()
	seen := map[string]bool{}
	for _, s := range sources {
		if (s.Part != PartRootfs && s.Part != PartCheckpoint) || seen[s.Part] {
			return fmt.Errorf("%w: part %q", ErrBadPackage, s.Part)
		}
		seen[s.Part] = true
		if !digestRe.MatchString(s.Digest) || s.Size < 0 {
			return fmt.Errorf("%w: part %s: digest %q", ErrBadPackage, s.Part, s.Digest)
		}
		if err := fetchPart(ctx, hc, stage, s); err != nil {
			return err
		}
	}
	// 0700 like the dir the node's own snapshot makes.
	return os.Rename(stage, snapDir)
}

func fetchPart(ctx context.Context, hc *http.Client, stage string, s Object) error {
	f, err := os.CreateTemp(filepath.Dir(stage), ".fetch-*.tar")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	defer f.Close()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.URL, nil)
	if err != nil {
		return fmt.Errorf("%w: %s: %v", ErrTransfer, s.Part, err)
	}
	resp, err := hc.Do(req)
	if err != nil {
		return fmt.Errorf("%w: get %s: %v", ErrTransfer, s.Part, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return fmt.Errorf("%w: get %s: %s: %s", ErrTransfer, s.Part, resp.Status, body)
	}
	h := sha256.New()
	// One byte past Size tells a longer body from an exact one.
	n, err := io.Copy(io.MultiWriter(f, h), io.LimitReader(resp.Body, s.Size+1))
	if err != nil {
		return fmt.Errorf("%w: get %s: %v", ErrTransfer, s.Part, err)
	}
	if got := sum(h); n != s.Size || got != s.Digest {
		return fmt.Errorf("%w: %s: got %d bytes with digest %s, want %d with %s", ErrDigestMismatch, s.Part, n, got, s.Size, s.Digest)
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return err
	}
	dst := filepath.Join(stage, s.Part)
	if err := os.Mkdir(dst, 0o755); err != nil {
		return err
	}
	if err := unpack(f, dst); err != nil {
		if errors.Is(err, ErrBadPackage) {
			return err
		}
		return fmt.Errorf("unpack %s: %w", s.Part, err)
	}
	return nil
}

func sum(h hash.Hash) string { return "sha256:" + hex.EncodeToString(h.Sum(nil)) }
