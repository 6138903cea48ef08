package api

import (
	"fmt"
	"math"
	"time"
)

// maxTimeoutSeconds is the largest timeout, in seconds, a time.Duration holds.
const maxTimeoutSeconds = int64(math.MaxInt64 / time.Second)

// timeoutDuration converts a request's timeout in seconds, or returns the
// message of the 400 that refuses it. Multiplying without a check wrapped:
// 18446744074 s became a 0.29 s sandbox. e2b refuses, not clamps, a timeout
// over the team's maximum (400 "Timeout cannot be greater than N hours"), and
// its timeout is an int32, so larger numbers fail to parse (a 400 too); so
// values past what a Duration holds are refused here, and control refuses,
// with a 400 naming it, anything over the server's --max-timeout.
func timeoutDuration(secs int64) (time.Duration, string) {
	if secs < 0 {
		return 0, fmt.Sprintf("timeout must be >= 0 seconds, got %d", secs)
	}
	if secs > maxTimeoutSeconds {
		return 0, fmt.Sprintf("timeout %d seconds exceeds the server's maximum", secs)
	}
	return time.Duration(secs) * time.Second, ""
}
