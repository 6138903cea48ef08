package network

import (
	"errors"
	"strings"
	"testing"
)

func TestDomainEntries(t *testing.T) {
	for in, want := range map[string]string{
		"PyPI.org": "pypi.org", "*.npmjs.org": "*.npmjs.org", "a.b.c.": "a.b.c", "x_y.example": "x_y.example", "localhost": "localhost",
	} {
		if got, err := ParseDomain(in); err != nil || got != want {
			t.Errorf("ParseDomain(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, bad := range []string{"*", "*.", "a.*.b", "**.a", "-a.com", "a-.com", "a..b", "a b", "ex!ample.com", "*.1.2.3.4", strings.Repeat("a", 64) + ".com", strings.Repeat("a.", 127) + "com", ""} {
		if _, err := ParseDomain(bad); !errors.Is(err, ErrDomainName) {
			t.Errorf("ParseDomain(%q) = %v, want ErrDomainName", bad, err)
		}
	}
	cases := []struct {
		pattern, host string
		match         bool
	}{
		{"pypi.org", "pypi.org", true},
		{"pypi.org", "PYPI.ORG.", true},
		{"pypi.org", "files.pypi.org", false},
		{"*.npmjs.org", "registry.npmjs.org", true},
		{"*.npmjs.org", "a.b.npmjs.org", true},
		{"*.npmjs.org", "npmjs.org", false}, // the apex is not a subdomain (e2b)
		{"*.npmjs.org", "evilnpmjs.org", false},
	}
	for _, c := range cases {
		if got := MatchDomain(c.pattern, c.host); got != c.match {
			t.Errorf("MatchDomain(%q, %q) = %v", c.pattern, c.host, got)
		}
	}
}

func TestValidatePolicyNamesTheEntry(t *testing.T) {
	err := ValidatePolicy(Policy{AllowOut: []string{"1.1.1.1", "pypi.org", "*.npmjs.org", "10.0.0.0/8"}, DenyOut: []string{"0.0.0.0/0", "bad domain"}})
	var pe *PolicyError
	if !errors.As(err, &pe) || pe.Field != "denyOut" || pe.Index != 1 || !errors.Is(err, ErrInvalidPolicy) || !errors.Is(err, ErrDomainName) {
		t.Fatalf("got %v", err)
	}
	if want := `denyOut[1]: "bad domain" is not an IP, CIDR or domain name`; !strings.HasPrefix(err.Error(), want) {
		t.Fatalf("message %q, want prefix %q", err, want)
	}
	long := make([]string, MaxPolicyEntries+1)
	for i := range long {
		long[i] = "1.1.1.1"
	}
	if err := ValidatePolicy(Policy{AllowOut: long}); !errors.Is(err, ErrInvalidPolicy) || !strings.Contains(err.Error(), "allowOut: at most") {
		t.Fatalf("over-long list: %v", err)
	}
	p := Policy{AllowOut: []string{"pypi.org", "1.1.1.1"}, DenyOut: []string{"*.evil.test"}}
	if a, d := p.Domains(); len(a) != 1 || len(d) != 1 || !p.HasDomains() {
		t.Fatalf("Domains() = %v %v", a, d)
	}
	if (Policy{AllowOut: []string{"1.1.1.1"}}).HasDomains() {
		t.Fatal("an IP-only policy has domains")
	}
}

func TestDomainEntriesAreRefusedUntilEnforced(t *testing.T) {
	if err := CheckEnforced(Policy{AllowOut: []string{"1.1.1.1", "10.0.0.0/8"}, DenyOut: []string{"0.0.0.0/0"}}); err != nil {
		t.Fatalf("IP-only policy refused: %v", err)
	}
	err := CheckEnforced(Policy{AllowOut: []string{"1.1.1.1"}, DenyOut: []string{"0.0.0.0/0", "*.evil.test"}})
	var pe *PolicyError
	if !errors.As(err, &pe) || pe.Field != "denyOut" || pe.Index != 1 || !errors.Is(err, ErrDomainNotEnforced) || !errors.Is(err, ErrInvalidPolicy) {
		t.Fatalf("got %v", err)
	}
	if want := `denyOut[1]: "*.evil.test" is a domain entry, and domain entries are not enforced yet`; !strings.HasPrefix(err.Error(), want) {
		t.Fatalf("message %q, want prefix %q", err, want)
	}
}
