package catalog

import (
	"strings"
	"testing"
)

// The log scrubber removes the build's registry credentials and header values.
func TestScrubRemovesSecrets(t *testing.T) {
	c := New(Config{})
	reg := &Registry{Type: "registry", Username: "ci", Password: "fixture-Pa55word"}
	c.secrets["bld_1"] = reg.secrets()
	for _, msg := range []string{
		"pull 127.0.0.1/x: unauthorized: user ci password fixture-Pa55word rejected",
		"GET /v2/ Authorization: Basic Y2k6Zml4dHVyZS1QYTU1d29yZA==",
	} {
		got := c.scrub("bld_1", msg)
		if strings.Contains(got, "fixture-Pa55word") || strings.Contains(got, "Y2k6Zml4dHVyZS1QYTU1d29yZA") {
			t.Fatalf("secret survived: %q", got)
		}
	}
	if got := c.scrub("bld_other", "nothing secret"); got != "nothing secret" {
		t.Fatalf("scrubbed an unrelated line: %q", got)
	}
}
