// Package s3 is Cubicle's reference volume plugin for S3-compatible object
// storage: Create/Destroy manage a key prefix per volume with the S3 API,
// Attach/Detach mount that prefix on the node with s3fs-fuse. It is run as a
// standalone binary (cmd/cubicle-volume-s3) in either the binary or the rpc
// plugin mode; Cubicle itself never links it.
package s3

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"sort"
	"strings"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"

	"github.com/cubicle-dev/cubicle/internal/volume"
)

// Typed errors. Each wraps a volume sentinel so callers that only know the
// protocol can still classify them with errors.Is.
var (
	// ErrInvalidConfig: the plugin's own configuration is unusable.
	ErrInvalidConfig = fmt.Errorf("%w: s3 plugin config", volume.ErrConfig)
	// ErrInvalidRequest: a hook got an argument it cannot act on (bad
	// volume ID, private_data, base dir, metadata).
	ErrInvalidRequest = fmt.Errorf("%w: s3: invalid request", volume.ErrPlugin)
	// ErrBackend: an S3 API call failed.
	ErrBackend = fmt.Errorf("%w: s3: backend", volume.ErrPlugin)
	// ErrMount: s3fs did not produce a working mount.
	ErrMount = fmt.Errorf("%w: s3: mount", volume.ErrPlugin)
	// ErrMountTimeout: the mount did not come up within mount_timeout.
	ErrMountTimeout = fmt.Errorf("%w: %w", ErrMount, volume.ErrPluginTimeout)
	// ErrUnmount: the mount could not be torn down.
	ErrUnmount = fmt.Errorf("%w: s3: unmount", volume.ErrPlugin)
)

// MountDirPrefix names mount points: <volume_base_dir>/s3-<volumeID>.
const MountDirPrefix = "s3-"

// Plugin implements volume.Plugin over one bucket.
type Plugin struct {
	cfg    Config
	client *minio.Client
}

var _ volume.Plugin = (*Plugin)(nil)

// New validates cfg (defaults applied) and builds the S3 client. It does not
// contact the server, so a node-only deployment starts even when the S3
// endpoint is briefly unreachable.
func New(cfg Config) (*Plugin, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	u, _ := url.Parse(cfg.Endpoint) // validated above
	lookup := minio.BucketLookupDNS
	if cfg.UsePathStyle() {
		lookup = minio.BucketLookupPath
	}
	opts := &minio.Options{
		Creds:        credentials.NewStaticV4(cfg.AccessKey, cfg.SecretKey, ""),
		Secure:       u.Scheme == "https",
		Region:       cfg.Region,
		BucketLookup: lookup,
		// Hooks have their own deadlines; minio's default of 10 retries
		// with backoff would outlive them against a dead endpoint.
		MaxRetries: 2,
	}
	if cfg.InsecureSkipVerify {
		tr := http.DefaultTransport.(*http.Transport).Clone()
		tr.TLSClientConfig = &tls.Config{InsecureSkipVerify: true} //nolint:gosec // opt-in for test endpoints
		opts.Transport = tr
	}
	client, err := minio.New(u.Host, opts)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalidConfig, err)
	}
	return &Plugin{cfg: cfg, client: client}, nil
}

// Config returns the effective configuration (defaults applied).
func (p *Plugin) Config() Config { return p.cfg }

// volumePrefix is the object prefix of a volume: "<prefix><id>/".
func (p *Plugin) volumePrefix(id string) string { return p.cfg.Prefix + id + "/" }

func validateID(id string) error {
	if err := volume.ValidateName(id); err != nil {
		return fmt.Errorf("%w: volume_id: %v", ErrInvalidRequest, err)
	}
	return nil
}

// Create makes sure the bucket (optionally) and the volume's directory
// marker exist. The marker matters: s3fs refuses to mount a bucket path
// with no object under it on some servers, and it makes an empty volume
// visible in listings. Creating an existing volume is a no-op.
func (p *Plugin) Create(ctx context.Context, req volume.CreateRequest) (volume.CreateResult, error) {
	if err := validateID(req.VolumeID); err != nil {
		return volume.CreateResult{}, err
	}
	if p.cfg.CreateBucket {
		if err := p.ensureBucket(ctx); err != nil {
			return volume.CreateResult{}, err
		}
	}
	key := p.volumePrefix(req.VolumeID)
	if len(key) > volume.MaxPrivateData {
		return volume.CreateResult{}, fmt.Errorf("%w: object prefix %q exceeds %d bytes", ErrInvalidRequest, key, volume.MaxPrivateData)
	}
	// s3fs's own directory objects carry this content type and a mode; a
	// marker shaped like theirs is shown as a normal directory.
	_, err := p.client.PutObject(ctx, p.cfg.Bucket, key, strings.NewReader(""), 0, minio.PutObjectOptions{
		ContentType:  "application/x-directory",
		UserMetadata: map[string]string{"mode": "16895"}, // S_IFDIR|0777
		// Over http minio-go sends an empty body as one aws-chunked frame,
		// which some servers (versitygw) leave half-read on a kept-alive
		// connection, breaking the next request. An empty body has
		// nothing to sign anyway.
		DisableContentSha256: true,
	})
	if err != nil {
		return volume.CreateResult{}, fmt.Errorf("%w: put marker s3://%s/%s: %v", ErrBackend, p.cfg.Bucket, key, err)
	}
	return volume.CreateResult{PrivateData: key}, nil
}

func (p *Plugin) ensureBucket(ctx context.Context) error {
	ok, err := p.client.BucketExists(ctx, p.cfg.Bucket)
	if err != nil {
		return fmt.Errorf("%w: bucket %q: %v", ErrBackend, p.cfg.Bucket, err)
	}
	if ok {
		return nil
	}
	err = p.client.MakeBucket(ctx, p.cfg.Bucket, minio.MakeBucketOptions{Region: p.cfg.Region})
	if err != nil {
		// Lost a race with another creator: fine.
		if code := minio.ToErrorResponse(err).Code; code == "BucketAlreadyOwnedByYou" || code == "BucketAlreadyExists" {
			return nil
		}
		return fmt.Errorf("%w: create bucket %q: %v", ErrBackend, p.cfg.Bucket, err)
	}
	return nil
}

// destroyPasses bounds Destroy's list-and-delete rounds. More than one is
// needed on backends that map keys to a file tree (versitygw, some NAS
// gateways): an implicit directory only shows up as its own key once its
// children are gone.
const destroyPasses = 5

// Destroy deletes every object under the volume's prefix. It is idempotent;
// a missing bucket means there is nothing to delete.
func (p *Plugin) Destroy(ctx context.Context, req volume.DestroyRequest) error {
	if err := validateID(req.VolumeID); err != nil {
		return err
	}
	prefix := p.volumePrefix(req.VolumeID)
	for pass := 0; pass < destroyPasses; pass++ {
		keys, err := p.listKeys(ctx, prefix)
		if err != nil {
			if minio.ToErrorResponse(err).Code == "NoSuchBucket" {
				return nil
			}
			return fmt.Errorf("%w: list s3://%s/%s: %v", ErrBackend, p.cfg.Bucket, prefix, err)
		}
		if len(keys) == 0 {
			return nil
		}
		if err := p.removeKeys(ctx, keys); err != nil {
			return err
		}
	}
	return fmt.Errorf("%w: objects still listed under s3://%s/%s after %d delete passes", ErrBackend, p.cfg.Bucket, prefix, destroyPasses)
}

// listKeys returns every key under prefix, deepest first, so that
// file-tree backends can drop directory objects after their contents.
func (p *Plugin) listKeys(ctx context.Context, prefix string) ([]string, error) {
	var keys []string
	for obj := range p.client.ListObjects(ctx, p.cfg.Bucket, minio.ListObjectsOptions{Prefix: prefix, Recursive: true}) {
		if obj.Err != nil {
			return nil, obj.Err
		}
		keys = append(keys, obj.Key)
	}
	sort.SliceStable(keys, func(i, j int) bool {
		di, dj := strings.Count(strings.TrimSuffix(keys[i], "/"), "/"), strings.Count(strings.TrimSuffix(keys[j], "/"), "/")
		if di != dj {
			return di > dj
		}
		return keys[i] > keys[j]
	})
	return keys, nil
}

func (p *Plugin) removeKeys(ctx context.Context, keys []string) error {
	ch := make(chan minio.ObjectInfo)
	go func() {
		defer close(ch)
		for _, k := range keys {
			select {
			case ch <- minio.ObjectInfo{Key: k}:
			case <-ctx.Done():
				return
			}
		}
	}()
	var errs []error
	for rerr := range p.client.RemoveObjects(ctx, p.cfg.Bucket, ch, minio.RemoveObjectsOptions{}) {
		if rerr.Err != nil && minio.ToErrorResponse(rerr.Err).Code != "NoSuchKey" {
			errs = append(errs, fmt.Errorf("%s: %v", rerr.ObjectName, rerr.Err))
		}
	}
	if err := ctx.Err(); err != nil {
		errs = append(errs, err)
	}
	if len(errs) > 0 {
		if len(errs) > 5 {
			errs = append(errs[:5], fmt.Errorf("and %d more", len(errs)-5))
		}
		return fmt.Errorf("%w: delete objects: %v", ErrBackend, errors.Join(errs...))
	}
	return nil
}

// deadline is the earlier of ctx's deadline and now+d.
func deadline(ctx context.Context, d time.Duration) time.Time {
	t := time.Now().Add(d)
	if dl, ok := ctx.Deadline(); ok && dl.Before(t) {
		return dl
	}
	return t
}
