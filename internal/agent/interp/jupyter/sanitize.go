package jupyter

import "encoding/json"

// sanitizeJSON makes content valid JSON when a kernel sent the non-standard
// tokens NaN, Infinity and -Infinity (Python's json module writes them, and
// jupyter_client falls back to doing so for a float it cannot encode). They
// become null, which every JSON client can read; valid input is returned as
// is.
func sanitizeJSON(b []byte) []byte {
	if json.Valid(b) {
		return b
	}
	out := make([]byte, 0, len(b))
	inString, escaped := false, false
	for i := 0; i < len(b); i++ {
		c := b[i]
		if inString {
			out = append(out, c)
			switch {
			case escaped:
				escaped = false
			case c == '\\':
				escaped = true
			case c == '"':
				inString = false
			}
			continue
		}
		if c == '"' {
			inString = true
			out = append(out, c)
			continue
		}
		if n := nonFiniteLen(b[i:]); n > 0 {
			out = append(out, "null"...)
			i += n - 1
			continue
		}
		out = append(out, c)
	}
	return out
}

func nonFiniteLen(b []byte) int {
	for _, tok := range []string{"NaN", "Infinity", "-Infinity"} {
		if len(b) >= len(tok) && string(b[:len(tok)]) == tok {
			return len(tok)
		}
	}
	return 0
}
