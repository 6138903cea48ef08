package main

import (
	"context"
	"errors"
	"log/slog"

	"github.com/cubicle-dev/cubicle/internal/builtinimage"
	"github.com/cubicle-dev/cubicle/internal/image"
	"github.com/cubicle-dev/cubicle/internal/node"
	"github.com/cubicle-dev/cubicle/internal/nodejoin"
)

// publishBuiltins starts serve --publish-builtins: the built-ins of
// --images-dir go to the image store in the background (never delaying
// start), and the returned lookup (control.Config.BuiltinImage) names
// each to pulling nodes by digest once it is there. nil without the flag.
// Refused without joins (no node could pull them) or an image store.
func publishBuiltins(ctx context.Context, o serveOptions, join *nodejoin.Service, images *image.Store, log *slog.Logger) (func(string) (node.Image, bool), error) {
	if !o.publishBuiltins {
		return nil, nil
	}
	if join == nil {
		return nil, errors.New("--publish-builtins: this server has no node registry (nodes join only over TLS: add --tls-cert/--tls-key or --tls-self-signed)")
	}
	if images == nil {
		return nil, errors.New("--publish-builtins: this server has no image store")
	}
	p := &builtinimage.Publisher{Store: images, Dir: o.imagesDir, Logger: log}
	go p.Run(ctx)
	return p.Lookup, nil
}
