//go:build linux

package network

import (
	"errors"
	"strings"
	"testing"
)

// FuzzParsePolicy: allowOut/denyOut entries are refused with
// ErrInvalidPolicy or become valid IPv4 prefixes (IPv4-mapped IPv6 is
// unmapped; other IPv6 has no effect), each inside the range it names.
func FuzzParsePolicy(f *testing.F) {
	for _, s := range []string{"1.2.3.4", "10.0.0.0/8", "169.254.169.254/32", "0.0.0.0/0", "::ffff:10.0.0.1", "::ffff:0.0.0.0/96",
		"::ffff:10.0.0.0/104", "fe80::1%eth0", "2001:db8::/32", "1.2.3.4/33", "example.com", "", "1.2.3.4/8"} {
		f.Add(s, "8.8.8.8")
	}
	f.Fuzz(func(t *testing.T, allow, deny string) {
		p := Policy{AllowInternet: true, AllowOut: strings.Split(allow, ","), DenyOut: strings.Split(deny, ",")}
		a, d, err := parsePolicy(p)
		if err != nil {
			if !errors.Is(err, ErrInvalidPolicy) {
				t.Fatalf("%v is not ErrInvalidPolicy", err)
			}
			return
		}
		for _, pr := range append(a, d...) {
			if !pr.IsValid() || !pr.Addr().Is4() || pr.Bits() < 0 || pr.Bits() > 32 || pr.Masked() != pr {
				t.Fatalf("prefix %v (valid %v, bits %d) from %q / %q", pr, pr.IsValid(), pr.Bits(), allow, deny)
			}
		}
	})
}
