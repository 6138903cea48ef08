package main

import (
	"fmt"
	"slices"

	"github.com/cubicle-dev/cubicle/internal/hostmount"
)

// hostMountPrefixes checks --host-mount-prefix values and returns them
// canonical: absolute, existing directories, never the host's root, with
// the operator's own symlinks resolved once here (below them, no symlink
// is ever followed).
func hostMountPrefixes(flags []string) ([]string, error) {
	var out []string
	for _, p := range flags {
		c, err := hostmount.CheckPrefix(p)
		if err != nil {
			return nil, fmt.Errorf("--host-mount-prefix: %w", err)
		}
		if !slices.Contains(out, c) {
			out = append(out, c)
		}
	}
	return out, nil
}
