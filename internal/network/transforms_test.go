package network

import (
	"errors"
	"fmt"
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
		{map[string][]Rule{"198.51.100.7": {{Plain: true}, {}}}, "plain HTTP only"},
		{manyPorts(MaxRulePorts + 1), "at most 16 ports"},
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

// manyPorts spreads n rule ports over hosts (a host holds at most
// MaxRulesPerHost rules).
func manyPorts(n int) map[string][]Rule {
	out := map[string][]Rule{}
	for i := range n {
		h := fmt.Sprintf("h%d.com", i/MaxRulesPerHost)
		out[h] = append(out[h], Rule{Plain: true, Port: uint16(9000 + i)})
	}
	return out
}

// A rule's port: 0 is its scheme's; the others are what the node redirects.
func TestRulePorts(t *testing.T) {
	p := Policy{Rules: map[string][]Rule{
		"a.com":        {{}, {Plain: true}, {Port: 8443}, {Plain: true, Port: 18080}, {Port: 443}, {Plain: true, Port: 80}},
		"198.51.100.7": {{Plain: true, Port: 18080}},
	}}
	if got := p.RulePorts(); len(got) != 2 || got[0] != 8443 || got[1] != 18080 {
		t.Fatalf("RulePorts %v", got)
	}
	for port, want := range map[uint16]bool{80: true, 443: true, 8443: true, 18080: true, 22: false} {
		if p.Intercepts(port) != want {
			t.Errorf("Intercepts(%d) = %v", port, !want)
		}
	}
	list := p.Rules["a.com"]
	if n := len(ForPort(list, false, 443)); n != 2 {
		t.Errorf("HTTPS rules on 443: %d", n)
	}
	if n := len(ForPort(list, true, 80)); n != 2 {
		t.Errorf("plain rules on 80: %d", n)
	}
	if n := len(ForPort(list, true, 18080)); n != 1 {
		t.Errorf("plain rules on 18080: %d", n)
	}
	if n := len(ForPort(list, false, 18080)); n != 0 {
		t.Errorf("HTTPS rules on a plain rule's port: %d", n)
	}
	if got, err := NormalizeRules(map[string][]Rule{"198.51.100.7": {{Plain: true, Port: 18080}}}); err != nil || got["198.51.100.7"] == nil {
		t.Fatalf("IP key for plain HTTP: %v %v", got, err)
	}
	if _, err := NormalizeRules(manyPorts(MaxRulePorts)); err != nil {
		t.Fatalf("%d ports: %v", MaxRulePorts, err)
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
