package network

import (
	"errors"
	"strings"
	"testing"
)

func TestNormalizeRules(t *testing.T) {
	h := func(k, v string) map[string][]Rule {
		return map[string][]Rule{"api.example.com": {{Headers: map[string]string{k: v}}}}
	}
	for _, c := range []struct {
		rules map[string][]Rule
		want  string
	}{
		{map[string][]Rule{"*": {{}}}, `rules["*"]`},
		{map[string][]Rule{"a..b": {{}}}, `rules["a..b"]`},
		{h("Host", "x"), "frames or routes"},
		{h("Proxy-Authorization", "x"), "frames or routes"},
		{h("bad header", "x"), "not a valid header name"},
		{h("X", "a\r\nB: c"), "CR, LF"},
		{h("X", "${e2b.identity.tokens.aws}"), "identity tokens"},
		{h("X", "${e2b.nope}"), "not a placeholder"},
		{h("X", "${e2b.secrets.}"), "names no secret"},
		{map[string][]Rule{"api.example.com": {{Headers: map[string]string{"X-Key": "a", "x-key": "b"}}}}, "set twice"},
		{map[string][]Rule{"A.com": {{}}, "a.com": {{}}}, "listed twice"},
	} {
		_, err := NormalizeRules(c.rules)
		if !errors.Is(err, ErrRules) || !errors.Is(err, ErrInvalidPolicy) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v, want ErrRules naming %q", c.rules, err, c.want)
		}
	}
	got, err := NormalizeRules(map[string][]Rule{"API.Example.com.": {{Headers: map[string]string{"X": "${other} ${e2b.secrets.k}"}}}})
	if err != nil || got["api.example.com"] == nil {
		t.Fatalf("normalised %v, %v", got, err)
	}
}

func TestRulesForAndExpand(t *testing.T) {
	rules := map[string][]Rule{"*.example.com": {{Headers: map[string]string{"W": "1"}}}, "*.api.example.com": {{Headers: map[string]string{"D": "1"}}}, "x.api.example.com": {{Headers: map[string]string{"E": "1"}}}}
	for host, want := range map[string]string{"x.api.example.com": "E", "y.api.example.com": "D", "a.example.com": "W", "X.API.example.com.": "E"} {
		r, ok := RulesFor(rules, host)
		if _, has := r[0].Headers[want]; !ok || !has {
			t.Errorf("%s: %v", host, r)
		}
	}
	if _, ok := RulesFor(rules, "example.com"); ok {
		t.Error("a wildcard matched its apex")
	}
	v, err := ExpandSecrets("Bearer ${e2b.secrets.a}/${e2b.secrets.b} ${keep}", func(n string) (string, error) { return "<" + n + ">", nil })
	if err != nil || v != "Bearer <a>/<b> ${keep}" {
		t.Errorf("expanded %q %v", v, err)
	}
	if _, err := ExpandSecrets("${e2b.secrets.gone}", func(string) (string, error) { return "", errors.New("gone") }); err == nil {
		t.Error("a failed lookup expanded")
	}
}
