package idlock_test

import (
	"context"
	"os"
	"testing"

	"github.com/cubicle-dev/cubicle/internal/idlock"
	"github.com/cubicle-dev/cubicle/internal/idlock/idlocktest"
	"github.com/cubicle-dev/cubicle/internal/store/postgres/pgtest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

func TestMapConformance(t *testing.T) {
	idlocktest.Run(t, func(t *testing.T) (idlock.Locker, idlock.Locker) {
		l := &idlock.Map{}
		return l, l
	})
}

// Two lockers on one database, as two replicas.
func TestPostgresConformance(t *testing.T) {
	idlocktest.Run(t, func(t *testing.T) (idlock.Locker, idlock.Locker) {
		dsn := pgtest.DSN(t)
		var ls [2]idlock.Locker
		for i := range ls {
			l, err := idlock.NewPostgres(context.Background(), dsn, "sandbox", 0)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(l.Close)
			ls[i] = l
		}
		return ls[0], ls[1]
	})
}
