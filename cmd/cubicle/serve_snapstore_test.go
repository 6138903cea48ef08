package main

import (
	"errors"
	"strings"
	"testing"

	"github.com/cubicle-dev/cubicle/internal/snapstore"
)

// --snapshot-store: none is no store; a bad URL or missing credentials
// stop serve with an error naming the flag; credentials come from the
// environment (Cubicle's names first, then AWS's).
func TestSnapshotStoreFlag(t *testing.T) {
	env := func(kv map[string]string) func(string) string { return func(k string) string { return kv[k] } }
	if s, err := snapshotStore("", env(nil)); s != nil || err != nil {
		t.Fatalf("no flag: %v %v", s, err)
	}
	for _, bad := range []string{"http://bucket", "s3://", "s3://b/path", "s3://b?endpoint=ftp://x", "s3://b?colour=red", "s3://user:pw@b", "s3://b?prefix=nodash"} {
		_, err := snapshotStore(bad, env(map[string]string{envSnapAccessKey: "a", envSnapSecretKey: "s"}))
		if !errors.Is(err, snapstore.ErrInvalidConfig) || !strings.Contains(err.Error(), "--snapshot-store") {
			t.Fatalf("%q: %v, want ErrInvalidConfig naming the flag", bad, err)
		}
	}
	url := "s3://snaps?endpoint=http://127.0.0.1:9000&region=eu-west-1&pathStyle=true"
	if _, err := snapshotStore(url, env(nil)); !errors.Is(err, snapstore.ErrInvalidConfig) || !strings.Contains(err.Error(), envSnapAccessKey) {
		t.Fatalf("no credentials: %v", err)
	}
	for _, kv := range []map[string]string{
		{envSnapAccessKey: "a", envSnapSecretKey: "s"},
		{"AWS_ACCESS_KEY_ID": "a", "AWS_SECRET_ACCESS_KEY": "s"},
	} {
		if s, err := snapshotStore(url, env(kv)); err != nil || s == nil {
			t.Fatalf("%v: %v", kv, err)
		}
	}
}

// --image-store: the same URL syntax, its own credential variables first,
// errors naming the flag.
func TestImageStoreFlag(t *testing.T) {
	env := func(kv map[string]string) func(string) string { return func(k string) string { return kv[k] } }
	if s, err := imageStore("", env(nil)); s != nil || err != nil {
		t.Fatalf("no flag: %v %v", s, err)
	}
	if _, err := imageStore("s3://b?colour=red", env(map[string]string{envImageAccessKey: "a", envImageSecretKey: "s"})); !errors.Is(err, snapstore.ErrInvalidConfig) || !strings.Contains(err.Error(), "--image-store") {
		t.Fatalf("bad URL: %v, want ErrInvalidConfig naming the flag", err)
	}
	url := "s3://images?endpoint=http://127.0.0.1:9000&region=eu-west-1&prefix=oci/&pathStyle=true"
	// The snapshot store's keys are not the image store's.
	if _, err := imageStore(url, env(map[string]string{envSnapAccessKey: "a", envSnapSecretKey: "s"})); !errors.Is(err, snapstore.ErrInvalidConfig) || !strings.Contains(err.Error(), envImageAccessKey) {
		t.Fatalf("no credentials: %v", err)
	}
	for _, kv := range []map[string]string{
		{envImageAccessKey: "a", envImageSecretKey: "s"},
		{"AWS_ACCESS_KEY_ID": "a", "AWS_SECRET_ACCESS_KEY": "s"},
	} {
		if s, err := imageStore(url, env(kv)); err != nil || s == nil {
			t.Fatalf("%v: %v", kv, err)
		}
	}
}
