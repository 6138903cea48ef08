//go:build crun

package oci

import (
	"testing"

	"github.com/cubicle-dev/cubicle/internal/runtime/runtimetest"
)

// crun is optional, and cannot run on hosts with hybrid cgroups (as CI's
// may be), so its tests build only with -tags crun: a plain go test run has
// no test that would skip there, and with the tag a missing crun or an
// unsupported host fails under CI=true like any other.
//
//	go test -tags crun -run Crun ./internal/runtime/oci/

func TestCrunSuite(t *testing.T) {
	env := newTestEnv(t, "crun")
	runtimetest.RunDriverSuite(t, env.d, env.layers)
}

func TestCrunUsernsSysSubmountsReadOnly(t *testing.T) {
	testUsernsSysSubmountsReadOnly(t, "crun")
}
