package s3

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/volume"
)

func writeConfig(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "s3-volume.json")
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestLoadConfigFileAndEnv(t *testing.T) {
	path := writeConfig(t, `{
		"endpoint": "https://s3.example.com",
		"bucket": "from-file",
		"access_key": "AKFILE",
		"secret_key": "SKFILE",
		"prefix": "/vols",
		"path_style": false,
		"s3fs_options": ["enable_noobj_cache"],
		"mount_timeout": "45s",
		"unmount_timeout": 3
	}`)
	cfg, err := LoadConfig(path, []string{EnvBucket + "=from-env", EnvSecretKey + "=SKENV", "UNRELATED=1"})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Bucket != "from-env" || cfg.SecretKey != "SKENV" || cfg.AccessKey != "AKFILE" {
		t.Errorf("env did not override file: %+v", cfg)
	}
	if cfg.Prefix != "vols/" || cfg.UsePathStyle() || cfg.Region != DefaultRegion || cfg.StateDir != DefaultStateDir || cfg.S3FS != "s3fs" {
		t.Errorf("defaults/normalisation wrong: %+v", cfg)
	}
	if time.Duration(cfg.MountTimeout) != 45*time.Second || time.Duration(cfg.UnmountTimeout) != 3*time.Second {
		t.Errorf("timeouts: %v %v", cfg.MountTimeout, cfg.UnmountTimeout)
	}
	if !slices.Equal(cfg.S3FSOptions, []string{"enable_noobj_cache"}) {
		t.Errorf("s3fs options %v", cfg.S3FSOptions)
	}

	// The config path can come from the environment too.
	cfg2, err := LoadConfig("", []string{EnvConfig + "=" + path, EnvPathStyle + "=true", EnvS3FSOptions + "=a=1, b"})
	if err != nil {
		t.Fatal(err)
	}
	if cfg2.Bucket != "from-file" || !cfg2.UsePathStyle() || !slices.Equal(cfg2.S3FSOptions, []string{"a=1", "b"}) {
		t.Errorf("config via %s: %+v", EnvConfig, cfg2)
	}
}

func TestLoadConfigErrors(t *testing.T) {
	base := map[string]string{
		EnvEndpoint: "http://127.0.0.1:9000", EnvBucket: "b", EnvAccessKey: "a", EnvSecretKey: "s",
		EnvConfig: writeConfig(t, "{}"),
	}
	envOf := func(over map[string]string) []string {
		var env []string
		for k, v := range base {
			if o, ok := over[k]; ok {
				v = o
			}
			if v != "" {
				env = append(env, k+"="+v)
			}
		}
		for k, v := range over {
			if _, ok := base[k]; !ok {
				env = append(env, k+"="+v)
			}
		}
		return env
	}
	if _, err := LoadConfig("", envOf(nil)); err != nil {
		t.Fatalf("env-only config: %v", err)
	}
	// "" removes the variable.
	cases := map[string]map[string]string{
		"no endpoint":      {EnvEndpoint: ""},
		"bad endpoint":     {EnvEndpoint: "127.0.0.1:9000"},
		"endpoint path":    {EnvEndpoint: "http://h/x"},
		"no bucket":        {EnvBucket: ""},
		"no secret":        {EnvSecretKey: ""},
		"colon key":        {EnvAccessKey: "a:b"},
		"bad prefix":       {EnvPrefix: "a/../b"},
		"bad bool":         {EnvPathStyle: "maybe"},
		"bad duration":     {EnvMountTimeout: "soon"},
		"relative state":   {EnvStateDir: "state"},
		"missing file":     {EnvConfig: "/nonexistent/s3.json"},
		"unknown field":    {EnvConfig: writeConfig(t, `{"bucket_name": "x"}`)},
		"comma in option":  {EnvConfig: writeConfig(t, `{"s3fs_options": ["a,b"]}`)},
		"malformed json":   {EnvConfig: writeConfig(t, `{`)},
		"bucket with path": {EnvBucket: "a/b"},
	}
	for name, over := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := LoadConfig("", envOf(over))
			if !errors.Is(err, ErrInvalidConfig) || !errors.Is(err, volume.ErrConfig) {
				t.Fatalf("err = %v, want ErrInvalidConfig", err)
			}
		})
	}
	if _, err := LoadConfig("/nonexistent/explicit.json", envOf(nil)); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("explicit missing file: %v", err)
	}
	if _, err := New(Config{}); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("New(empty): %v", err)
	}
}

func TestS3FSArgs(t *testing.T) {
	p, err := New(Config{Endpoint: "http://127.0.0.1:7070/", Bucket: "bkt", AccessKey: "a", SecretKey: "s", StateDir: "/var/lib/x", S3FSOptions: []string{"enable_noobj_cache"}})
	if err != nil {
		t.Fatal(err)
	}
	args := p.S3FSArgs("volumes/v1/", "/data/s3-v1", "/var/lib/x/passwd-s3fs", "/var/lib/x/logs/s3fs-v1.log")
	got := strings.Join(args, " ")
	for _, want := range []string{
		"bkt:/volumes/v1 /data/s3-v1 ",
		"-o url=http://127.0.0.1:7070 ",
		"-o passwd_file=/var/lib/x/passwd-s3fs",
		"-o use_path_request_style",
		"-o allow_other", "-o umask=0000", "-o endpoint=us-east-1",
		"-o enable_noobj_cache",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("s3fs args %q lack %q", got, want)
		}
	}
	if !strings.HasSuffix(got, "-o enable_noobj_cache") {
		t.Errorf("extra options must come last (they override): %q", got)
	}
}

func TestUnescapeMount(t *testing.T) {
	if got := unescapeMount(`/a\040b\011c\134d`); got != "/a b\tc\\d" {
		t.Errorf("got %q", got)
	}
}
