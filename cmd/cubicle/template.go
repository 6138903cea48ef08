package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	cubicle "github.com/cubicle-dev/cubicle/sdk/go"
)

// ---- errors -------------------------------------------------------------------------

// tplBuildFailedError is a build that ended in status error.
type tplBuildFailedError struct {
	TemplateID, BuildID string
	Step, StepDesc      string
	Message             string
}

func (e *tplBuildFailedError) Error() string {
	where := ""
	if e.Step != "" {
		where = " at step " + e.Step
		if e.StepDesc != "" {
			where += " (" + e.StepDesc + ")"
		}
	}
	return fmt.Sprintf("build %s of template %s failed%s: %s", e.BuildID, e.TemplateID, where, e.Message)
}

// tplInterruptedError is Ctrl-C while following a build; the server keeps
// building.
type tplInterruptedError struct {
	TemplateID, BuildID string
	Started             bool
}

func (e *tplInterruptedError) Error() string {
	if !e.Started {
		return fmt.Sprintf("interrupted before build %s of template %s was started; it stays waiting on the server", e.BuildID, e.TemplateID)
	}
	return fmt.Sprintf("interrupted: stopped following build %s of template %s; the build continues on the server (follow it with `cubicle template logs %s %s --follow`)",
		e.BuildID, e.TemplateID, e.TemplateID, e.BuildID)
}

// ---- build context: files, hash, archive ---------------------------------------------

type (
	tplLogEntry = cubicle.BuildLogEntry
	tplStatus   = cubicle.BuildStatus
)

// ---- API ----------------------------------------------------------------------------

// tplPollInterval is the SDK's logsRefreshFrequency.
var tplPollInterval = 200 * time.Millisecond

// tplProgress prints build log entries with a header when the step changes.
type tplProgress struct {
	out   io.Writer
	descs []string // [0] base, [1..n] steps, [n+1] finalize
	last  string
}

func newTplProgress(out io.Writer, r *cubicle.Recipe) *tplProgress {
	p := &tplProgress{out: out}
	if r == nil {
		return p
	}
	base := "FROM " + r.FromImage
	if r.FromTemplate != "" {
		base = "FROM template:" + r.FromTemplate
	}
	p.descs = append(p.descs, base)
	for _, s := range r.Steps {
		p.descs = append(p.descs, tplStepDesc(s))
	}
	p.descs = append(p.descs, "finalize")
	return p
}

func tplStepDesc(s cubicle.TemplateStep) string {
	var d string
	switch s.Type {
	case "COPY":
		d = "COPY " + s.Args[0] + " " + s.Args[1]
	case "ENV":
		var kv []string
		for i := 0; i+1 < len(s.Args); i += 2 {
			kv = append(kv, s.Args[i]+"="+s.Args[i+1])
		}
		d = "ENV " + strings.Join(kv, " ")
	default:
		d = s.Type + " " + strings.Join(s.Args, " ")
	}
	d = strings.Join(strings.Fields(d), " ")
	if r := []rune(d); len(r) > 72 {
		d = string(r[:69]) + "..."
	}
	return d
}

// index maps a wire step ("base", "finalize", "3") to the header position.
func (p *tplProgress) index(step string) (int, bool) {
	if len(p.descs) == 0 {
		return 0, false
	}
	switch step {
	case "base":
		return 0, true
	case "finalize":
		return len(p.descs) - 1, true
	}
	n, err := strconv.Atoi(step)
	if err != nil || n < 0 || n+1 >= len(p.descs)-1 {
		return 0, false
	}
	return n + 1, true
}

func (p *tplProgress) desc(step string) string {
	if i, ok := p.index(step); ok {
		return p.descs[i]
	}
	return ""
}

func (p *tplProgress) entry(e tplLogEntry) {
	if e.Step != "" && e.Step != p.last {
		p.last = e.Step
		if i, ok := p.index(e.Step); ok {
			fmt.Fprintf(p.out, "Step %d/%d: %s\n", i+1, len(p.descs), p.descs[i])
		}
	}
	step := e.Step
	if step == "" {
		step = "build"
	}
	msg := strings.TrimRight(e.Message, "\n")
	if e.Level == "error" || e.Level == "warn" {
		msg = e.Level + ": " + msg
	}
	fmt.Fprintf(p.out, "[%s] %s\n", step, msg)
}

// tplFollow follows a build (the SDK's waitForBuildFinish), printing its
// log; a failed build comes back as its status, Ctrl-C as tplInterruptedError.
func tplFollow(ctx context.Context, c *cubicle.Client, templateID, buildID string, p *tplProgress) (*tplStatus, error) {
	st, err := c.WaitTemplateBuild(ctx, templateID, buildID, p.entry, tplPollInterval)
	var be *cubicle.BuildError
	var ie *cubicle.BuildInterruptedError
	switch {
	case errors.As(err, &be):
		return st, nil
	case errors.As(err, &ie):
		return nil, &tplInterruptedError{TemplateID: templateID, BuildID: buildID, Started: true}
	}
	return st, err
}

// ---- commands -----------------------------------------------------------------------

func templateCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "template", Aliases: []string{"tpl"}, Short: "Build and manage templates through the API (CUBICLE_API_URL, CUBICLE_API_KEY)"}
	var asJSON bool
	cmd.PersistentFlags().BoolVar(&asJSON, "json", false, "print JSON")
	cmd.AddCommand(tplBuildCmd(&asJSON), tplListCmd(&asJSON), tplGetCmd(&asJSON), tplDeleteCmd(), tplLogsCmd())
	return cmd
}

func tplBuildCmd(asJSON *bool) *cobra.Command {
	var file, name, contextDir string
	var cpu, mem int
	var noCache bool
	build := &cobra.Command{
		Use:   "build -f RECIPE --name NAME[:TAG]",
		Short: "Build a template from a Dockerfile-style recipe",
		Long: `Build a template from a recipe, a subset of the Dockerfile syntax:

  FROM image | FROM template:NAME     the base (one FROM only)
  RUN cmd | RUN ["exe", "arg"]        a shell command
  COPY/ADD [--chown=u] [--chmod=0755] src... dest
                                      files from the context (no URLs)
  ENV K=v ... | ENV K value           build-time environment
  WORKDIR dir, USER user[:group]
  CMD / ENTRYPOINT                    the start command
  HEALTHCHECK CMD cmd                 the ready command, as does
  # cubicle:ready cmd                 this comment
  EXPOSE, VOLUME, LABEL, SHELL...     ignored with a warning

ARG, heredocs and multi-stage recipes are rejected. The context (default:
the recipe's directory) honours .dockerignore.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			src, err := os.ReadFile(file)
			if err != nil {
				return err
			}
			rec, err := cubicle.ParseRecipe(file, string(src))
			if err != nil {
				return err
			}
			if contextDir == "" {
				contextDir = filepath.Dir(file)
			}
			if contextDir, err = filepath.Abs(contextDir); err != nil {
				return err
			}
			logOut := cmd.OutOrStdout()
			if *asJSON {
				logOut = cmd.ErrOrStderr()
			}
			for _, w := range rec.Warnings {
				fmt.Fprintln(cmd.ErrOrStderr(), "warning:", w)
			}
			c, err := newClient()
			if err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			// Read here only to warn early; the SDK applies it.
			_, skipped, err := cubicle.ReadDockerignore(contextDir)
			if err != nil {
				return err
			}
			for _, s := range skipped {
				fmt.Fprintf(cmd.ErrOrStderr(), "warning: .dockerignore exception %q is not supported and is skipped\n", s)
			}
			spec := cubicle.TemplateSpec{Name: name, FromImage: rec.FromImage, FromTemplate: rec.FromTemplate, StartCmd: rec.StartCmd,
				ReadyCmd: rec.ReadyCmd, Force: noCache, ContextDir: contextDir}
			for _, st := range rec.Steps {
				spec.Steps = append(spec.Steps, cubicle.TemplateStep{Type: st.Type, Args: st.Args, Force: st.Force})
			}
			if cmd.Flags().Changed("cpu") {
				spec.CPUCount = cpu
			}
			if cmd.Flags().Changed("memory-mb") {
				spec.MemoryMB = mem
			}
			prog := newTplProgress(logOut, rec)
			live := isTerminal(logOut)
			bars := map[string]*progressBar{}
			ref, err := c.BuildTemplate(ctx, spec, &cubicle.BuildOptions{
				OnCreated: func(r cubicle.TemplateBuildRef) {
					fmt.Fprintf(logOut, "Template %s: ID %s, build %s\n", name, r.TemplateID, r.BuildID)
				},
				OnUpload: func(u cubicle.UploadProgress) {
					switch {
					case u.Cached:
						fmt.Fprintf(logOut, "Skipping upload of '%s', already cached\n", u.Src)
					case u.Done:
						if b := bars[u.Src]; b != nil {
							b.finish(u.Sent, u.Total)
						}
						fmt.Fprintf(logOut, "Uploaded '%s' (%d bytes)\n", u.Src, u.Total)
					default:
						b := bars[u.Src]
						if b == nil {
							b = &progressBar{w: logOut, label: "Uploading '" + u.Src + "'", live: live}
							bars[u.Src] = b
						}
						b.update(u.Sent, u.Total)
					}
				},
				OnLog:        prog.entry,
				PollInterval: tplPollInterval,
			})
			var sfe *cubicle.StepFilesError
			var be *cubicle.BuildError
			var ie *cubicle.BuildInterruptedError
			switch {
			case errors.As(err, &sfe):
				return &cubicle.RecipeError{File: file, Line: rec.Steps[sfe.Step].Line(), Msg: sfe.Err.Error()}
			case errors.As(err, &be):
				return &tplBuildFailedError{TemplateID: be.TemplateID, BuildID: be.BuildID, Step: be.Step, StepDesc: prog.desc(be.Step), Message: be.Message}
			case errors.As(err, &ie):
				return &tplInterruptedError{TemplateID: ie.TemplateID, BuildID: ie.BuildID, Started: ie.Started}
			case err != nil:
				return err
			}
			if *asJSON {
				return json.NewEncoder(cmd.OutOrStdout()).Encode(map[string]any{"templateID": ref.TemplateID, "buildID": ref.BuildID,
					"status": "ready", "names": ref.Names, "tags": ref.Tags})
			}
			fmt.Fprintf(cmd.OutOrStdout(), "Template %s is ready: templateID %s, buildID %s\n", name, ref.TemplateID, ref.BuildID)
			return nil
		},
	}
	build.Flags().StringVarP(&file, "file", "f", "Dockerfile", "the recipe (a Dockerfile subset)")
	build.Flags().StringVarP(&name, "name", "n", "", "template name, optionally NAME:TAG (required)")
	build.Flags().StringVar(&contextDir, "context", "", "build context directory (default: the recipe's directory)")
	build.Flags().IntVar(&cpu, "cpu", 0, "vCPUs (default: the server's)")
	build.Flags().IntVar(&mem, "memory-mb", 0, "memory in MiB (default: the server's)")
	build.Flags().BoolVar(&noCache, "no-cache", false, "rebuild every step (force)")
	build.MarkFlagRequired("name")
	return build
}

func tplListCmd(asJSON *bool) *cobra.Command {
	return &cobra.Command{
		Use:   "list",
		Short: "List templates",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := newClient()
			if err != nil {
				return err
			}
			all, err := c.ListTemplates(cmd.Context())
			if err != nil {
				return err
			}
			if *asJSON {
				if all == nil {
					all = []cubicle.TemplateInfo{}
				}
				return json.NewEncoder(cmd.OutOrStdout()).Encode(all)
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tNAMES\tSTATUS\tCPU\tMEM\tSPAWNS\tUPDATED")
			for _, t := range all {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%dMiB\t%d\t%s\n", t.TemplateID, strings.Join(t.Names, ","), t.BuildStatus,
					t.CPUCount, t.MemoryMB, t.SpawnCount, tplTime(t.UpdatedAt))
			}
			return tw.Flush()
		},
	}
}

func tplTime(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.Local().Format("2006-01-02 15:04:05")
}

func tplGetCmd(asJSON *bool) *cobra.Command {
	return &cobra.Command{
		Use:   "get ID|NAME",
		Short: "Show a template and its builds",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := newClient()
			if err != nil {
				return err
			}
			t, err := c.GetTemplate(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if *asJSON {
				return printJSON(cmd.OutOrStdout(), t)
			}
			w := cmd.OutOrStdout()
			last := "-"
			if t.LastSpawnedAt != nil {
				last = tplTime(*t.LastSpawnedAt)
			}
			fmt.Fprintf(w, "ID:           %s\nNames:        %s\nStatus:       %s\nBuild:        %s\nCPU:          %d\nMemory:       %d MiB\nDisk:         %d MiB\nPublic:       %t\nSpawns:       %d (last %s)\nCreated:      %s\nUpdated:      %s\n",
				t.TemplateID, strings.Join(t.Names, ", "), t.BuildStatus, t.BuildID, t.CPUCount, t.MemoryMB, t.DiskSizeMB, t.Public,
				t.SpawnCount, last, tplTime(t.CreatedAt), tplTime(t.UpdatedAt))
			if len(t.Builds) == 0 {
				return nil
			}
			fmt.Fprintln(w, "\nBuilds:")
			tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "BUILD ID\tSTATUS\tCPU\tMEM\tCREATED\tFINISHED")
			for _, b := range t.Builds {
				fin := "-"
				if b.FinishedAt != nil {
					fin = tplTime(*b.FinishedAt)
				}
				fmt.Fprintf(tw, "%s\t%s\t%d\t%dMiB\t%s\t%s\n", b.BuildID, b.Status, b.CPUCount, b.MemoryMB, tplTime(b.CreatedAt), fin)
			}
			return tw.Flush()
		},
	}
}

func tplDeleteCmd() *cobra.Command {
	var force bool
	del := &cobra.Command{
		Use:   "delete ID|NAME...",
		Short: "Delete templates (refused while sandboxes use one, unless --force)",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := newClient()
			if err != nil {
				return err
			}
			var failed []string
			for _, ref := range args {
				if err := c.DeleteTemplate(cmd.Context(), ref, force); err != nil {
					fmt.Fprintf(cmd.ErrOrStderr(), "delete %s: %v\n", ref, err)
					failed = append(failed, ref)
					continue
				}
				fmt.Fprintln(cmd.OutOrStdout(), ref)
			}
			if len(failed) > 0 {
				return fmt.Errorf("could not delete %s", strings.Join(failed, ", "))
			}
			return nil
		},
	}
	del.Flags().BoolVar(&force, "force", false, "delete even while building or in use")
	return del
}

func tplLogsCmd() *cobra.Command {
	var follow bool
	logs := &cobra.Command{
		Use:   "logs ID|NAME [BUILD_ID]",
		Short: "Print a build's logs (default: the latest build)",
		Args:  cobra.RangeArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := newClient()
			if err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			// The status route wants the template ID, and paging by
			// logsOffset is exact where timestamps may tie.
			t, err := c.GetTemplate(ctx, args[0])
			if err != nil {
				return err
			}
			buildID := ""
			if len(args) == 2 {
				buildID = args[1]
			} else if len(t.Builds) > 0 {
				buildID = t.Builds[0].BuildID
			} else {
				return fmt.Errorf("template %s has no builds", args[0])
			}
			prog := newTplProgress(cmd.OutOrStdout(), nil)
			if follow {
				st, err := tplFollow(ctx, c, t.TemplateID, buildID, prog)
				if err != nil {
					return err
				}
				return tplStatusErr(st, prog)
			}
			offset := 0
			for {
				st, err := c.TemplateBuildStatus(ctx, t.TemplateID, buildID, offset)
				if err != nil {
					return err
				}
				for _, e := range st.LogEntries {
					prog.entry(e)
				}
				if len(st.LogEntries) == 0 {
					fmt.Fprintf(cmd.ErrOrStderr(), "build %s: %s\n", buildID, st.Status)
					return tplStatusErr(st, prog)
				}
				offset += len(st.LogEntries)
			}
		},
	}
	logs.Flags().BoolVar(&follow, "follow", false, "keep following until the build finishes")
	return logs
}

func tplStatusErr(st *tplStatus, p *tplProgress) error {
	if st.Status != "error" {
		return nil
	}
	e := &tplBuildFailedError{TemplateID: st.TemplateID, BuildID: st.BuildID, Message: "unknown error"}
	if st.Reason != nil {
		e.Step, e.Message, e.StepDesc = st.Reason.Step, st.Reason.Message, p.desc(st.Reason.Step)
	}
	return e
}
