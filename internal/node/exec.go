package node

import (
	"context"
	"encoding/base64"

	"connectrpc.com/connect"

	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/sdk/go/envd/process"
	"github.com/cubicle-dev/cubicle/sdk/go/envd/process/processconnect"
)

// ErrNoExit means the command's stream ended without an exit status.
var ErrNoExit = errdefs.NewReason(errdefs.ErrUnknown, "node_no_exit_status", "node: command ended without an exit status")

// Run executes `bash -l -c cmd` in the sandbox as user through its agent
// and returns the exit code (used for template ready commands).
func (l *Local) Run(ctx context.Context, id, token, user, cmd string) (int, error) {
	ep, err := l.cfg.Network.Get(ctx, id)
	if err != nil {
		return -1, l.notFound(err)
	}
	pc := processconnect.NewProcessClient(l.client, agentURL(id, ep.Addr, ""), connect.WithProtoJSON())
	req := connect.NewRequest(&process.StartRequest{Process: &process.ProcessConfig{Cmd: "/bin/bash", Args: []string{"-l", "-c", cmd}}})
	req.Header().Set("X-Access-Token", token)
	if user != "" {
		req.Header().Set("Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte(user+":")))
	}
	stream, err := pc.Start(ctx, req)
	if err != nil {
		return -1, err
	}
	defer stream.Close()
	code := -1
	for stream.Receive() {
		if e := stream.Msg().GetEvent().GetEnd(); e != nil {
			code = int(e.GetExitCode())
		}
	}
	if err := stream.Err(); err != nil {
		return -1, err
	}
	if code < 0 {
		return -1, ErrNoExit
	}
	return code, nil
}
