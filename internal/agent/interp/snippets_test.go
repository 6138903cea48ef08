package interp

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

func TestEnvDiffSetsChangedAndUnsetsRemoved(t *testing.T) {
	got := envDiff(map[string]string{"A": "1", "B": "2", "C": "3"}, map[string]string{"A": "1", "B": "two", "D": "4"})
	var parts []string
	for _, c := range got {
		v := "<unset>"
		if c.Value != nil {
			v = *c.Value
		}
		parts = append(parts, c.Name+"="+v)
	}
	if s := strings.Join(parts, " "); s != "B=two C=<unset> D=4" {
		t.Fatalf("diff = %s", s)
	}
}

func TestRestoreGoesBackToBaseOrUnsets(t *testing.T) {
	got := restoreEnvChanges(map[string]string{"HOME": "/x", "NEW": "y"}, map[string]string{"HOME": "/root"})
	if len(got) != 2 || got[0].Name != "HOME" || *got[0].Value != "/root" || got[1].Name != "NEW" || got[1].Value != nil {
		t.Fatalf("restore = %+v", got)
	}
}

func TestBashSnippetQuotesValues(t *testing.T) {
	v := "it's $(rm -rf /) `x` \\"
	got := envSnippet("bash", []envChange{{Name: "A", Value: &v}, {Name: "B"}, {Name: "not-a-name", Value: &v}})
	want := "export A='it'\\''s $(rm -rf /) `x` \\'\nunset B"
	if got != want {
		t.Fatalf("snippet:\n%s\nwant:\n%s", got, want)
	}
}

func TestPythonSnippetEncodesValuesAsData(t *testing.T) {
	v := "\"); import os; os.system('x') #\n"
	got := envSnippet("python", []envChange{{Name: "A", Value: &v}})
	// The only string literal is the JSON text, itself JSON-quoted.
	i := strings.Index(got, "loads(")
	lit := strings.TrimSuffix(got[i+len("loads("):], "))")
	var text string
	if err := json.Unmarshal([]byte(lit), &text); err != nil {
		t.Fatalf("literal %s: %v", lit, err)
	}
	var pairs [][2]*string
	if err := json.Unmarshal([]byte(text), &pairs); err != nil || len(pairs) != 1 || *pairs[0][1] != v {
		t.Fatalf("payload %s: %v", text, err)
	}
	if envSnippet("python", nil) != "" || envSnippet("cobol", []envChange{{Name: "A"}}) != "" {
		t.Fatal("no changes or no support must give no code")
	}
}

func TestResultMapsMimeTypes(t *testing.T) {
	r := newResult(true, map[string]json.RawMessage{
		"text/plain":       json.RawMessage(`"'quoted'"`),
		"image/png":        json.RawMessage(`"iVBOR"`),
		"e2b/chart":        json.RawMessage(`{"type":"line"}`),
		"text/x-odd":       json.RawMessage(`"odd"`),
		"text/html":        json.RawMessage(`"<b>"`),
		"e2b/data":         json.RawMessage(`{"a":[1]}`),
		"application/json": json.RawMessage(`{"k":1}`),
	})
	b, _ := json.Marshal(r)
	want := `{"type":"result","is_main_result":true,"text":"quoted","html":"\u003cb\u003e","png":"iVBOR","json":{"k":1},"data":{"a":[1]},"chart":{"type":"line"},"extra":{"text/x-odd":"odd"}}`
	if string(b) != want {
		t.Fatalf("result:\n%s\nwant:\n%s", b, want)
	}
	if unquote(`'`) != `'` || unquote(`"a"`) != "a" || unquote(`'a"`) != `'a"` {
		t.Fatal("unquote")
	}
}

func TestErrorStripsANSI(t *testing.T) {
	e := newError("E", "\x1b[31mbad\x1b[0m", []string{"\x1b[0;31mline1\x1b[0m", "line2"})
	if e.Value != "bad" || e.Traceback != "line1\nline2" {
		t.Fatalf("error = %+v", e)
	}
}

func TestTimestampKeepsRFC3339AndReplacesTheRest(t *testing.T) {
	if got := timestamp("2026-12-06T01:27:07.799123+00:00"); got != "2026-12-06T01:27:07.799123+00:00" {
		t.Fatalf("ipykernel's date changed: %q", got)
	}
	got := timestamp("2026-12-06T01:38+0000") // jjava's
	if _, err := time.Parse(time.RFC3339Nano, got); err != nil {
		t.Fatalf("jjava's date became %q, not RFC 3339", got)
	}
}
