package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/cubicle-dev/cubicle/internal/control"
	"github.com/cubicle-dev/cubicle/internal/store"
)

// schedulerCmd is `cubicle scheduler`: placement policies, run on a
// control-plane host (it opens the store, like `cubicle node`). The same
// policies are served to admin keys at /scheduler/policies.
func schedulerCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "scheduler", Short: "Scheduler settings: placement policies (CEL) per team or template"}
	cmd.AddCommand(schedulerPolicyCmd())
	return cmd
}

func schedulerPolicyCmd() *cobra.Command {
	var dataDir, dsn string
	cmd := &cobra.Command{
		Use:   "policy",
		Short: "Set, list and delete placement policies",
		Long: `A placement policy is a CEL filter (bool: may the node run the sandbox) and/or score (a
number added to the node's score) for every sandbox of a team or of a template. Every filter of the
team's and the template's policies must pass; their scores add up. Expressions are compiled and
cost-checked when set. Variables: node.id, node.labels, node.cpu, node.memory_mib, node.disk_mib,
node.free_cpu, node.free_memory_mib, node.free_disk_mib, node.accelerators, node.cached, node.warm,
request.team, request.template, request.cpu, request.memory_mib, request.disk_mib (docs/cluster.md).`,
	}
	cmd.PersistentFlags().StringVar(&dataDir, "data-dir", defaultDataDir, "server data directory")
	addStoreFlag(cmd.PersistentFlags(), &dsn)
	with := func(cmd *cobra.Command, fn func(context.Context, store.Store) error) error {
		return withStore(cmd.Context(), dataDir, dsn, func(st store.Store) error { return fn(cmd.Context(), st) })
	}
	scopeArgs := func(cmd *cobra.Command, args []string) error {
		if err := cobra.ExactArgs(2)(cmd, args); err != nil {
			return err
		}
		if !store.PolicyScope(args[0]).Valid() {
			return fmt.Errorf("scope %q: want team or template", args[0])
		}
		return nil
	}

	var filter, score string
	set := &cobra.Command{
		Use:   "set (team|template) ID",
		Short: "Set (create or replace) the policy of a team or template",
		Example: `  cubicle scheduler policy set template base --filter 'node.labels["zone"] == "eu-1"'
  cubicle scheduler policy set team t_abc --score 'node.free_memory_mib / 1024'`,
		Args: scopeArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return with(cmd, func(ctx context.Context, st store.Store) error {
				p := &store.PlacementPolicy{Scope: store.PolicyScope(args[0]), Target: args[1], Filter: filter, Score: score}
				if err := control.ValidatePlacementPolicy(ctx, st, p); err != nil {
					return err
				}
				if err := st.PutPlacementPolicy(ctx, p); err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "placement policy of %s %s set\n", p.Scope, p.Target)
				return nil
			})
		},
	}
	set.Flags().StringVar(&filter, "filter", "", "CEL filter (bool)")
	set.Flags().StringVar(&score, "score", "", "CEL score (int or double)")

	var asJSON bool
	list := &cobra.Command{
		Use:   "list",
		Short: "List the placement policies",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return with(cmd, func(ctx context.Context, st store.Store) error {
				ps, err := st.ListPlacementPolicies(ctx)
				if err != nil {
					return err
				}
				if asJSON {
					out := make([]map[string]any, 0, len(ps))
					for _, p := range ps {
						out = append(out, map[string]any{"scope": p.Scope, "target": p.Target, "filter": p.Filter, "score": p.Score,
							"createdAt": p.CreatedAt, "updatedAt": p.UpdatedAt})
					}
					enc := json.NewEncoder(cmd.OutOrStdout())
					enc.SetIndent("", "  ")
					return enc.Encode(out)
				}
				tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "SCOPE\tTARGET\tFILTER\tSCORE\tUPDATED")
				for _, p := range ps {
					fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", p.Scope, p.Target, orDash(p.Filter), orDash(p.Score), p.UpdatedAt.Format(time.RFC3339))
				}
				return tw.Flush()
			})
		},
	}
	list.Flags().BoolVar(&asJSON, "json", false, "print JSON")

	del := &cobra.Command{
		Use:   "delete (team|template) ID",
		Short: "Delete the policy of a team or template",
		Args:  scopeArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return with(cmd, func(ctx context.Context, st store.Store) error {
				err := st.DeletePlacementPolicy(ctx, store.PolicyScope(args[0]), args[1])
				if errors.Is(err, store.ErrNotFound) {
					return fmt.Errorf("no placement policy for %s %s (`cubicle scheduler policy list` shows them)", args[0], args[1])
				}
				if err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "placement policy of %s %s deleted\n", args[0], args[1])
				return nil
			})
		},
	}
	cmd.AddCommand(set, list, del)
	return cmd
}
