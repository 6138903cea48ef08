package integration

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/store/postgres/pgtest"
)

// Two embedded `cubicle serve` on one PostgreSQL with the same --node-id
// (the default, local) would both drive node local: the second is refused
// at start, before it touches the host, naming the ID and the way out.
// The holder's claim ends with its process: restarted after SIGKILL it
// starts again, and once it is stopped the other starts.
func TestEmbeddedNodeIDOncePerDatabase(t *testing.T) {
	ctx := context.Background()
	dsn, err := pgtest.StartT(t).NewDatabase(ctx)
	if err != nil {
		t.Fatal(err)
	}
	a := startServer(t, "--store", dsn)
	b := newServer(t, nil, "--store", dsn)
	refused := func() {
		t.Helper()
		var out bytes.Buffer
		cmd := exec.Command(filepath.Join(binDir, "cubicle"), b.args...)
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		exited := make(chan error, 1)
		go func() { exited <- cmd.Wait() }()
		var err error
		for i := 0; ; i++ {
			select {
			case err = <-exited:
			case <-time.After(250 * time.Millisecond):
				// Started after all (the old behaviour): stop it cleanly, so
				// that it leaves nothing on the host, and fail.
				if resp, herr := http.Get(b.URL + "/health"); (herr == nil && resp.StatusCode/100 == 2) || i == 240 {
					if herr == nil {
						resp.Body.Close()
					}
					cmd.Process.Signal(syscall.SIGTERM)
					<-exited
					t.Fatalf("a second embedded serve with node ID local started; output:\n%s", out.String())
				} else if herr == nil {
					resp.Body.Close()
				}
				continue
			}
			break
		}
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() == 0 {
			t.Fatalf("second embedded serve with node ID local: %v, want it to exit with an error; output:\n%s", err, out.String())
		}
		for _, want := range []string{"--node-id local", "another embedded `cubicle serve` on this database", "--embedded-node=false"} {
			if !strings.Contains(out.String(), want) {
				t.Fatalf("second serve's error lacks %q:\n%s", want, out.String())
			}
		}
	}
	refused()

	a.stop(syscall.SIGKILL)
	a.start() // its claim went with the killed process
	refused()

	a.stop(syscall.SIGTERM)
	b.start()
}
