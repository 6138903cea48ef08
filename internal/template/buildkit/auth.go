package buildkit

import (
	"context"

	"github.com/moby/buildkit/session"
	"github.com/moby/buildkit/session/auth"
	"google.golang.org/grpc"
)

// Credentials are a registry's HTTP Basic credentials.
type Credentials struct {
	Username, Password string
}

// registryAuth hands BuildKit the credentials of the registries it pulls
// from and pushes to, through the build's session: they stay in this
// process and BuildKit's resolver, never in a build step's environment.
type registryAuth struct {
	auth.UnimplementedAuthServer
	creds map[string]Credentials // by host:port
}

var _ session.Attachable = (*registryAuth)(nil)

func (a *registryAuth) Register(s *grpc.Server) { auth.RegisterAuthServer(s, a) }

// Credentials answers BuildKit's question for a host; an unknown host gets
// none (anonymous access).
func (a *registryAuth) Credentials(_ context.Context, req *auth.CredentialsRequest) (*auth.CredentialsResponse, error) {
	c, ok := a.creds[req.Host]
	if !ok {
		return &auth.CredentialsResponse{}, nil
	}
	return &auth.CredentialsResponse{Username: c.Username, Secret: c.Password}, nil
}
