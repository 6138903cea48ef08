// Package snapstoretest gives tests and benchmarks a snapshot store over a
// real S3 server (versitygw on loopback), stopped with the test.
package snapstoretest

import (
	"net/url"
	"testing"

	"github.com/cubicle-dev/cubicle/internal/snapstore"
	"github.com/cubicle-dev/cubicle/internal/volume/s3/s3test"
)

// New starts an S3 server and returns a store on its bucket with the
// server's keys, as `serve --snapshot-store` would make it.
func New(tb testing.TB) (*snapstore.Store, *s3test.Server) {
	tb.Helper()
	gw := s3test.Start(tb)
	cfg, err := snapstore.Parse("s3://" + gw.Bucket + "?endpoint=" + url.QueryEscape(gw.Endpoint) + "&region=" + gw.Region + "&pathStyle=true")
	if err != nil {
		tb.Fatal(err)
	}
	cfg.AccessKey, cfg.SecretKey = gw.AccessKey, gw.SecretKey
	st, err := snapstore.New(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	return st, gw
}
