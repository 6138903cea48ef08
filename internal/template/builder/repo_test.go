package builder

import "testing"

// A node's cached image names its template back (the scheduler's "image
// cached" score); other repositories name none.
func TestTemplateOfRepository(t *testing.T) {
	if id, ok := TemplateOfRepository(ImageRepository("tpl_abc")); !ok || id != "tpl_abc" {
		t.Fatalf("round trip: %q %v", id, ok)
	}
	for _, r := range []string{"cubicle/", "library/ubuntu", "cubicle/a/b", "it/node-pull"} {
		if id, ok := TemplateOfRepository(r); ok {
			t.Errorf("%q named template %q", r, id)
		}
	}
}
