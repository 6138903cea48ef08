package api

import (
	"strings"
	"testing"

	"github.com/cubicle-dev/cubicle/internal/template/catalog"
)

func TestDecodeStrictTemplateCreate(t *testing.T) {
	var req catalog.CreateRequest
	if msg := decodeStrict([]byte(`{"name":"a:v1","tags":["x"],"cpuCount":1,"memoryMB":512,"minFreeDiskMb":10}`), &req); msg != "" || req.Name != "a:v1" {
		t.Fatalf("the SDK's body: %q %+v", msg, req)
	}
	for body, want := range map[string]string{
		`{"name":"x","cpuCount":1,"memory":512}`: `unknown field "memory" in the template request`,
		`{"name":"x","dockerfile":"FROM x"}`:     `unknown field "dockerfile"`,
		`{"name":`:                               "malformed JSON body",
		`{"name":"x"} {}`:                        "data after the JSON object",
	} {
		var r catalog.CreateRequest
		if msg := decodeStrict([]byte(body), &r); !strings.Contains(msg, want) {
			t.Errorf("%s: %q, want %q", body, msg, want)
		}
	}
}
