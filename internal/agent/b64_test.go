package agent

import (
	"encoding/base64"
	"strconv"
	"testing"
)

func b64(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }

func itoa(i int) string { return strconv.Itoa(i) }

func atoiT(t *testing.T, s string) int {
	t.Helper()
	i, err := strconv.Atoi(s)
	if err != nil {
		t.Fatal(err)
	}
	return i
}

func b64raw(b []byte) string { return base64.RawStdEncoding.EncodeToString(b) }
