package clusterbuild

import (
	"slices"
	"testing"
)

// A build's credentials resolve the tags of the image its Dockerfile is
// built FROM in the control plane's registry, and of no other repository:
// not one a later line names.
func TestRegistryRepos(t *testing.T) {
	for df, want := range map[string][]string{
		"FROM " + RegistryHost + "/cubicle/parent:b3\nRUN echo FROM " + RegistryHost + "/cubicle/victim\nFROM " + RegistryHost + "/cubicle/victim:b1\n": {"cubicle/parent"},
		"FROM " + RegistryHost + "/cubicle/parent@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef\n":                            {"cubicle/parent"},
		"FROM docker.io/library/alpine:3\n":                       nil,
		"RUN true\nFROM " + RegistryHost + "/cubicle/victim:b1\n": nil,
	} {
		if got := registryRepos([]byte(df)); !slices.Equal(got, want) {
			t.Errorf("registryRepos(%q) = %q, want %q", df, got, want)
		}
	}
}
