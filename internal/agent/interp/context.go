package interp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/cubicle-dev/cubicle/internal/agent/interp/jupyter"
)

// Context is a code context as the API shows it.
type Context struct {
	ID       string `json:"id"`
	Language string `json:"language"`
	Cwd      string `json:"cwd"`
}

// codeContext is a context and its kernel. The kernel is replaced, under
// the same id, when it died (at the next execution) or on restart.
type codeContext struct {
	Context
	spec    *KernelSpec
	created time.Time
	// turn is held by the one execution running; a channel rather than a
	// mutex because blocked senders are served in arrival order (e2b's
	// asyncio.Lock is FIFO too) and a waiter can give up when its client
	// leaves.
	turn chan struct{}

	mu      sync.Mutex // guards k and removed; held while a kernel starts
	k       *kernel
	removed bool
}

// Server is the code interpreter: its contexts and their kernels.
type Server struct {
	host Host
	cfg  Config
	cat  *Catalog
	log  *slog.Logger

	mu       sync.Mutex
	contexts map[string]*codeContext
	defaults map[string]string // language -> id of its default context
	creating int               // contexts whose kernel is starting
	// defTurn serializes the creation of each language's default context,
	// so a request that comes while it starts waits for that kernel rather
	// than starting another; a channel so that a waiter whose client left
	// gives up.
	defTurn map[string]chan struct{}
	closed  bool
	// defReady is closed once the python default context has a kernel (see
	// Ready); warmErr is why Warm failed, until then.
	defReady  chan struct{}
	readyOnce sync.Once
	warmErr   error
}

// New returns a Server running the kernels of cat (from Discover).
func New(host Host, cat *Catalog, cfg Config) *Server {
	cfg = cfg.withDefaults()
	return &Server{
		host:     host,
		cfg:      cfg,
		cat:      cat,
		log:      cfg.Logger,
		contexts: map[string]*codeContext{},
		defaults: map[string]string{},
		defTurn:  map[string]chan struct{}{},
		defReady: make(chan struct{}),
	}
}

// Warm starts the python default context, so the first execution does not
// wait for a kernel to start (warm pools count on it). Executions on it
// that come meanwhile wait for that kernel.
func (s *Server) Warm(ctx context.Context) error {
	_, err := s.defaultContext(ctx, "python")
	s.mu.Lock()
	s.warmErr = err
	s.mu.Unlock()
	// e2b's server starts with a python and a javascript context, and
	// clients list both. The javascript one is listed from now on, but its
	// kernel starts at its first execution: a sandbox that never runs
	// JavaScript never pays for it.
	s.declareDefault(ctx, "javascript")
	return err
}

// declareDefault registers language's default context without a kernel
// (kernelFor starts one on first use); nothing when the sandbox has no
// kernel for it or the context exists.
func (s *Server) declareDefault(ctx context.Context, language string) {
	lang, spec, err := s.resolveLanguage(language)
	if err != nil {
		return
	}
	release, err := s.defaultTurn(ctx, lang)
	if err != nil {
		return
	}
	defer release()
	cwd := filepath.Clean(s.defaultCwd())
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed || s.contexts[s.defaults[lang]] != nil || len(s.contexts)+s.creating >= s.cfg.MaxContexts {
		return
	}
	c := &codeContext{
		Context: Context{ID: jupyter.NewID(), Language: lang, Cwd: cwd},
		spec:    spec,
		created: time.Now(),
		turn:    make(chan struct{}, 1),
	}
	s.contexts[c.ID] = c
	s.defaults[lang] = c.ID
}

// Ready is closed once the python default context has had a kernel ready,
// the moment from which e2b's server serves (GET /health).
func (s *Server) Ready() <-chan struct{} { return s.defReady }

// Close stops every kernel; the Server serves no more executions.
func (s *Server) Close() {
	s.mu.Lock()
	s.closed = true
	all := slices.Collect(maps.Values(s.contexts))
	s.contexts = map[string]*codeContext{}
	s.defaults = map[string]string{}
	s.mu.Unlock()
	var wg sync.WaitGroup
	for _, c := range all {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.remove()
		}()
	}
	wg.Wait()
}

// resolveLanguage returns the kernel of a request's language.
func (s *Server) resolveLanguage(language string) (string, *KernelSpec, error) {
	lang := NormalizeLanguage(language)
	spec, ok := s.cat.Spec(lang)
	if !ok {
		return lang, nil, fmt.Errorf("%w %s: this sandbox has kernels for %s", ErrUnknownLanguage, lang, strings.Join(s.cat.Languages(), ", "))
	}
	return lang, spec, nil
}

// CreateContext starts a kernel for language in cwd (relative to
// DefaultCwd; "" is DefaultCwd, see defaultCwd).
func (s *Server) CreateContext(ctx context.Context, language, cwd string) (Context, error) {
	lang, spec, err := s.resolveLanguage(language)
	if err != nil {
		return Context{}, err
	}
	if cwd == "" {
		cwd = s.defaultCwd()
	} else if !filepath.IsAbs(cwd) {
		cwd = filepath.Join(s.cfg.DefaultCwd, cwd)
	}
	cwd = filepath.Clean(cwd)
	if !isDir(cwd) {
		return Context{}, fmt.Errorf("%w: %s", ErrInvalidCwd, cwd)
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return Context{}, ErrContextRemoved
	}
	if len(s.contexts)+s.creating >= s.cfg.MaxContexts {
		s.mu.Unlock()
		return Context{}, fmt.Errorf("%w: at most %d can be live; delete one with DELETE /contexts/{id}", ErrTooManyContexts, s.cfg.MaxContexts)
	}
	s.creating++
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.creating--
		s.mu.Unlock()
	}()

	k, err := s.startKernel(ctx, spec, cwd)
	if err != nil {
		return Context{}, err
	}
	c := &codeContext{
		Context: Context{ID: jupyter.NewID(), Language: lang, Cwd: cwd},
		spec:    spec,
		created: time.Now(),
		turn:    make(chan struct{}, 1),
		k:       k,
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		k.stop()
		return Context{}, ErrContextRemoved
	}
	s.contexts[c.ID] = c
	s.mu.Unlock()
	return c.Context, nil
}

// defaultCwd is DefaultCwd, or where the image has no such directory (an
// image that is not e2b's), the kernel user's home, or /.
func (s *Server) defaultCwd() string {
	if isDir(s.cfg.DefaultCwd) {
		return s.cfg.DefaultCwd
	}
	if env, err := s.host.ProcessEnv(s.cfg.User); err == nil && env["HOME"] != "" && isDir(env["HOME"]) {
		return env["HOME"]
	}
	return "/"
}

func isDir(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.IsDir()
}

// defaultContext returns the language's default context, creating it (in
// DefaultCwd) on first use.
func (s *Server) defaultContext(ctx context.Context, language string) (*codeContext, error) {
	lang, _, err := s.resolveLanguage(language)
	if err != nil {
		return nil, err
	}
	release, err := s.defaultTurn(ctx, lang)
	if err != nil {
		return nil, err
	}
	defer release()
	s.mu.Lock()
	c := s.contexts[s.defaults[lang]]
	s.mu.Unlock()
	if c != nil {
		return c, nil
	}
	created, err := s.CreateContext(ctx, lang, "")
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.defaults[lang] = created.ID
	if c = s.contexts[created.ID]; c == nil {
		return nil, ErrContextRemoved
	}
	if lang == "python" {
		s.readyOnce.Do(func() { close(s.defReady) })
	}
	return c, nil
}

// defaultTurn waits for the turn to create lang's default context.
func (s *Server) defaultTurn(ctx context.Context, lang string) (release func(), err error) {
	s.mu.Lock()
	turn := s.defTurn[lang]
	if turn == nil {
		turn = make(chan struct{}, 1)
		s.defTurn[lang] = turn
	}
	s.mu.Unlock()
	select {
	case turn <- struct{}{}:
		return func() { <-turn }, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (s *Server) lookup(id string) (*codeContext, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c, ok := s.contexts[id]
	if !ok {
		return nil, fmt.Errorf("%w: %s", ErrContextNotFound, id)
	}
	return c, nil
}

// Contexts lists the live contexts, oldest first.
func (s *Server) Contexts() []Context {
	s.mu.Lock()
	all := slices.Collect(maps.Values(s.contexts))
	s.mu.Unlock()
	slices.SortFunc(all, func(a, b *codeContext) int { return a.created.Compare(b.created) })
	out := make([]Context, len(all))
	for i, c := range all {
		out[i] = c.Context
	}
	return out
}

// RemoveContext stops the context's kernel and forgets it. A running
// execution ends with unexpected_end_of_execution.
func (s *Server) RemoveContext(id string) error {
	s.mu.Lock()
	c, ok := s.contexts[id]
	if ok {
		delete(s.contexts, id)
		for lang, def := range s.defaults {
			if def == id {
				delete(s.defaults, lang)
			}
		}
	}
	s.mu.Unlock()
	if !ok {
		return fmt.Errorf("%w: %s", ErrContextNotFound, id)
	}
	c.remove()
	return nil
}

// RestartContext replaces the context's kernel by a fresh one (same id,
// language and cwd). It does not wait for a running execution, which ends
// with unexpected_end_of_execution: restarting is how a stuck kernel is
// recovered.
func (s *Server) RestartContext(ctx context.Context, id string) error {
	c, err := s.lookup(id)
	if err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.removed {
		return fmt.Errorf("%w: %s", ErrContextNotFound, id)
	}
	// The old kernel goes first: two at once would double the memory.
	if c.k != nil {
		c.k.stop()
		c.k = nil
	}
	k, err := s.startKernel(ctx, c.spec, c.Cwd)
	if err != nil {
		return err
	}
	c.k = k
	return nil
}

func (c *codeContext) remove() {
	c.mu.Lock()
	c.removed = true
	k := c.k
	c.k = nil
	c.mu.Unlock()
	if k != nil {
		k.stop()
	}
}

// kernel returns the context's live kernel, starting a fresh one when the
// last one died.
func (s *Server) kernelFor(ctx context.Context, c *codeContext) (*kernel, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.removed {
		return nil, ErrContextRemoved
	}
	if c.k != nil && c.k.alive() {
		return c.k, nil
	}
	if c.k != nil {
		c.k.client.Close()
		c.k = nil
		s.log.Info("code interpreter: replacing dead kernel", "context", c.ID, "language", c.Language)
	}
	k, err := s.startKernel(ctx, c.spec, c.Cwd)
	if err != nil {
		return nil, err
	}
	c.k = k
	return k, nil
}

// executeOptions is one /execute request, validated.
type executeOptions struct {
	code    string
	envVars map[string]string
}

// execute runs opts on c, streaming through emit. It waits for c's turn.
func (s *Server) execute(ctx context.Context, c *codeContext, opts executeOptions, emit func(any) error) {
	select {
	case c.turn <- struct{}{}:
	case <-ctx.Done():
		return
	}
	defer func() { <-c.turn }()

	k, err := s.kernelFor(ctx, c)
	if err != nil {
		name := "KernelStartError"
		if errors.Is(err, ErrContextRemoved) {
			name = "ContextRemoved"
		}
		_ = emit(newError(name, err.Error(), nil))
		_ = emit(unexpectedEndOfExecution)
		return
	}
	if err := s.prepareEnv(ctx, k, opts.envVars); err != nil {
		if !k.alive() {
			k.sendDied(emit)
			return
		}
		_ = emit(newError("EnvVarsError", "setting the env vars failed: "+err.Error(), nil))
		_ = emit(unexpectedEndOfExecution)
		return
	}
	outcome := k.run(ctx, opts.code, emit)
	if outcome == runDone {
		_ = emit(endOfExecution)
	}
	// The run's own vars are undone before the turn passes on; the client
	// already has its end_of_execution and need not wait for that.
	if len(opts.envVars) > 0 && k.alive() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), silentTimeout)
		defer cancel()
		if err := k.runSilent(rctx, envSnippet(c.Language, restoreEnvChanges(opts.envVars, k.env))); err != nil {
			s.log.Warn("code interpreter: restoring env vars failed", "context", c.ID, "err", err)
		}
	}
}

// prepareEnv brings the kernel up to date with the sandbox's env vars (POST
// /init may have changed them since it started) and then applies the run's
// own vars on top.
func (s *Server) prepareEnv(ctx context.Context, k *kernel, runVars map[string]string) error {
	now, err := s.host.ProcessEnv(s.cfg.User)
	if err != nil {
		return err
	}
	maps.Copy(now, k.spec.Env)
	if diff := envDiff(k.env, now); len(diff) > 0 {
		if err := k.runSilent(ctx, envSnippet(k.spec.Language, diff)); err != nil {
			return err
		}
		k.env = now
	}
	if len(runVars) > 0 {
		return k.runSilent(ctx, envSnippet(k.spec.Language, setEnvChanges(runVars)))
	}
	return nil
}
