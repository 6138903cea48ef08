// Package snapstore keeps snapshot packages in S3 so that a snapshot taken
// on one node can be restored on another (issue 23, item 8; the volume
// seed's cross-node restore). A package is one object per part of the
// node's snapshot dir: "rootfs" (the snapshot's layer) and, for a memory
// snapshot, "checkpoint" (runsc's memory image), each a tar.
//
// Only the control plane holds S3 credentials (Store). It hands a node
// presigned URLs for exactly one snapshot's objects; the node packs and
// PUTs (Push) or GETs and unpacks (Fetch) with plain HTTP, checking every
// byte it unpacks against the digest the pushing node reported.
package snapstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"

	"github.com/cubicle-dev/cubicle/internal/errdefs"
)

var (
	// ErrInvalidConfig: a --snapshot-store URL or its credentials are unusable.
	ErrInvalidConfig = errdefs.NewReason(errdefs.ErrInvalidArgument, "snapshot_store_config", "snapstore: invalid snapshot store")
	// ErrDigestMismatch: a fetched object is not the one the push recorded.
	ErrDigestMismatch = errdefs.NewReason(errdefs.ErrDataLoss, "snapshot_digest_mismatch", "snapstore: package does not match its digest")
	// ErrBadPackage: a package holds something a snapshot dir never does
	// (a path out of its part, a device other than a whiteout, a link
	// through a symlink...); nothing of it is kept.
	ErrBadPackage = errdefs.NewReason(errdefs.ErrInvalidArgument, "snapshot_bad_package", "snapstore: malformed snapshot package")
	// ErrTransfer: the object store refused or could not be reached.
	ErrTransfer = errdefs.NewReason(errdefs.ErrUnavailable, "snapshot_transfer_failed", "snapstore: transfer failed")
	// ErrObjectNotFound: no object under that key (GetObject).
	ErrObjectNotFound = errdefs.NewReason(errdefs.ErrNotFound, "object_not_found", "snapstore: no such object")
)

// Parts of a snapshot dir a package may hold.
const (
	PartRootfs     = "rootfs"
	PartCheckpoint = "checkpoint"
)

// DefaultURLTTL is how long a presigned URL works: long enough for a
// multi-GiB checkpoint over a slow link, short enough that a URL a node
// kept is soon useless.
const DefaultURLTTL = 15 * time.Minute

var snapshotIDRe = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,62}$`)

// Object is one part of a package: where to PUT or GET it and, once
// pushed, its SHA-256 ("sha256:<hex>") and size.
type Object struct {
	Part   string `json:"part"`
	URL    string `json:"url,omitempty"`
	Digest string `json:"digest,omitempty"`
	Size   int64  `json:"size,omitempty"`
}

// Config is where packages go. Parse fills it from a --snapshot-store URL.
type Config struct {
	Bucket    string
	Endpoint  string // http(s)://host[:port]
	Region    string
	Prefix    string // key prefix, "" or ending in "/"
	PathStyle bool   // bucket in the path (versitygw, MinIO), not the host
	AccessKey string
	SecretKey string
	URLTTL    time.Duration
}

// Parse reads s3://BUCKET?endpoint=URL&region=R&prefix=P&pathStyle=true.
// Credentials are not part of the URL (it is logged and shown in ps):
// set them on the returned Config.
func Parse(raw string) (Config, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return Config{}, fmt.Errorf("%w: %v", ErrInvalidConfig, err)
	}
	if u.Scheme != "s3" || u.Host == "" || (u.Path != "" && u.Path != "/") || u.User != nil {
		return Config{}, fmt.Errorf("%w: %q: want s3://BUCKET?endpoint=…&region=… (no path, no credentials in the URL)", ErrInvalidConfig, raw)
	}
	q := u.Query()
	cfg := Config{Bucket: u.Host, Endpoint: q.Get("endpoint"), Region: q.Get("region"), Prefix: q.Get("prefix")}
	for k := range q {
		switch k {
		case "endpoint", "region", "prefix", "pathStyle":
		default:
			return Config{}, fmt.Errorf("%w: unknown parameter %q in %q (endpoint, region, prefix, pathStyle)", ErrInvalidConfig, k, raw)
		}
	}
	switch q.Get("pathStyle") {
	case "", "false":
	case "true":
		cfg.PathStyle = true
	default:
		return Config{}, fmt.Errorf("%w: pathStyle=%q: true or false", ErrInvalidConfig, q.Get("pathStyle"))
	}
	if cfg.Endpoint == "" {
		cfg.Endpoint = "https://s3.amazonaws.com"
	}
	if cfg.Region == "" {
		cfg.Region = "us-east-1"
	}
	return cfg, nil
}

// Store is the control plane's side: it signs URLs and deletes packages.
type Store struct {
	cfg    Config
	client *minio.Client
}

// New checks cfg and makes a client; it does not contact the server.
func New(cfg Config) (*Store, error) {
	e, err := url.Parse(cfg.Endpoint)
	if err != nil || (e.Scheme != "http" && e.Scheme != "https") || e.Host == "" || (e.Path != "" && e.Path != "/") {
		return nil, fmt.Errorf("%w: endpoint %q: want http(s)://host[:port]", ErrInvalidConfig, cfg.Endpoint)
	}
	if cfg.Bucket == "" {
		return nil, fmt.Errorf("%w: no bucket", ErrInvalidConfig)
	}
	if cfg.Prefix != "" && !strings.HasSuffix(cfg.Prefix, "/") {
		return nil, fmt.Errorf("%w: prefix %q must end in /", ErrInvalidConfig, cfg.Prefix)
	}
	if cfg.AccessKey == "" || cfg.SecretKey == "" {
		return nil, fmt.Errorf("%w: no credentials (access key and secret key)", ErrInvalidConfig)
	}
	if cfg.URLTTL <= 0 {
		cfg.URLTTL = DefaultURLTTL
	}
	lookup := minio.BucketLookupDNS
	if cfg.PathStyle {
		lookup = minio.BucketLookupPath
	}
	c, err := minio.New(e.Host, &minio.Options{
		Creds: credentials.NewStaticV4(cfg.AccessKey, cfg.SecretKey, ""), Secure: e.Scheme == "https",
		Region: cfg.Region, BucketLookup: lookup, MaxRetries: 2,
	})
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalidConfig, err)
	}
	return &Store{cfg: cfg, client: c}, nil
}

// Key is the object key of one part of a snapshot's package.
func (s *Store) Key(snapshotID, part string) string {
	return s.cfg.Prefix + snapshotID + "/" + part + ".tar"
}

func checkParts(snapshotID string, parts []string) error {
	if !snapshotIDRe.MatchString(snapshotID) {
		return fmt.Errorf("%w: snapshot id %q", errdefs.ErrInvalidArgument, snapshotID)
	}
	if len(parts) == 0 {
		return fmt.Errorf("%w: no parts", errdefs.ErrInvalidArgument)
	}
	for _, p := range parts {
		if p != PartRootfs && p != PartCheckpoint {
			return fmt.Errorf("%w: part %q", errdefs.ErrInvalidArgument, p)
		}
	}
	return nil
}

// PutURLs are presigned PUT URLs for parts of snapshotID's package: each
// writes that one key and nothing else, until the TTL.
func (s *Store) PutURLs(ctx context.Context, snapshotID string, parts ...string) ([]Object, error) {
	if err := checkParts(snapshotID, parts); err != nil {
		return nil, err
	}
	out := make([]Object, 0, len(parts))
	for _, p := range parts {
		u, err := s.client.PresignedPutObject(ctx, s.cfg.Bucket, s.Key(snapshotID, p), s.cfg.URLTTL)
		if err != nil {
			return nil, fmt.Errorf("%w: sign %s: %v", ErrTransfer, p, err)
		}
		out = append(out, Object{Part: p, URL: u.String()})
	}
	return out, nil
}

// GetURLs are presigned GET URLs for the pushed objects of a package,
// carrying their digests and sizes over for the node to check.
func (s *Store) GetURLs(ctx context.Context, snapshotID string, pushed []Object) ([]Object, error) {
	parts := make([]string, 0, len(pushed))
	for _, o := range pushed {
		if !digestRe.MatchString(o.Digest) || o.Size < 0 {
			return nil, fmt.Errorf("%w: part %s has no valid digest", errdefs.ErrInvalidArgument, o.Part)
		}
		parts = append(parts, o.Part)
	}
	if err := checkParts(snapshotID, parts); err != nil {
		return nil, err
	}
	out := make([]Object, 0, len(pushed))
	for _, o := range pushed {
		u, err := s.client.PresignedGetObject(ctx, s.cfg.Bucket, s.Key(snapshotID, o.Part), s.cfg.URLTTL, nil)
		if err != nil {
			return nil, fmt.Errorf("%w: sign %s: %v", ErrTransfer, o.Part, err)
		}
		out = append(out, Object{Part: o.Part, URL: u.String(), Digest: o.Digest, Size: o.Size})
	}
	return out, nil
}

// Delete removes a snapshot's package; parts never pushed are no error.
func (s *Store) Delete(ctx context.Context, snapshotID string) error {
	if err := checkParts(snapshotID, []string{PartRootfs}); err != nil {
		return err
	}
	var errs []error
	for _, p := range []string{PartRootfs, PartCheckpoint} {
		err := s.client.RemoveObject(ctx, s.cfg.Bucket, s.Key(snapshotID, p), minio.RemoveObjectOptions{})
		var er minio.ErrorResponse
		if err != nil && !(errors.As(err, &er) && er.StatusCode == http.StatusNotFound) {
			errs = append(errs, fmt.Errorf("%w: delete %s: %v", ErrTransfer, p, err))
		}
	}
	return errors.Join(errs...)
}

// The bucket as plain objects, for control-plane data other than snapshot
// packages that shares the URL syntax, client and credentials handling
// (the image store's blobs and tags, `serve --image-store`). Keys are
// relative to the configured prefix; only the control plane calls these.

// PutObject uploads size bytes from r under key.
func (s *Store) PutObject(ctx context.Context, key string, r io.Reader, size int64) error {
	if _, err := s.client.PutObject(ctx, s.cfg.Bucket, s.cfg.Prefix+key, r, size, minio.PutObjectOptions{ContentType: "application/octet-stream"}); err != nil {
		return fmt.Errorf("%w: put %s: %v", ErrTransfer, key, err)
	}
	return nil
}

// GetObject streams the object under key; ErrObjectNotFound when there is
// none.
func (s *Store) GetObject(ctx context.Context, key string) (io.ReadCloser, error) {
	o, err := s.client.GetObject(ctx, s.cfg.Bucket, s.cfg.Prefix+key, minio.GetObjectOptions{})
	if err == nil {
		// minio's GetObject is lazy: Stat makes the request, so a missing
		// key is reported here rather than at the first Read.
		if _, err = o.Stat(); err != nil {
			o.Close()
		}
	}
	if err != nil {
		if notFound(err) {
			return nil, fmt.Errorf("%w: %s", ErrObjectNotFound, key)
		}
		return nil, fmt.Errorf("%w: get %s: %v", ErrTransfer, key, err)
	}
	return o, nil
}

// HasObject reports whether an object exists under key.
func (s *Store) HasObject(ctx context.Context, key string) (bool, error) {
	_, err := s.client.StatObject(ctx, s.cfg.Bucket, s.cfg.Prefix+key, minio.StatObjectOptions{})
	switch {
	case err == nil:
		return true, nil
	case notFound(err):
		return false, nil
	}
	return false, fmt.Errorf("%w: stat %s: %v", ErrTransfer, key, err)
}

// RemoveObject deletes the object under key; a missing one is no error.
func (s *Store) RemoveObject(ctx context.Context, key string) error {
	if err := s.client.RemoveObject(ctx, s.cfg.Bucket, s.cfg.Prefix+key, minio.RemoveObjectOptions{}); err != nil && !notFound(err) {
		return fmt.Errorf("%w: delete %s: %v", ErrTransfer, key, err)
	}
	return nil
}

func notFound(err error) bool {
	var er minio.ErrorResponse
	return errors.As(err, &er) && (er.StatusCode == http.StatusNotFound || er.Code == "NoSuchKey")
}
