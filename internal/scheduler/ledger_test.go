package scheduler_test

import (
	"testing"

	"github.com/cubicle-dev/cubicle/internal/scheduler"
	"github.com/cubicle-dev/cubicle/internal/scheduler/ledgertest"
)

func TestMemLedger(t *testing.T) {
	ledgertest.Run(t, func(*testing.T) scheduler.Ledger { return scheduler.NewMemLedger() })
}
