package main

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"syscall"

	"golang.org/x/term"

	cubicle "github.com/cubicle-dev/cubicle/sdk/go"
)

// newClient is the SDK client every API command uses, configured from the
// environment (CUBICLE_*, E2B_*, CUBE_*).
func newClient() (*cubicle.Client, error) {
	c, err := cubicle.NewClient(cubicle.ConfigFromEnv())
	if errors.Is(err, cubicle.ErrMissingAPIKey) {
		return nil, errors.New("no API key: set CUBICLE_API_KEY (create one with `cubicle apikey create`)")
	}
	return c, err
}

// exitCodeError carries a command's exit code out of `sandbox exec`.
type exitCodeError struct{ code int }

func (e *exitCodeError) Error() string { return fmt.Sprintf("command exited with code %d", e.code) }

// hint says how to fix a failed command, or "".
func hint(err error) string {
	var oe *net.OpError
	switch {
	case errors.Is(err, syscall.ECONNREFUSED) || errors.As(err, &oe):
		url := cubicle.ConfigFromEnv().APIURL
		if url == "" {
			url = cubicle.DefaultAPIURL
		}
		return fmt.Sprintf("is `cubicle serve` running at %s? Start it, or point CUBICLE_API_URL at it", url)
	case errors.Is(err, cubicle.ErrUnauthorized):
		return "check CUBICLE_API_KEY; create a key with `cubicle apikey create --data-dir <serve's data dir>`"
	case errors.Is(err, cubicle.ErrSandboxNotFound):
		return "the sandbox is gone or never existed; `cubicle sandbox list` shows the live ones"
	case errors.Is(err, cubicle.ErrTemplateNotFound):
		return "`cubicle template list` shows the templates; build one with `cubicle template build`"
	case errors.Is(err, cubicle.ErrVolumeNotFound):
		return "`cubicle volume list` shows the volumes; create one with `cubicle volume create NAME`"
	case errors.Is(err, cubicle.ErrVolumeInUse):
		return "kill the sandboxes that mount it first (`cubicle volume get ID` lists them)"
	case errors.Is(err, cubicle.ErrSecretNotFound):
		return "`cubicle secret list` shows the team's secrets"
	case errors.Is(err, cubicle.ErrFileNotFound):
		return "check the path; `cubicle files ls SANDBOX:/dir` lists a directory"
	case errors.Is(err, cubicle.ErrRateLimited):
		return "no capacity right now; retry later, or free some (`cubicle sandbox list`, `cubicle gpu list`)"
	case errors.Is(err, cubicle.ErrServiceBusy):
		return "the server is overloaded; retry in a moment"
	}
	return ""
}

// isTerminal reports whether w is a terminal (progress bars only there).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// progressBar draws "label [#####.....] 45% 1.2 MiB/2.6 MiB" on one line.
type progressBar struct {
	w     io.Writer
	label string
	live  bool // redraw in place (a terminal)
}

func (p *progressBar) update(done, total int64) {
	if !p.live {
		return
	}
	fmt.Fprintf(p.w, "\r%s %s", p.label, bar(done, total))
}

func (p *progressBar) finish(done, total int64) {
	if p.live {
		fmt.Fprintf(p.w, "\r%s %s\n", p.label, bar(done, total))
	}
}

func bar(done, total int64) string {
	const width = 24
	if total <= 0 {
		return humanBytes(done)
	}
	n := int(done * width / total)
	return fmt.Sprintf("[%s%s] %3d%% %s/%s", strings.Repeat("#", n), strings.Repeat(".", width-n), done*100/total, humanBytes(done), humanBytes(total))
}

func humanBytes(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}

// countReader reports the bytes read so far through fn.
type countReader struct {
	r  io.Reader
	n  int64
	fn func(int64)
}

func (c *countReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	c.fn(c.n)
	return n, err
}
