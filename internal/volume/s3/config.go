package s3

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// DefaultConfigPath is read when neither --config nor CUBICLE_S3_CONFIG
// names a file; a missing default file is not an error (env-only setups).
const DefaultConfigPath = "/etc/cubicle/s3-volume.json"

// Defaults for optional settings.
const (
	DefaultRegion         = "us-east-1"
	DefaultPrefix         = "volumes/"
	DefaultStateDir       = "/var/lib/cubicle-volume-s3"
	DefaultMountTimeout   = 30 * time.Second
	DefaultUnmountTimeout = 10 * time.Second
	DefaultS3FS           = "s3fs"
)

// Duration is a time.Duration that reads from JSON as "30s" or as a number
// of seconds.
type Duration time.Duration

// UnmarshalJSON accepts "1m30s" or 90.
func (d *Duration) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	if len(b) > 0 && b[0] == '"' {
		var s string
		if err := json.Unmarshal(b, &s); err != nil {
			return err
		}
		v, err := parseDuration(s)
		if err != nil {
			return err
		}
		*d = Duration(v)
		return nil
	}
	var secs float64
	if err := json.Unmarshal(b, &secs); err != nil {
		return fmt.Errorf("duration must be a string like \"30s\" or a number of seconds: %w", err)
	}
	*d = Duration(secs * float64(time.Second))
	return nil
}

// MarshalJSON writes the string form.
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

func parseDuration(s string) (time.Duration, error) {
	if secs, err := strconv.ParseFloat(s, 64); err == nil {
		return time.Duration(secs * float64(time.Second)), nil
	}
	return time.ParseDuration(s)
}

// Config is the plugin's own configuration: Cubicle never sees it, it only
// runs the plugin. Loaded by LoadConfig from a JSON file and/or CUBICLE_S3_*
// environment variables (env wins).
type Config struct {
	// Endpoint is the S3 API base URL, e.g. "https://s3.eu-west-1.amazonaws.com"
	// or "http://127.0.0.1:7070". Required.
	Endpoint string `json:"endpoint"`
	// Region signs requests (SigV4). Default us-east-1.
	Region string `json:"region,omitempty"`
	// Bucket holds every volume. Required.
	Bucket string `json:"bucket"`
	// Prefix is prepended to the volume ID: volume "v1" lives under
	// "<prefix>v1/". Default "volumes/"; "" is not allowed (a volume would
	// then be the bucket root's sibling of every other key).
	Prefix string `json:"prefix,omitempty"`
	// AccessKey / SecretKey are the S3 credentials. Required.
	AccessKey string `json:"access_key"`
	SecretKey string `json:"secret_key"`
	// PathStyle selects http://host/bucket/key addressing (MinIO, versitygw,
	// most self-hosted servers). nil means true.
	PathStyle *bool `json:"path_style,omitempty"`
	// CreateBucket makes Create create the bucket when it is missing.
	CreateBucket bool `json:"create_bucket,omitempty"`
	// InsecureSkipVerify disables TLS certificate checks (self-signed
	// test endpoints only).
	InsecureSkipVerify bool `json:"insecure_skip_verify,omitempty"`
	// S3FS is the s3fs binary (default "s3fs" on PATH).
	S3FS string `json:"s3fs_path,omitempty"`
	// S3FSOptions are extra "-o" options appended after the built-in ones,
	// e.g. ["enable_noobj_cache", "multipart_size=64"].
	S3FSOptions []string `json:"s3fs_options,omitempty"`
	// MountTimeout bounds Attach's wait for the s3fs mount to come up.
	MountTimeout Duration `json:"mount_timeout,omitempty"`
	// UnmountTimeout bounds Detach's clean unmount before it falls back to a
	// lazy one.
	UnmountTimeout Duration `json:"unmount_timeout,omitempty"`
	// StateDir holds the s3fs credentials file (0600), per-volume locks and
	// s3fs logs. Must not be inside the node's volume base dir.
	StateDir string `json:"state_dir,omitempty"`
}

// UsePathStyle reports the effective path-style setting.
func (c Config) UsePathStyle() bool { return c.PathStyle == nil || *c.PathStyle }

// Environment variables read by LoadConfig.
const (
	EnvConfig         = "CUBICLE_S3_CONFIG"
	EnvEndpoint       = "CUBICLE_S3_ENDPOINT"
	EnvRegion         = "CUBICLE_S3_REGION"
	EnvBucket         = "CUBICLE_S3_BUCKET"
	EnvPrefix         = "CUBICLE_S3_PREFIX"
	EnvAccessKey      = "CUBICLE_S3_ACCESS_KEY"
	EnvSecretKey      = "CUBICLE_S3_SECRET_KEY"
	EnvPathStyle      = "CUBICLE_S3_PATH_STYLE"
	EnvCreateBucket   = "CUBICLE_S3_CREATE_BUCKET"
	EnvInsecure       = "CUBICLE_S3_INSECURE_SKIP_VERIFY"
	EnvS3FS           = "CUBICLE_S3_S3FS"
	EnvS3FSOptions    = "CUBICLE_S3_S3FS_OPTIONS"
	EnvMountTimeout   = "CUBICLE_S3_MOUNT_TIMEOUT"
	EnvUnmountTimeout = "CUBICLE_S3_UNMOUNT_TIMEOUT"
	EnvStateDir       = "CUBICLE_S3_STATE_DIR"
)

// LoadConfig reads the config file (path, else $CUBICLE_S3_CONFIG, else
// DefaultConfigPath if it exists), applies CUBICLE_S3_* overrides from
// environ, fills defaults and validates. An explicitly named file must exist.
func LoadConfig(path string, environ []string) (Config, error) {
	env := map[string]string{}
	for _, kv := range environ {
		if k, v, ok := strings.Cut(kv, "="); ok {
			env[k] = v
		}
	}
	var cfg Config
	explicit := path != ""
	if !explicit {
		path, explicit = env[EnvConfig], env[EnvConfig] != ""
	}
	if path == "" {
		path = DefaultConfigPath
	}
	data, err := os.ReadFile(path)
	switch {
	case err == nil:
		dec := json.NewDecoder(bytes.NewReader(data))
		// A typo in a key would otherwise silently fall back to a default.
		dec.DisallowUnknownFields()
		if err := dec.Decode(&cfg); err != nil {
			return Config{}, fmt.Errorf("%w: %s: %v", ErrInvalidConfig, path, err)
		}
	case explicit || !errors.Is(err, os.ErrNotExist):
		return Config{}, fmt.Errorf("%w: %v", ErrInvalidConfig, err)
	}

	str := func(key string, dst *string) {
		if v, ok := env[key]; ok && v != "" {
			*dst = v
		}
	}
	str(EnvEndpoint, &cfg.Endpoint)
	str(EnvRegion, &cfg.Region)
	str(EnvBucket, &cfg.Bucket)
	if v, ok := env[EnvPrefix]; ok {
		cfg.Prefix = v
	}
	str(EnvAccessKey, &cfg.AccessKey)
	str(EnvSecretKey, &cfg.SecretKey)
	str(EnvS3FS, &cfg.S3FS)
	str(EnvStateDir, &cfg.StateDir)
	boolean := func(key string, set func(bool)) error {
		v, ok := env[key]
		if !ok || v == "" {
			return nil
		}
		b, err := strconv.ParseBool(v)
		if err != nil {
			return fmt.Errorf("%w: %s=%q: %v", ErrInvalidConfig, key, v, err)
		}
		set(b)
		return nil
	}
	if err := errors.Join(
		boolean(EnvPathStyle, func(b bool) { cfg.PathStyle = &b }),
		boolean(EnvCreateBucket, func(b bool) { cfg.CreateBucket = b }),
		boolean(EnvInsecure, func(b bool) { cfg.InsecureSkipVerify = b }),
	); err != nil {
		return Config{}, err
	}
	if v := env[EnvS3FSOptions]; v != "" {
		cfg.S3FSOptions = nil
		for _, o := range strings.Split(v, ",") {
			if o = strings.TrimSpace(o); o != "" {
				cfg.S3FSOptions = append(cfg.S3FSOptions, o)
			}
		}
	}
	for key, dst := range map[string]*Duration{EnvMountTimeout: &cfg.MountTimeout, EnvUnmountTimeout: &cfg.UnmountTimeout} {
		if v := env[key]; v != "" {
			d, err := parseDuration(v)
			if err != nil {
				return Config{}, fmt.Errorf("%w: %s=%q: %v", ErrInvalidConfig, key, v, err)
			}
			*dst = Duration(d)
		}
	}
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return Config{}, err
	}
	return cfg, nil
}

// setDefaults fills unset optional fields. A Prefix of "" cannot be told
// apart from unset, so it becomes the default.
func (c *Config) setDefaults() {
	if c.Region == "" {
		c.Region = DefaultRegion
	}
	if c.Prefix == "" {
		c.Prefix = DefaultPrefix
	}
	c.Prefix = strings.TrimLeft(c.Prefix, "/")
	if !strings.HasSuffix(c.Prefix, "/") {
		c.Prefix += "/"
	}
	if c.S3FS == "" {
		c.S3FS = DefaultS3FS
	}
	if c.MountTimeout <= 0 {
		c.MountTimeout = Duration(DefaultMountTimeout)
	}
	if c.UnmountTimeout <= 0 {
		c.UnmountTimeout = Duration(DefaultUnmountTimeout)
	}
	if c.StateDir == "" {
		c.StateDir = DefaultStateDir
	}
}

// Validate checks required fields and shapes; it expects defaults applied.
func (c Config) Validate() error {
	var errs []error
	bad := func(format string, a ...any) {
		errs = append(errs, fmt.Errorf("%w: "+format, append([]any{ErrInvalidConfig}, a...)...))
	}
	if c.Endpoint == "" {
		bad("endpoint is required (%s)", EnvEndpoint)
	} else if u, err := url.Parse(c.Endpoint); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		bad("endpoint %q must be an http:// or https:// URL", c.Endpoint)
	} else if u.Path != "" && u.Path != "/" {
		bad("endpoint %q must not have a path", c.Endpoint)
	}
	if c.Bucket == "" {
		bad("bucket is required (%s)", EnvBucket)
	} else if strings.ContainsAny(c.Bucket, "/: ") {
		bad("bucket %q is not a bucket name", c.Bucket)
	}
	if c.AccessKey == "" || c.SecretKey == "" {
		bad("access_key and secret_key are required (%s, %s)", EnvAccessKey, EnvSecretKey)
	}
	if strings.Contains(c.AccessKey, ":") {
		// s3fs's passwd file is "AK:SK".
		bad("access_key must not contain ':'")
	}
	if c.Prefix != "" && !validKeyPath(c.Prefix) {
		bad("prefix %q must be a relative key path without '..' or '//'", c.Prefix)
	}
	for _, o := range c.S3FSOptions {
		if o == "" || strings.ContainsAny(o, ",\n") {
			bad("s3fs option %q must be a single option (no commas)", o)
		}
	}
	if !filepath.IsAbs(c.StateDir) {
		bad("state_dir %q must be absolute", c.StateDir)
	}
	return errors.Join(errs...)
}

// validKeyPath accepts "a/b/" style prefixes that s3fs can mount: no leading
// slash, no empty, "." or ".." segments.
func validKeyPath(p string) bool {
	p = strings.TrimSuffix(p, "/")
	if p == "" || strings.HasPrefix(p, "/") {
		return false
	}
	for _, seg := range strings.Split(p, "/") {
		if seg == "" || seg == "." || seg == ".." {
			return false
		}
	}
	return !strings.ContainsAny(p, "\x00\n:")
}
