package main

import (
	"fmt"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	cubicle "github.com/cubicle-dev/cubicle/sdk/go"
)

// poolCmd is `cubicle pool`: a template's warm pool of idle standbys.
func poolCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "pool", Short: "Manage template warm pools (pre-started standby sandboxes)"}
	var asJSON bool
	cmd.PersistentFlags().BoolVar(&asJSON, "json", false, "print JSON")
	var size int
	set := &cobra.Command{
		Use:   "set TEMPLATE --size N",
		Short: "Keep N idle standbys of a template (0 removes the pool)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if !cmd.Flags().Changed("size") {
				return fmt.Errorf("--size is required")
			}
			c, err := newClient()
			if err != nil {
				return err
			}
			out, err := c.SetWarmPool(cmd.Context(), args[0], size)
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(cmd.OutOrStdout(), out)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s: pool size %d (%d ready)\n", out.TemplateID, out.PoolSize, out.Ready)
			return nil
		},
	}
	set.Flags().IntVar(&size, "size", 0, "number of standbys (0-64)")
	get := &cobra.Command{
		Use:   "get TEMPLATE",
		Short: "Show a template's pool size and ready standbys",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := newClient()
			if err != nil {
				return err
			}
			out, err := c.GetWarmPool(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(cmd.OutOrStdout(), out)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s: pool size %d (%d ready)\n", out.TemplateID, out.PoolSize, out.Ready)
			return nil
		},
	}
	list := &cobra.Command{
		Use:   "list",
		Short: "List templates that have a warm pool",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := newClient()
			if err != nil {
				return err
			}
			ts, err := c.ListTemplates(cmd.Context())
			if err != nil {
				return err
			}
			pools := []cubicle.WarmPool{}
			names := map[string][]string{}
			for _, t := range ts {
				if t.PoolSize == 0 {
					continue
				}
				p, err := c.GetWarmPool(cmd.Context(), t.TemplateID)
				if err != nil {
					return err
				}
				pools = append(pools, *p)
				names[t.TemplateID] = t.Names
			}
			if asJSON {
				return printJSON(cmd.OutOrStdout(), pools)
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "TEMPLATE\tNAMES\tSIZE\tREADY")
			for _, p := range pools {
				fmt.Fprintf(tw, "%s\t%s\t%d\t%d\n", p.TemplateID, strings.Join(names[p.TemplateID], ","), p.PoolSize, p.Ready)
			}
			return tw.Flush()
		},
	}
	cmd.AddCommand(set, get, list)
	return cmd
}

// parseWarmPools reads --warm-pool NAME=N values.
func parseWarmPools(vals []string) (map[string]int, error) {
	out := map[string]int{}
	for _, v := range vals {
		name, n, ok := strings.Cut(v, "=")
		size, err := strconv.Atoi(n)
		if !ok || name == "" || err != nil || size < 0 {
			return nil, fmt.Errorf("--warm-pool %q: want TEMPLATE=N with N >= 0", v)
		}
		out[name] = size
	}
	return out, nil
}
