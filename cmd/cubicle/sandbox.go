package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"golang.org/x/term"

	cubicle "github.com/cubicle-dev/cubicle/sdk/go"
)

// parseKV reads repeated KEY=VALUE flags.
func parseKV(flag string, vals []string) (map[string]string, error) {
	if len(vals) == 0 {
		return nil, nil
	}
	out := map[string]string{}
	for _, v := range vals {
		k, val, ok := strings.Cut(v, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("--%s %q: want KEY=VALUE", flag, v)
		}
		out[k] = val
	}
	return out, nil
}

func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func sandboxCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "sandbox", Aliases: []string{"sb"}, Short: "Manage sandboxes through the API (CUBICLE_API_URL, CUBICLE_API_KEY)"}
	var asJSON bool
	cmd.PersistentFlags().BoolVar(&asJSON, "json", false, "print JSON")

	var tpl string
	var timeout int
	var vols, envs, meta []string
	var accelSpec string
	create := &cobra.Command{
		Use:   "create",
		Short: "Create a sandbox and print its ID",
		Example: `  cubicle sandbox create
  cubicle sandbox create -t python --timeout 3600 -e DEBUG=1 -v data:/data -v models:/models:ro
  cubicle sandbox create --accelerator class=gpu,count=1`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o := cubicle.CreateOptions{Template: tpl, Timeout: time.Duration(timeout) * time.Second}
			var err error
			if o.VolumeMounts, err = parseVolumeFlags(vols); err != nil {
				return err
			}
			if o.Env, err = parseKV("env", envs); err != nil {
				return err
			}
			if o.Metadata, err = parseKV("metadata", meta); err != nil {
				return err
			}
			if accelSpec != "" {
				r, err := parseAccelFlag(accelSpec)
				if err != nil {
					return err
				}
				o.Accelerators = []cubicle.AcceleratorRequest{{Class: string(r.Class), Count: r.Count, Labels: r.Labels,
					Backend: string(r.Backend), Vendor: r.Vendor, MinMemoryMB: r.MinMemoryMB}}
			}
			c, err := newClient()
			if err != nil {
				return err
			}
			sb, err := c.Create(cmd.Context(), o)
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(cmd.OutOrStdout(), map[string]any{"sandboxID": sb.ID, "templateID": sb.TemplateID, "envdVersion": sb.EnvdVersion})
			}
			fmt.Fprintln(cmd.OutOrStdout(), sb.ID)
			return nil
		},
	}
	create.Flags().StringVarP(&tpl, "template", "t", "", "template ID or name (default: CUBICLE_TEMPLATE_ID, else base)")
	create.Flags().IntVar(&timeout, "timeout", 300, "lifetime in seconds")
	create.Flags().StringArrayVarP(&vols, "volume", "v", nil, "mount a volume: NAME:/path[:ro] (repeatable)")
	create.Flags().StringArrayVarP(&envs, "env", "e", nil, "environment variable KEY=VALUE (repeatable)")
	create.Flags().StringArrayVar(&meta, "metadata", nil, "metadata KEY=VALUE (repeatable)")
	create.Flags().StringVar(&accelSpec, "accelerator", "", "request accelerators: class=gpu,count=1,vendor=nvidia,backend=passthrough,min-memory-mb=N,label.KEY=VALUE")

	var states []string
	var listMeta []string
	list := &cobra.Command{
		Use:   "list",
		Short: "List running and paused sandboxes",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			md, err := parseKV("metadata", listMeta)
			if err != nil {
				return err
			}
			c, err := newClient()
			if err != nil {
				return err
			}
			all := []cubicle.SandboxInfo{}
			for s, err := range c.List(cubicle.ListOptions{States: states, Metadata: md}).All(cmd.Context()) {
				if err != nil {
					return err
				}
				all = append(all, s)
			}
			if asJSON {
				return printJSON(cmd.OutOrStdout(), all)
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tTEMPLATE\tSTATE\tCPU\tMEM\tSTARTED\tEXPIRES")
			for _, s := range all {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%dMiB\t%s\t%s\n", s.SandboxID, s.TemplateID, s.State, s.CPUCount, s.MemoryMB, tplTime(s.StartedAt), tplTime(s.EndAt))
			}
			return tw.Flush()
		},
	}
	list.Flags().StringSliceVar(&states, "state", nil, "only these states (running, paused)")
	list.Flags().StringArrayVar(&listMeta, "metadata", nil, "only sandboxes with metadata KEY=VALUE (repeatable)")

	info := &cobra.Command{
		Use:   "info ID",
		Short: "Show one sandbox",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := newClient()
			if err != nil {
				return err
			}
			s, err := c.Get(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			return printJSON(cmd.OutOrStdout(), s)
		},
	}

	kill := &cobra.Command{
		Use:   "kill ID...",
		Short: "Kill sandboxes",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := newClient()
			if err != nil {
				return err
			}
			var missing []string
			for _, id := range args {
				ok, err := c.Kill(cmd.Context(), id)
				if err != nil {
					return fmt.Errorf("kill %s: %w", id, err)
				}
				if !ok {
					missing = append(missing, id)
					continue
				}
				fmt.Fprintln(cmd.OutOrStdout(), id)
			}
			if len(missing) > 0 {
				return fmt.Errorf("no such sandbox: %s: %w", strings.Join(missing, ", "), cubicle.ErrSandboxNotFound)
			}
			return nil
		},
	}
	var pauseMemory bool
	pause := &cobra.Command{
		Use:   "pause ID",
		Short: "Pause a sandbox (resume it with `sandbox resume`)",
		Example: `  cubicle sandbox pause $ID
  cubicle sandbox pause $ID --memory=false   # keep only the files; resume reboots it`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := newClient()
			if err != nil {
				return err
			}
			var o cubicle.PauseOptions
			if cmd.Flags().Changed("memory") {
				o.KeepMemory = &pauseMemory
			}
			ok, err := c.PauseWith(cmd.Context(), args[0], o)
			if err != nil {
				return err
			}
			if !ok {
				fmt.Fprintf(cmd.OutOrStdout(), "%s was already paused\n", args[0])
				return nil
			}
			if !pauseMemory {
				fmt.Fprintf(cmd.OutOrStdout(), "%s paused (files only: resume reboots it)\n", args[0])
				return nil
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s paused\n", args[0])
			return nil
		},
	}
	pause.Flags().BoolVar(&pauseMemory, "memory", true, "keep memory; false stops every process, keeps the files, and resume reboots the sandbox")
	var resumeTimeout int
	resume := &cobra.Command{
		Use:   "resume ID",
		Short: "Resume (connect to) a paused sandbox",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := newClient()
			if err != nil {
				return err
			}
			if _, err := c.Connect(cmd.Context(), args[0], time.Duration(resumeTimeout)*time.Second); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s running\n", args[0])
			return nil
		},
	}
	resume.Flags().IntVar(&resumeTimeout, "timeout", 0, "extend the lifetime to at least this many seconds from now")

	cmd.AddCommand(create, list, info, kill, pause, resume, execCmd(), shellCmd())
	cmd.AddCommand(sandboxSnapshotCmd(&asJSON), sandboxForkCmd(&asJSON), sandboxRollbackCmd())
	return cmd
}

func execCmd() *cobra.Command {
	var cwd, user string
	var envs []string
	var timeout int
	var stdin bool
	c := &cobra.Command{
		Use:   "exec ID -- COMMAND [ARG...]",
		Short: "Run a command in a sandbox, streaming its output; exits with its exit code",
		Example: `  cubicle sandbox exec $ID -- ls -la /
  echo hello | cubicle sandbox exec --stdin $ID -- cat`,
		Args: cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			env, err := parseKV("env", envs)
			if err != nil {
				return err
			}
			c, err := newClient()
			if err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			sb, err := c.Attach(ctx, args[0])
			if err != nil {
				return err
			}
			out, errOut := cmd.OutOrStdout(), cmd.ErrOrStderr()
			h, err := sb.Commands().Start(ctx, shellJoin(args[1:]), &cubicle.CommandOptions{Cwd: cwd, User: user, Env: env, Stdin: stdin,
				Timeout:  time.Duration(timeout) * time.Second,
				OnStdout: func(b []byte) { out.Write(b) }, OnStderr: func(b []byte) { errOut.Write(b) }})
			if err != nil {
				return err
			}
			if stdin {
				go func() {
					buf := make([]byte, 32<<10)
					for {
						n, rerr := cmd.InOrStdin().Read(buf)
						if n > 0 && h.SendStdin(ctx, append([]byte(nil), buf[:n]...)) != nil {
							return
						}
						if rerr != nil {
							h.CloseStdin(ctx)
							return
						}
					}
				}()
			}
			res, err := h.Wait()
			var ee *cubicle.CommandExitError
			if errors.As(err, &ee) {
				return &exitCodeError{code: res.ExitCode}
			}
			if ctx.Err() != nil {
				h.Kill(context.Background())
				return fmt.Errorf("interrupted; killed pid %d", h.PID)
			}
			return err
		},
	}
	c.Flags().StringVar(&cwd, "cwd", "", "working directory")
	c.Flags().StringVar(&user, "user", "", "run as this user")
	c.Flags().StringArrayVarP(&envs, "env", "e", nil, "environment variable KEY=VALUE (repeatable)")
	c.Flags().IntVar(&timeout, "timeout", 0, "give up after this many seconds (0: never)")
	c.Flags().BoolVar(&stdin, "stdin", false, "forward this process's stdin to the command")
	return c
}

// shellJoin quotes args for bash -c, leaving a single argument as written
// (so `exec ID -- 'ls | wc -l'` keeps its pipe).
func shellJoin(args []string) string {
	if len(args) == 1 {
		return args[0]
	}
	return cubicle.ShellQuote(args)
}

func shellCmd() *cobra.Command {
	var user, cwd string
	c := &cobra.Command{
		Use:   "shell ID",
		Short: "Open an interactive terminal in a sandbox",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := newClient()
			if err != nil {
				return err
			}
			ctx, cancel := context.WithCancel(cmd.Context())
			defer cancel()
			sb, err := c.Attach(ctx, args[0])
			if err != nil {
				return err
			}
			in := cmd.InOrStdin()
			cols, rows := uint32(80), uint32(24)
			inFile, isFile := in.(*os.File)
			tty := isFile && term.IsTerminal(int(inFile.Fd()))
			if tty {
				if w, h, err := term.GetSize(int(inFile.Fd())); err == nil {
					cols, rows = uint32(w), uint32(h)
				}
			}
			out := cmd.OutOrStdout()
			h, err := sb.PTY().Create(ctx, cubicle.PTYOptions{Cols: cols, Rows: rows, User: user, Cwd: cwd, OnData: func(b []byte) { out.Write(b) }})
			if err != nil {
				return err
			}
			if tty {
				old, err := term.MakeRaw(int(inFile.Fd()))
				if err == nil {
					defer term.Restore(int(inFile.Fd()), old)
				}
				winch := make(chan os.Signal, 1)
				signal.Notify(winch, syscall.SIGWINCH)
				defer signal.Stop(winch)
				go func() {
					for range winch {
						if w, hh, err := term.GetSize(int(inFile.Fd())); err == nil {
							sb.PTY().Resize(ctx, h.PID, uint32(w), uint32(hh))
						}
					}
				}()
			}
			go func() {
				buf := make([]byte, 4096)
				for {
					n, rerr := in.Read(buf)
					if n > 0 && h.SendStdin(ctx, append([]byte(nil), buf[:n]...)) != nil {
						return
					}
					if rerr != nil {
						if !tty {
							// Piped input ended: let the shell finish what it got.
							h.SendStdin(ctx, []byte("\nexit\n"))
						}
						return
					}
				}
			}()
			_, err = h.Wait()
			var ee *cubicle.CommandExitError
			if errors.As(err, &ee) {
				return nil // the shell's own exit status is not the CLI's error
			}
			return err
		},
	}
	c.Flags().StringVar(&user, "user", "", "log in as this user")
	c.Flags().StringVar(&cwd, "cwd", "", "start in this directory")
	return c
}
