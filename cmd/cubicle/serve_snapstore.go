package main

import (
	"fmt"

	"github.com/cubicle-dev/cubicle/internal/control"
	"github.com/cubicle-dev/cubicle/internal/snapstore"
)

// Credentials of --snapshot-store come from the environment, never the
// URL or a flag (both show in ps and logs); AWS's names are the fallback.
const (
	envSnapAccessKey = "CUBICLE_SNAPSHOT_S3_ACCESS_KEY"
	envSnapSecretKey = "CUBICLE_SNAPSHOT_S3_SECRET_KEY"
)

// snapshotStore builds --snapshot-store ("" = none: snapshots restore on
// their own node only). Nodes never see the credentials: the control
// plane signs per-object URLs for them.
func snapshotStore(raw string, getenv func(string) string) (control.SnapshotStore, error) {
	if raw == "" {
		return nil, nil
	}
	cfg, err := snapstore.Parse(raw)
	if err != nil {
		return nil, fmt.Errorf("--snapshot-store: %w", err)
	}
	cfg.AccessKey, cfg.SecretKey = getenv(envSnapAccessKey), getenv(envSnapSecretKey)
	if cfg.AccessKey == "" && cfg.SecretKey == "" {
		cfg.AccessKey, cfg.SecretKey = getenv("AWS_ACCESS_KEY_ID"), getenv("AWS_SECRET_ACCESS_KEY")
	}
	s, err := snapstore.New(cfg)
	if err != nil {
		return nil, fmt.Errorf("--snapshot-store: %w (credentials: %s and %s, or AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY)", err, envSnapAccessKey, envSnapSecretKey)
	}
	return s, nil
}
