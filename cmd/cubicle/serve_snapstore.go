package main

import (
	"fmt"

	"github.com/cubicle-dev/cubicle/internal/control"
	"github.com/cubicle-dev/cubicle/internal/snapstore"
)

// Credentials of --snapshot-store and --image-store come from the
// environment, never the URL or a flag (both show in ps and logs); AWS's
// names are the fallback.
const (
	envSnapAccessKey  = "CUBICLE_SNAPSHOT_S3_ACCESS_KEY"
	envSnapSecretKey  = "CUBICLE_SNAPSHOT_S3_SECRET_KEY"
	envImageAccessKey = "CUBICLE_IMAGE_S3_ACCESS_KEY"
	envImageSecretKey = "CUBICLE_IMAGE_S3_SECRET_KEY"
)

// snapshotStore builds --snapshot-store ("" = none: snapshots restore on
// their own node only). Nodes never see the credentials: the control
// plane signs per-object URLs for them.
func snapshotStore(raw string, getenv func(string) string) (control.SnapshotStore, error) {
	s, err := s3Bucket("--snapshot-store", raw, envSnapAccessKey, envSnapSecretKey, getenv)
	if s == nil || err != nil {
		return nil, err
	}
	return s, nil
}

// imageStore builds --image-store ("" = none: this replica's image store
// is its own). Only the control plane reads and writes it; nodes pull
// from the control plane's registry as before.
func imageStore(raw string, getenv func(string) string) (*snapstore.Store, error) {
	return s3Bucket("--image-store", raw, envImageAccessKey, envImageSecretKey, getenv)
}

// s3Bucket parses an s3:// flag and takes its credentials from accessEnv
// and secretEnv, else AWS's variables. nil, nil for "".
func s3Bucket(flag, raw, accessEnv, secretEnv string, getenv func(string) string) (*snapstore.Store, error) {
	if raw == "" {
		return nil, nil
	}
	cfg, err := snapstore.Parse(raw)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", flag, err)
	}
	cfg.AccessKey, cfg.SecretKey = getenv(accessEnv), getenv(secretEnv)
	if cfg.AccessKey == "" && cfg.SecretKey == "" {
		cfg.AccessKey, cfg.SecretKey = getenv("AWS_ACCESS_KEY_ID"), getenv("AWS_SECRET_ACCESS_KEY")
	}
	s, err := snapstore.New(cfg)
	if err != nil {
		return nil, fmt.Errorf("%s: %w (credentials: %s and %s, or AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY)", flag, err, accessEnv, secretEnv)
	}
	return s, nil
}
