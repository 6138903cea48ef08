package dataplane

import (
	"fmt"
	"strconv"
	"time"

	"github.com/spf13/pflag"
)

// RegisterFlags adds the data-plane server's limits to a node's flags
// (`cubicle node run`), with the defaults filled into c. A value below 1
// is refused when the flags are parsed.
func (c *ServerConfig) RegisterFlags(fs *pflag.FlagSet) {
	c.MaxTunnels, c.HandshakeTimeout, c.DialTimeout = DefaultMaxTunnels, DefaultHandshakeTimeout, DefaultDialTimeout
	fs.Var((*positiveInt)(&c.MaxTunnels), "data-max-tunnels",
		"most data-plane tunnels open at once (one per pooled proxy connection to a sandbox); one more is answered 503")
	fs.Var((*positiveDuration)(&c.HandshakeTimeout), "data-handshake-timeout",
		"deadline for a data-plane connection's TLS handshake and tunnel request")
	fs.Var((*positiveDuration)(&c.DialTimeout), "data-dial-timeout",
		"deadline for the data plane's dial to a sandbox's port")
}

type positiveInt int

func (p *positiveInt) String() string { return strconv.Itoa(int(*p)) }
func (p *positiveInt) Type() string   { return "int" }
func (p *positiveInt) Set(s string) error {
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 {
		return fmt.Errorf("%q is not a whole number of at least 1", s)
	}
	*p = positiveInt(n)
	return nil
}

type positiveDuration time.Duration

func (p *positiveDuration) String() string { return time.Duration(*p).String() }
func (p *positiveDuration) Type() string   { return "duration" }
func (p *positiveDuration) Set(s string) error {
	d, err := time.ParseDuration(s)
	if err != nil || d <= 0 {
		return fmt.Errorf("%q is not a positive duration", s)
	}
	*p = positiveDuration(d)
	return nil
}
