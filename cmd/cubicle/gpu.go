package main

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	cubicle "github.com/cubicle-dev/cubicle/sdk/go"

	"github.com/cubicle-dev/cubicle/internal/accel"
)

// parseAccelFlag reads class=gpu,count=1,label.KEY=VALUE into a request.
func parseAccelFlag(s string) (accel.Request, error) {
	r := accel.Request{Class: accel.ClassGPU, Count: 1}
	for _, kv := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			return r, fmt.Errorf("--accelerator %q: want KEY=VALUE pairs separated by commas", s)
		}
		switch {
		case k == "class":
			r.Class = accel.Class(v)
		case k == "count":
			n, err := strconv.Atoi(v)
			if err != nil {
				return r, fmt.Errorf("--accelerator count %q: %v", v, err)
			}
			r.Count = n
		case k == "vendor":
			r.Vendor = v
		case k == "backend":
			r.Backend = accel.BackendType(v)
		case k == "min-memory-mb":
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				return r, fmt.Errorf("--accelerator min-memory-mb %q: %v", v, err)
			}
			r.MinMemoryMB = n
		case strings.HasPrefix(k, "label."):
			if r.Labels == nil {
				r.Labels = map[string]string{}
			}
			r.Labels[strings.TrimPrefix(k, "label.")] = v
		default:
			return r, fmt.Errorf("--accelerator: unknown key %q (class, count, vendor, backend, min-memory-mb, label.KEY)", k)
		}
	}
	if err := accel.ValidateRequest(r); err != nil {
		return r, fmt.Errorf("--accelerator: %w", err)
	}
	return r, nil
}

func gpuCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "gpu", Aliases: []string{"accelerator"}, Short: "Show and administer node accelerators through the API (CUBICLE_API_URL, CUBICLE_API_KEY)"}
	var asJSON bool
	var nodeID string
	cmd.PersistentFlags().BoolVar(&asJSON, "json", false, "print JSON")
	cmd.PersistentFlags().StringVar(&nodeID, "node", "local", "node ID")
	list := &cobra.Command{
		Use:   "list",
		Short: "List a node's accelerators with their state",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := newClient()
			if err != nil {
				return err
			}
			devs, err := c.ListAccelerators(cmd.Context(), nodeID)
			if err != nil {
				return err
			}
			if devs == nil {
				devs = []cubicle.Accelerator{}
			}
			if asJSON {
				return json.NewEncoder(cmd.OutOrStdout()).Encode(devs)
			}
			if len(devs) == 0 {
				fmt.Fprintf(cmd.OutOrStdout(), "node %s has no accelerators\n", nodeID)
				return nil
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tCLASS\tVENDOR\tMODEL\tMEMORY\tNUMA\tBACKEND\tSTATE\tSANDBOX\tREASON")
			for _, d := range devs {
				mem := "-"
				if d.MemoryMB > 0 {
					mem = fmt.Sprintf("%d MiB", d.MemoryMB)
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\t%s\n", d.ID, d.Class, d.Vendor, orDash(d.Model), mem, d.NUMANode, d.Backend, d.State, orDash(d.SandboxID), d.Reason)
			}
			return tw.Flush()
		},
	}
	action := func(name, short string) *cobra.Command {
		var reason string
		c := &cobra.Command{
			Use:   name + " DEVICE",
			Short: short,
			Args:  cobra.ExactArgs(1),
			RunE: func(cmd *cobra.Command, args []string) error {
				c, err := newClient()
				if err != nil {
					return err
				}
				d, err := c.AcceleratorAction(cmd.Context(), nodeID, args[0], name, reason)
				if err != nil {
					return err
				}
				if asJSON {
					return json.NewEncoder(cmd.OutOrStdout()).Encode(d)
				}
				fmt.Fprintf(cmd.OutOrStdout(), "%s %s\n", d.ID, d.State)
				return nil
			},
		}
		if name == "disable" {
			c.Flags().StringVar(&reason, "reason", "", "why (shown in gpu list)")
		}
		return c
	}
	events := &cobra.Command{
		Use:   "events",
		Short: "Show accelerator audit events (assignments, releases, quarantines, denials)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := newClient()
			if err != nil {
				return err
			}
			evs, err := c.AcceleratorEvents(cmd.Context(), nodeID, 0)
			if err != nil {
				return err
			}
			if asJSON {
				return json.NewEncoder(cmd.OutOrStdout()).Encode(evs)
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "TIME\tTYPE\tDEVICE\tSANDBOX\tFROM\tTO\tREASON")
			for _, e := range evs {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", e.Time.Format("2006-01-02T15:04:05Z07:00"), e.Type, orDash(e.Device), orDash(e.Sandbox), orDash(e.From), orDash(e.To), e.Reason)
			}
			return tw.Flush()
		},
	}
	var dc accel.DiscoverConfig
	discover := &cobra.Command{
		Use:   "discover",
		Short: "Discover this host's accelerators read-only (no server, nothing is changed)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			devs, err := accel.Discover(cmd.Context(), dc)
			if err != nil {
				return err
			}
			// Always JSON: this is the read-only report scripts/gpu-device-check.sh keeps.
			enc := json.NewEncoder(cmd.OutOrStdout())
			enc.SetIndent("", "  ")
			return enc.Encode(devs)
		},
	}
	discover.Flags().StringVar(&dc.SysfsRoot, "sysfs", "/sys", "sysfs root")
	discover.Flags().StringVar(&dc.ProcRoot, "proc", "/proc", "procfs root")
	discover.Flags().StringVar(&dc.DevRoot, "dev", "/dev", "device root")
	discover.Flags().StringVar(&dc.NvidiaSMI, "nvidia-smi", "", "nvidia-smi binary (default: PATH)")
	cmd.AddCommand(list, action("disable", "Take a free device out of allocation"), action("enable", "Return a disabled device (revalidated first)"),
		action("recover", "Revalidate a quarantined or unhealthy device and make it allocatable"), events, discover)
	return cmd
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
