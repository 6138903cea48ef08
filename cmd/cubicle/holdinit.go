package main

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"time"
)

// holdInitEnv names a directory: when set, every create stops after the
// sandbox's process started and before the control plane's first /init,
// writes <dir>/<id> (the sandbox's address) and waits for <dir>/<id>.release.
// It exists for tests that probe an agent nobody has initialised
// (test/integration TestAgentRefusesBeforeInit); never set it in production.
const holdInitEnv = "CUBICLE_TEST_HOLD_INIT"

func holdInitFromEnv() func(ctx context.Context, id string, addr netip.Addr) error {
	dir := os.Getenv(holdInitEnv)
	if dir == "" {
		return nil
	}
	return func(ctx context.Context, id string, addr netip.Addr) error {
		if err := os.WriteFile(filepath.Join(dir, id), []byte(addr.String()), 0o600); err != nil {
			return fmt.Errorf("%s: %w", holdInitEnv, err)
		}
		release := filepath.Join(dir, id+".release")
		t := time.NewTicker(20 * time.Millisecond)
		defer t.Stop()
		for {
			if _, err := os.Stat(release); err == nil {
				return nil
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-t.C:
			}
		}
	}
}
