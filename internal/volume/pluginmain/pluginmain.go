// Package pluginmain turns a volume.Plugin into a binary-type plugin
// executable: main calls RunBinary with os.Args[1:] and exits with its
// result. It implements the plugin side of the CLI that
// internal/volume/binary drives:
//
//	--op create  --volume-id X --name Y
//	--op destroy --volume-id X
//	--op attach  --sandbox-id S --namespace N --volume-id X --ref-count N --volume-base-dir D [--private-data P]
//	--op detach  --sandbox-id S --namespace N --volume-id X --ref-count N [--metadata '{"k":"v"}']
//
// and prints exactly one JSON object on stdout.
package pluginmain

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"strconv"

	"github.com/cubicle-dev/cubicle/internal/volume"
)

// Exit statuses.
const (
	ExitOK    = 0
	ExitHook  = 1 // the hook returned an error ("error" is set)
	ExitUsage = 2 // bad command line
)

type createOut struct {
	Token       string `json:"token"`
	PrivateData string `json:"private_data"`
	Error       string `json:"error"`
}

type attachOut struct {
	HostPath string            `json:"host_path"`
	Metadata map[string]string `json:"metadata"`
	Error    string            `json:"error"`
}

type errorOut struct {
	Error string `json:"error"`
}

// required flags per op (namespace, name and the optional ones are not).
var required = map[string][]string{
	"create":  {"volume-id"},
	"destroy": {"volume-id"},
	"attach":  {"sandbox-id", "volume-id", "ref-count", "volume-base-dir"},
	"detach":  {"sandbox-id", "volume-id", "ref-count"},
}

// RunBinary parses args (without the program name), runs the hook and writes
// its JSON answer to stdout and diagnostics to stderr. It returns the exit
// status: ExitOK, ExitHook or ExitUsage.
func RunBinary(ctx context.Context, args []string, stdout, stderr io.Writer, p volume.Plugin) int {
	fs := flag.NewFlagSet("volume-plugin", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		op        = fs.String("op", "", "hook: create, destroy, attach or detach")
		volumeID  = fs.String("volume-id", "", "volume id")
		name      = fs.String("name", "", "volume display name (create)")
		sandboxID = fs.String("sandbox-id", "", "sandbox id (attach, detach)")
		namespace = fs.String("namespace", "", "sandbox namespace (attach, detach)")
		refCount  = fs.String("ref-count", "", "holders on this node before attach / after detach")
		baseDir   = fs.String("volume-base-dir", "", "directory host_path must be inside (attach)")
		private   = fs.String("private-data", "", "what create returned as private_data (attach)")
		metadata  = fs.String("metadata", "", "JSON object attach returned as metadata (detach)")
	)
	emit := func(v any) {
		// Encoding these structs cannot fail; the write error, if any, is the
		// caller's problem and would be seen as a protocol error.
		_ = json.NewEncoder(stdout).Encode(v)
	}
	usage := func(format string, a ...any) int {
		msg := fmt.Sprintf(format, a...)
		fmt.Fprintln(stderr, "usage error:", msg)
		emit(errorOut{Error: msg})
		return ExitUsage
	}
	if err := fs.Parse(args); err != nil {
		return usage("%v", err)
	}
	if fs.NArg() > 0 {
		return usage("unexpected argument %q", fs.Arg(0))
	}
	req, ok := required[*op]
	if !ok {
		return usage("unknown --op %q (want create, destroy, attach or detach)", *op)
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	for _, f := range req {
		if !set[f] {
			return usage("--op %s needs --%s", *op, f)
		}
	}
	var rc int64
	if set["ref-count"] {
		n, err := strconv.ParseInt(*refCount, 10, 64)
		if err != nil || n < 0 {
			return usage("--ref-count %q is not a non-negative integer", *refCount)
		}
		rc = n
	}
	md := map[string]string{}
	if *metadata != "" {
		if err := json.Unmarshal([]byte(*metadata), &md); err != nil {
			return usage("--metadata is not a JSON object of strings: %v", err)
		}
		if md == nil { // "null"
			md = map[string]string{}
		}
	}
	hookErr := func(err error) int {
		fmt.Fprintf(stderr, "%s: %v\n", *op, err)
		return ExitHook
	}
	switch *op {
	case "create":
		res, err := p.Create(ctx, volume.CreateRequest{VolumeID: *volumeID, Name: *name})
		if err != nil {
			emit(createOut{Error: err.Error()})
			return hookErr(err)
		}
		emit(createOut{Token: res.Token, PrivateData: res.PrivateData})
	case "destroy":
		if err := p.Destroy(ctx, volume.DestroyRequest{VolumeID: *volumeID}); err != nil {
			emit(errorOut{Error: err.Error()})
			return hookErr(err)
		}
		emit(errorOut{})
	case "attach":
		res, err := p.Attach(ctx, volume.AttachRequest{
			SandboxID: *sandboxID, Namespace: *namespace, VolumeID: *volumeID,
			RefCount: rc, VolumeBaseDir: *baseDir, PrivateData: *private,
		})
		if err != nil {
			emit(attachOut{Metadata: map[string]string{}, Error: err.Error()})
			return hookErr(err)
		}
		if res.Metadata == nil {
			res.Metadata = map[string]string{}
		}
		emit(attachOut{HostPath: res.HostPath, Metadata: res.Metadata})
	case "detach":
		err := p.Detach(ctx, volume.DetachRequest{
			SandboxID: *sandboxID, Namespace: *namespace, VolumeID: *volumeID,
			RefCount: rc, Metadata: md,
		})
		if err != nil {
			emit(errorOut{Error: err.Error()})
			return hookErr(err)
		}
		emit(errorOut{})
	}
	return ExitOK
}
