package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"path/filepath"
	"strings"
	"time"

	"github.com/cubicle-dev/cubicle/internal/network"
	"github.com/cubicle-dev/cubicle/internal/template/buildkit"
	"github.com/cubicle-dev/cubicle/internal/template/clusterbuild"
)

// startNodeBuilder runs buildkitd on a node labelled builder=true, as serve
// runs its own (rootless in its user namespace, in a netns on this node's
// bridge judged by the sandbox egress rules), under <data-dir>/buildkit.
// Its registry relay answers at clusterbuild.RegistryHost inside that
// netns and forwards to the control plane's registry over TLS with this
// node's certificate (tlsConf: cluster server name, node.crt), where only
// a builder node with a build's credentials may push. It returns how the
// data plane's builder target reaches buildkitd's socket.
func startNodeBuilder(ctx context.Context, o *nodeRunOptions, netm *network.Linux, controlPlane string, tlsConf *tls.Config, log *slog.Logger) (func(context.Context) (net.Conn, error), func(), error) {
	u, err := url.Parse(controlPlane)
	if err != nil || u.Scheme != "https" || u.Host == "" {
		return nil, nil, fmt.Errorf("control plane URL %q: want https://host[:port]", controlPlane)
	}
	cpAddr := u.Host
	if u.Port() == "" {
		cpAddr = net.JoinHostPort(u.Hostname(), "443")
	}
	bin, nsPath, teardown, err := startBuilderNetns(ctx, netm, o.buildkitd, o.bridge, "make build produces bin/buildkitd; --buildkitd off builds nothing here", log)
	if err != nil {
		return nil, nil, err
	}
	conf := tlsConf.Clone()
	conf.NextProtos = nil // buildkitd speaks HTTP/1.1 to the relay
	upstream := func(ctx context.Context, registry string) (net.Conn, error) {
		if registry != clusterbuild.RegistryHost {
			return nil, fmt.Errorf("no upstream for registry %s", registry)
		}
		d := tls.Dialer{NetDialer: &net.Dialer{Timeout: 10 * time.Second}, Config: conf}
		return d.DialContext(ctx, "tcp", cpAddr)
	}
	d, err := buildkit.Start(ctx, buildkit.Config{Binary: bin, Root: filepath.Join(o.dataDir, "buildkit"),
		InsecureRegistries: []string{clusterbuild.RegistryHost}, Upstream: upstream, NetNS: nsPath, Logger: log})
	if err != nil {
		teardown()
		return nil, nil, err
	}
	sock := strings.TrimPrefix(d.Address(), "unix://")
	log.Info("template builder running", "buildkitd", bin, "registry", clusterbuild.RegistryHost, "control_plane", cpAddr)
	dial := func(ctx context.Context) (net.Conn, error) {
		var nd net.Dialer
		return nd.DialContext(ctx, "unix", sock)
	}
	return dial, func() { d.Close(); teardown() }, nil
}
