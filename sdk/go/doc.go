// Package cubicle is the Go client for Cubicle, the self-hosted,
// e2b-compatible sandbox platform. It speaks the same wire protocol as the
// official e2b SDKs (the REST control plane and envd's Connect-RPC), so it
// also works against any e2b-compatible server.
//
// A Client is made from a Config, usually ConfigFromEnv, which reads the
// CUBICLE_* variables and falls back to E2B_* and CubeSandbox's CUBE_* ones:
//
//	c, err := cubicle.NewClient(cubicle.ConfigFromEnv())
//	sb, err := c.Create(ctx, cubicle.CreateOptions{Template: "base"})
//	defer sb.Kill(ctx)
//	res, err := sb.Commands().Run(ctx, "echo hello")
//
// Every call takes a context; cancelling it stops the request (and, for
// streams, the stream). Errors are *APIError values (or wrap one) and are
// tested with errors.Is against the Err* sentinels, never by text.
// Requests that get 429 or 503 are retried with backoff, honouring
// Retry-After.
package cubicle
