package main

import (
	"errors"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	cubicle "github.com/cubicle-dev/cubicle/sdk/go"
)

// sandboxSnapshotCmd is `cubicle sandbox snapshot ID [--name N]`.
func sandboxSnapshotCmd(asJSON *bool) *cobra.Command {
	var name string
	cmd := &cobra.Command{
		Use:   "snapshot ID",
		Short: "Snapshot a sandbox and print the snapshot ID (the sandbox keeps running)",
		Long: `Snapshot a sandbox and print the snapshot ID (the sandbox keeps running).

A snapshot is a template: create sandboxes from it with
` + "`cubicle sandbox create -t SNAPSHOT`" + `. runsc sandboxes get memory snapshots (new
sandboxes continue where this one is); runc sandboxes get filesystem snapshots
(new sandboxes boot fresh with its files).`,
		Example: `  cubicle sandbox snapshot $ID --name before-upgrade
  cubicle sandbox create -t before-upgrade`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := newClient()
			if err != nil {
				return err
			}
			info, err := c.CreateSnapshot(cmd.Context(), args[0], &cubicle.SnapshotOptions{Name: name})
			if err != nil {
				return err
			}
			if *asJSON {
				return printJSON(cmd.OutOrStdout(), info)
			}
			fmt.Fprintln(cmd.OutOrStdout(), info.ID)
			return nil
		},
	}
	cmd.Flags().StringVar(&name, "name", "", "also name the snapshot (template name rules; must be free in the team)")
	return cmd
}

// forkJSON is one fork in `sandbox fork --json`.
type forkJSON struct {
	SandboxID   string `json:"sandboxID,omitempty"`
	TemplateID  string `json:"templateID,omitempty"`
	EnvdVersion string `json:"envdVersion,omitempty"`
	Error       string `json:"error,omitempty"`
	Code        int    `json:"code,omitempty"`
}

// sandboxForkCmd is `cubicle sandbox fork ID [--count N] [--timeout 15s]`.
func sandboxForkCmd(asJSON *bool) *cobra.Command {
	var count int
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "fork ID",
		Short: "Fork a sandbox into new sandboxes and print their IDs, one a line",
		Long: `Fork a sandbox into new sandboxes and print their IDs, one a line.

Each fork is made from one snapshot of the sandbox (see ` + "`sandbox snapshot`" + `); the
source keeps running. Forks that fail are reported on stderr and make the
command fail once the others are printed.`,
		Example: `  cubicle sandbox fork $ID --count 4 --timeout 10m`,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if count < 1 || count > 100 {
				return fmt.Errorf("--count must be between 1 and 100")
			}
			c, err := newClient()
			if err != nil {
				return err
			}
			res, err := c.Fork(cmd.Context(), args[0], &cubicle.ForkOptions{Count: count, Timeout: timeout})
			if err != nil {
				return err
			}
			return printForks(cmd.OutOrStdout(), cmd.ErrOrStderr(), res, *asJSON)
		},
	}
	cmd.Flags().IntVar(&count, "count", 1, "number of forks (1-100)")
	cmd.Flags().DurationVar(&timeout, "timeout", 0, "each fork's lifetime, e.g. 15s or 10m (default: the server's, 15s)")
	return cmd
}

func printForks(out, errOut io.Writer, res []cubicle.ForkResult, asJSON bool) error {
	failed := 0
	var js []forkJSON
	for i, r := range res {
		if r.Err != nil {
			failed++
			e := forkJSON{Error: r.Err.Error()}
			var ae *cubicle.APIError
			if errors.As(r.Err, &ae) {
				e.Error, e.Code = ae.Message, ae.StatusCode
			}
			js = append(js, e)
			if !asJSON {
				fmt.Fprintf(errOut, "fork %d: %v\n", i+1, r.Err)
			}
			continue
		}
		js = append(js, forkJSON{SandboxID: r.Sandbox.ID, TemplateID: r.Sandbox.TemplateID, EnvdVersion: r.Sandbox.EnvdVersion})
		if !asJSON {
			fmt.Fprintln(out, r.Sandbox.ID)
		}
	}
	if asJSON {
		if js == nil {
			js = []forkJSON{}
		}
		if err := printJSON(out, js); err != nil {
			return err
		}
	}
	if failed > 0 {
		return fmt.Errorf("%d of %d forks failed", failed, len(res))
	}
	return nil
}

// sandboxRollbackCmd is `cubicle sandbox rollback ID SNAPSHOT`.
func sandboxRollbackCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "rollback ID SNAPSHOT",
		Short: "Return a sandbox to a snapshot in place (same ID, token and volumes)",
		Long: `Return a sandbox to a snapshot in place (same ID, token and volumes).

Its filesystem (and, for a memory snapshot, its memory) become the snapshot's.
A filesystem rollback reboots the sandbox: its processes restart.`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := newClient()
			if err != nil {
				return err
			}
			if err := c.Rollback(cmd.Context(), args[0], args[1]); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s rolled back to %s\n", args[0], args[1])
			return nil
		},
	}
}

// snapshotCmd is `cubicle snapshot`: list, get and delete snapshots.
func snapshotCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "snapshot", Aliases: []string{"snap"}, Short: "Manage sandbox snapshots through the API (take them with `sandbox snapshot`)"}
	var asJSON bool
	cmd.PersistentFlags().BoolVar(&asJSON, "json", false, "print JSON")

	var sandboxID, name, next string
	var limit int
	var all bool
	list := &cobra.Command{
		Use:   "list",
		Short: "List snapshots, newest first",
		Example: `  cubicle snapshot list --sandbox $ID
  cubicle snapshot list --all --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := newClient()
			if err != nil {
				return err
			}
			o := &cubicle.ListSnapshotsOptions{SandboxID: sandboxID, Name: name, Limit: limit, NextToken: next}
			snaps := []cubicle.SnapshotInfo{}
			for {
				p, err := c.ListSnapshots(cmd.Context(), o)
				if err != nil {
					return err
				}
				snaps = append(snaps, p.Snapshots...)
				o.NextToken = p.NextToken
				if !all || p.NextToken == "" {
					break
				}
			}
			if asJSON {
				if err := printJSON(cmd.OutOrStdout(), snaps); err != nil {
					return err
				}
			} else if err := snapshotTable(cmd.OutOrStdout(), snaps); err != nil {
				return err
			}
			if o.NextToken != "" {
				fmt.Fprintf(cmd.ErrOrStderr(), "more: --next-token %s (or --all)\n", o.NextToken)
			}
			return nil
		},
	}
	list.Flags().StringVar(&sandboxID, "sandbox", "", "only snapshots of this sandbox")
	list.Flags().StringVar(&name, "name", "", "only the snapshot with this name")
	list.Flags().IntVar(&limit, "limit", 0, "page size (1-100, default: the server's, 100)")
	list.Flags().StringVar(&next, "next-token", "", "start at this page (printed by a previous list)")
	list.Flags().BoolVar(&all, "all", false, "follow every page")

	get := &cobra.Command{
		Use:   "get ID",
		Short: "Show one snapshot (by ID or name)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := newClient()
			if err != nil {
				return err
			}
			info, err := c.GetSnapshot(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			return printJSON(cmd.OutOrStdout(), info)
		},
	}

	del := &cobra.Command{
		Use:     "delete ID...",
		Aliases: []string{"rm"},
		Short:   "Delete snapshots (sandboxes made from them keep running)",
		Args:    cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := newClient()
			if err != nil {
				return err
			}
			var missing []string
			for _, id := range args {
				ok, err := c.DeleteSnapshot(cmd.Context(), id)
				if err != nil {
					return fmt.Errorf("delete %s: %w", id, err)
				}
				if !ok {
					missing = append(missing, id)
					continue
				}
				fmt.Fprintln(cmd.OutOrStdout(), id)
			}
			if len(missing) > 0 {
				return fmt.Errorf("no such snapshot: %s (`cubicle snapshot list` shows them)", strings.Join(missing, ", "))
			}
			return nil
		},
	}
	cmd.AddCommand(list, get, del)
	return cmd
}

func snapshotTable(w io.Writer, snaps []cubicle.SnapshotInfo) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tNAMES\tSANDBOX\tKIND\tSIZE\tTEMPLATE\tCREATED")
	for _, s := range snaps {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", s.ID, orDash(strings.Join(s.Names, ",")), s.SandboxID, s.Kind,
			humanBytes(s.SizeBytes), orDash(s.TemplateID), tplTime(s.CreatedAt))
	}
	return tw.Flush()
}
