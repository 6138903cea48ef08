package main

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/cubicle-dev/cubicle/internal/clusterpki"
	"github.com/cubicle-dev/cubicle/internal/node"
)

// serve's node flags are checked before anything touches the host.
func TestServeNodeFlags(t *testing.T) {
	for _, tc := range []struct {
		name string
		o    serveOptions
		want string // "" = accepted
	}{
		{"defaults", serveOptions{nodeID: "local", embeddedNode: true}, ""},
		{"named node", serveOptions{nodeID: "edge-1", embeddedNode: true}, ""},
		{"bad node id", serveOptions{nodeID: "Node_1", embeddedNode: true}, "--node-id"},
		{"empty node id", serveOptions{nodeID: "", embeddedNode: true}, "--node-id"},
		{"pure control plane without TLS", serveOptions{nodeID: "local"}, "needs TLS"},
		{"pure control plane with TLS", serveOptions{nodeID: "local", tlsSelfSigned: true}, ""},
		{"pure control plane with a buildkitd path", serveOptions{nodeID: "local", tlsSelfSigned: true, buildkitd: "/usr/bin/buildkitd"}, "--buildkitd"},
		{"pure control plane with buildkitd off", serveOptions{nodeID: "local", tlsSelfSigned: true, buildkitd: "off"}, ""},
		{"embedded with a buildkitd path", serveOptions{nodeID: "local", embeddedNode: true, buildkitd: "/usr/bin/buildkitd"}, ""},
		{"overcommit with nothing to act on", serveOptions{nodeID: "local", embeddedNode: true, cpuOvercommit: 4}, "--cpu-overcommit"},
		{"overcommit with reservations", serveOptions{nodeID: "local", embeddedNode: true, cpuOvercommit: 4, reserveCapacity: true}, ""},
		{"overcommit for remote nodes", serveOptions{nodeID: "local", embeddedNode: true, cpuOvercommit: 4, tlsSelfSigned: true}, ""},
		{"publish built-ins without TLS", serveOptions{nodeID: "local", embeddedNode: true, publishBuiltins: true}, "--publish-builtins: this server has no node registry"},
		{"publish built-ins with TLS", serveOptions{nodeID: "local", embeddedNode: true, publishBuiltins: true, tlsCert: "c.pem"}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := clusterFlags(&tc.o)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("got %v, want an error naming %q", err, tc.want)
			}
			if strings.HasPrefix(tc.name, "bad") && !errors.Is(err, clusterpki.ErrInvalidNodeID) {
				t.Fatalf("not typed: %v", err)
			}
		})
	}
}

// A node's templates: the built-ins in its images dir, templates it
// pulled (cubicle/<id>) and built-ins it pulled (builtin/<name>), once each.
func TestNodeTemplates(t *testing.T) {
	dir := t.TempDir()
	for _, d := range []string{"mini/rootfs", "cache/abc/rootfs", "refs"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	d := "sha256:" + strings.Repeat("ab", 32)
	got := nodeTemplates(dir, []node.Image{{Name: "builtin/base", Digest: d}, {Name: "builtin/mini", Digest: d}, {Name: "cubicle/tpl-1", Digest: d}, {Name: "other/x", Digest: d}})
	if want := []string{"mini", "base", "tpl-1"}; !slices.Equal(got, want) {
		t.Fatalf("nodeTemplates = %v, want %v", got, want)
	}
}
