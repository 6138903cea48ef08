package catalog

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

// FuzzCreateBody: a POST /v3/templates body is refused with ErrInvalid or
// yields a valid name, distinct valid tags (at least one), and sizes within
// the server's bounds; the name and first tag, sent back as "name:tag",
// parse to the same pair.
func FuzzCreateBody(f *testing.F) {
	for _, s := range []string{
		`{"name":"my-template","tags":["v1","latest"],"cpuCount":2,"memoryMB":1024}`,
		`{"alias":"legacy","teamID":"t1","minFreeDiskMb":2048}`,
		`{"name":"app:v2","tags":["v2","prod"]}`,
		`{"name":"a:b:c"}`,
		`{"name":"UPPER"}`,
		`{"name":"x","cpuCount":0,"memoryMB":64}`,
		`{"name":"x","cpuCount":64,"memoryMB":1048576}`,
		`{"name":"x","minFreeDiskMb":-1}`,
		`{"name":"x","accelerators":{"required":[{"class":"gpu","count":1}]}}`,
		`{}`,
	} {
		f.Add(s)
	}
	c := &Catalog{cfg: Config{CPUCount: 2, MemoryMB: 512, DiskSizeMB: 1024, MaxCPUCount: 8, MaxMemoryMB: 8192, MaxDiskSizeMB: 10240}}
	f.Fuzz(func(t *testing.T, body string) {
		var req CreateRequest
		if json.Unmarshal([]byte(body), &req) != nil {
			return
		}
		name, tags, err := splitName(req)
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("splitName: %v is not ErrInvalid", err)
			}
			return
		}
		if !nameRE.MatchString(name) || len(tags) == 0 {
			t.Fatalf("name %q tags %q", name, tags)
		}
		seen := map[string]bool{}
		for _, tg := range tags {
			if !tagRE.MatchString(tg) || seen[tg] || strings.Contains(tg, ":") {
				t.Fatalf("tag %q in %q", tg, tags)
			}
			seen[tg] = true
		}
		n2, t2, err := splitName(CreateRequest{Name: name + ":" + tags[0]})
		if err != nil || n2 != name || len(t2) != 1 || t2[0] != tags[0] {
			t.Fatalf("%q:%q parses to %q %q %v", name, tags[0], n2, t2, err)
		}
		cpu, mem, disk, err := c.sizes(req, nil)
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("sizes: %v is not ErrInvalid", err)
			}
			return
		}
		if cpu < 1 || cpu > c.cfg.MaxCPUCount || mem < 128 || mem > c.cfg.MaxMemoryMB || disk < 0 || disk > c.cfg.MaxDiskSizeMB {
			t.Fatalf("sizes %d/%d/%d outside the server's bounds", cpu, mem, disk)
		}
	})
}
