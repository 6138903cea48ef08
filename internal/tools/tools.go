//go:build tools

// Package tools pins the binaries `make build` compiles from the module
// graph rather than from this repository (buildkitd), so that `go mod tidy`
// keeps their dependencies in go.mod and go.sum. The build tag keeps it out
// of every real build.
//
// Tidy with `go mod tidy -e`: a test inside one of buildkitd's dependencies
// (sigstore/rekor's fuzz helpers, through sassoftware/relic) imports
// golang.org/x/crypto/openpgp, which x/crypto no longer has. Nothing that
// is built needs it; plain tidy stops there, -e records everything else.
package tools

import (
	_ "github.com/moby/buildkit/cmd/buildkitd"
)
