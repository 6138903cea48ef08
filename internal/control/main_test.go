package control

import (
	"os"
	"testing"

	"github.com/cubicle-dev/cubicle/internal/store/postgres/pgtest"
)

// PostgreSQL starts only for the tests that ask for it (pgtest.DSN).
func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }
