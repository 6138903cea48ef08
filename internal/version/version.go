// Package version carries the build version, set with -ldflags.
package version

// Version is overridden at build time: -ldflags "-X github.com/cubicle-dev/cubicle/internal/version.Version=v1.2.3".
var Version = "dev"
