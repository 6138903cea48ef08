package main

import (
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
	"golang.org/x/sys/unix"
)

func defaultConnOptions(t *testing.T) connOptions {
	t.Helper()
	var o connOptions
	o.flags(pflag.NewFlagSet("serve", pflag.ContinueOnError)) // the defaults as serve sees them
	return o
}

// The defaults share the descriptor limit so that a reserve is left for
// the API, the store and the create path.
func TestConnBudgetDefaultsLeaveAReserve(t *testing.T) {
	o := defaultConnOptions(t)
	b, err := o.budget()
	if err != nil {
		t.Fatal(err)
	}
	var lim unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	if lim.Cur != lim.Max || b.nofile != lim.Cur {
		t.Fatalf("soft limit %d, hard %d, budget from %d: want the soft limit raised to the hard one", lim.Cur, lim.Max, b.nofile)
	}
	used := uint64(b.maxConns + b.proxyMaxConns + b.idleConns)
	if b.maxConns <= 0 || b.proxyMaxConns <= 0 || used > b.nofile*9/10 {
		t.Fatalf("budget %+v leaves no reserve of %d descriptors", b, b.nofile)
	}
	l := o.proxyLimits(b)
	if l.PerSandbox <= 0 || l.PerClient <= 0 || l.Total != b.proxyMaxConns || l.ResponseStart <= 0 {
		t.Fatalf("proxy limits %+v", l)
	}
}

func TestConnBudgetRefusesBadFlags(t *testing.T) {
	for name, tc := range map[string]struct {
		set  func(*connOptions)
		want string
	}{
		"negative cap":       {func(o *connOptions) { o.proxyPerClient = -1 }, "--proxy-max-conns-per-client must not be negative"},
		"negative timeout":   {func(o *connOptions) { o.responseStart = -time.Second }, "--proxy-response-start-timeout must not be negative"},
		"no header timeout":  {func(o *connOptions) { o.readHeaderTimeout = 0 }, "--read-header-timeout and --idle-timeout must be positive"},
		"no idle timeout":    {func(o *connOptions) { o.idle = 0 }, "--read-header-timeout and --idle-timeout must be positive"},
		"over the fd budget": {func(o *connOptions) { o.maxConns = 1 << 30 }, "more than 90% of the descriptor limit"},
	} {
		t.Run(name, func(t *testing.T) {
			o := defaultConnOptions(t)
			tc.set(&o)
			if _, err := o.budget(); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v, want %q", err, tc.want)
			}
		})
	}
}
