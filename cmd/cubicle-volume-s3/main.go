// Command cubicle-volume-s3 is Cubicle's reference S3 volume plugin. One
// binary serves both plugin types:
//
//	cubicle-volume-s3 [--config FILE] --op create|destroy|attach|detach ...   binary plugin (one hook per run)
//	cubicle-volume-s3 serve [--socket PATH|host:port] [--config FILE]         rpc plugin (gRPC server)
//
// Configuration: FILE, else $CUBICLE_S3_CONFIG, else /etc/cubicle/s3-volume.json
// if present; CUBICLE_S3_* environment variables override it. See README.md.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/cubicle-dev/cubicle/internal/volume"
	"github.com/cubicle-dev/cubicle/internal/volume/pluginmain"
	"github.com/cubicle-dev/cubicle/internal/volume/rpc"
	"github.com/cubicle-dev/cubicle/internal/volume/s3"
)

// DefaultSocket is where `serve` listens unless told otherwise.
const DefaultSocket = "/run/cubicle-s3.sock"

func main() {
	os.Exit(run(os.Args[1:], os.Environ(), os.Stdout, os.Stderr))
}

func run(args, environ []string, stdout, stderr io.Writer) int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	// --config may precede --op: the binary driver appends the hook's flags
	// after whatever binary_path names, and env is the usual way anyway.
	config := ""
	for len(args) > 0 {
		if v, ok := strings.CutPrefix(args[0], "--config="); ok {
			config, args = v, args[1:]
			continue
		}
		if args[0] == "--config" && len(args) > 1 {
			config, args = args[1], args[2:]
			continue
		}
		break
	}
	if len(args) > 0 {
		switch args[0] {
		case "serve", "--serve":
			return serve(ctx, args[1:], config, environ, stderr)
		case "-h", "--help", "help":
			usage(stdout)
			return 0
		}
	}

	var p volume.Plugin
	cfg, err := s3.LoadConfig(config, environ)
	if err == nil {
		p, err = s3.New(cfg)
	}
	if err != nil {
		// Still answer in the protocol's shape, so the caller reports the
		// configuration problem rather than a protocol violation.
		p = failing{err}
	}
	return pluginmain.RunBinary(ctx, args, stdout, stderr, p)
}

func serve(ctx context.Context, args []string, config string, environ []string, stderr io.Writer) int {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	socket := fs.String("socket", DefaultSocket, "Unix socket path (or host:port) to serve gRPC on")
	fs.StringVar(&config, "config", config, "config file (default $CUBICLE_S3_CONFIG or "+s3.DefaultConfigPath+")")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "serve: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	cfg, err := s3.LoadConfig(config, environ)
	if err != nil {
		fmt.Fprintln(stderr, "cubicle-volume-s3:", err)
		return 1
	}
	p, err := s3.New(cfg)
	if err != nil {
		fmt.Fprintln(stderr, "cubicle-volume-s3:", err)
		return 1
	}
	fmt.Fprintf(stderr, "cubicle-volume-s3: serving bucket %s at %s on %s\n", cfg.Bucket, cfg.Endpoint, *socket)
	if err := rpc.Serve(ctx, *socket, p); err != nil {
		fmt.Fprintln(stderr, "cubicle-volume-s3:", err)
		return 1
	}
	return 0
}

func usage(w io.Writer) {
	fmt.Fprint(w, `cubicle-volume-s3: S3 volume plugin for Cubicle (s3fs-fuse mounts)

  cubicle-volume-s3 [--config FILE] --op create  --volume-id ID [--name NAME]
  cubicle-volume-s3 [--config FILE] --op destroy --volume-id ID
  cubicle-volume-s3 [--config FILE] --op attach  --sandbox-id S --namespace N --volume-id ID --ref-count N --volume-base-dir DIR [--private-data P]
  cubicle-volume-s3 [--config FILE] --op detach  --sandbox-id S --namespace N --volume-id ID --ref-count N [--metadata JSON]
  cubicle-volume-s3 serve [--socket `+DefaultSocket+`] [--config FILE]

Config: FILE, else $CUBICLE_S3_CONFIG, else `+s3.DefaultConfigPath+` (JSON);
CUBICLE_S3_ENDPOINT, _BUCKET, _ACCESS_KEY, _SECRET_KEY, _REGION, _PREFIX, ... override it.
`)
}

// failing answers every hook with the configuration error.
type failing struct{ err error }

func (f failing) Create(context.Context, volume.CreateRequest) (volume.CreateResult, error) {
	return volume.CreateResult{}, f.err
}
func (f failing) Destroy(context.Context, volume.DestroyRequest) error { return f.err }
func (f failing) Attach(context.Context, volume.AttachRequest) (volume.AttachResult, error) {
	return volume.AttachResult{}, f.err
}
func (f failing) Detach(context.Context, volume.DetachRequest) error { return f.err }
