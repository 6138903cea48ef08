package main

import (
	"context"
	"fmt"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	cubicle "github.com/cubicle-dev/cubicle/sdk/go"

	"github.com/cubicle-dev/cubicle/internal/volume"
	"github.com/cubicle-dev/cubicle/internal/volume/binary"
	"github.com/cubicle-dev/cubicle/internal/volume/plugintest"
	"github.com/cubicle-dev/cubicle/internal/volume/rpc"
)

// parseVolumeFlags turns NAME:/path[:ro] into volume mounts.
func parseVolumeFlags(vals []string) ([]cubicle.VolumeMount, error) {
	var out []cubicle.VolumeMount
	for _, v := range vals {
		parts := strings.Split(v, ":")
		if len(parts) < 2 || len(parts) > 3 || parts[0] == "" || parts[1] == "" {
			return nil, fmt.Errorf("--volume %q: want NAME:/path or NAME:/path:ro", v)
		}
		m := cubicle.VolumeMount{Name: parts[0], Path: parts[1]}
		if len(parts) == 3 {
			switch parts[2] {
			case "ro":
				m.ReadOnly = true
			case "rw":
			default:
				return nil, fmt.Errorf("--volume %q: mode must be ro or rw", v)
			}
		}
		out = append(out, m)
	}
	return out, nil
}

func volumeCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "volume", Aliases: []string{"vol"}, Short: "Manage persistent volumes through the API (CUBICLE_API_URL, CUBICLE_API_KEY)"}
	var asJSON bool
	cmd.PersistentFlags().BoolVar(&asJSON, "json", false, "print JSON")
	var driver string
	var sizeMB int64
	create := &cobra.Command{
		Use:   "create [NAME]",
		Short: "Create a volume (without NAME the server generates a UUID)",
		Args:  cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := newClient()
			if err != nil {
				return err
			}
			name := ""
			if len(args) == 1 {
				name = args[0]
			}
			v, err := c.CreateVolume(cmd.Context(), name, &cubicle.CreateVolumeOptions{Driver: driver, Size: sizeMB << 20})
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(cmd.OutOrStdout(), v)
			}
			fmt.Fprintln(cmd.OutOrStdout(), v.VolumeID)
			return nil
		},
	}
	create.Flags().StringVar(&driver, "driver", "", "volume plugin (default: the first configured)")
	create.Flags().Int64Var(&sizeMB, "size-mb", 0, "volume size in MiB; writes past it fail with ENOSPC (default: the server's --volume-size-mb)")
	list := &cobra.Command{
		Use:   "list",
		Short: "List volumes",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := newClient()
			if err != nil {
				return err
			}
			vs, err := c.ListVolumes(cmd.Context())
			if err != nil {
				return err
			}
			if asJSON {
				if vs == nil {
					vs = []cubicle.Volume{}
				}
				return printJSON(cmd.OutOrStdout(), vs)
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tNAME\tDRIVER")
			for _, v := range vs {
				fmt.Fprintf(tw, "%s\t%s\t%s\n", v.VolumeID, v.Name, orDash(v.Driver))
			}
			return tw.Flush()
		},
	}
	get := &cobra.Command{
		Use:   "get ID",
		Short: "Show a volume, its token and the sandboxes that mount it",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := newClient()
			if err != nil {
				return err
			}
			v, err := c.GetVolume(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			return printJSON(cmd.OutOrStdout(), v)
		},
	}
	del := &cobra.Command{
		Use:     "delete ID...",
		Aliases: []string{"destroy", "rm"},
		Short:   "Destroy volumes (refused while a sandbox mounts them)",
		Args:    cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := newClient()
			if err != nil {
				return err
			}
			for _, id := range args {
				if err := c.DeleteVolume(cmd.Context(), id); err != nil {
					return fmt.Errorf("delete %s: %w", id, err)
				}
				fmt.Fprintln(cmd.OutOrStdout(), id)
			}
			return nil
		},
	}
	cmd.AddCommand(create, list, get, del, pluginTestCmd())
	return cmd
}

func pluginTestCmd() *cobra.Command {
	var bin, sock, baseDir, volID string
	var timeout time.Duration
	var noProbe bool
	cmd := &cobra.Command{
		Use:   "plugin-test (--binary PATH | --socket ADDR)",
		Short: "Drive a volume plugin through create, attach(0), attach(1), detach(1), detach(0), destroy and report protocol violations",
		Long: `plugin-test runs a volume plugin the way Cubicle does, without a server:
Create, Attach with ref_count 0 and 1 (two sandboxes), Detach with ref_count 1
and 0, Destroy (twice: it must be idempotent). It reports every answer that
breaks the protocol: hook errors, private_data over 1024 bytes, host_path
outside --base-dir or not a directory, a second attach with a different
host_path, and data written through the first attach that the second cannot
read. Exit status 1 when anything is violated.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if (bin == "") == (sock == "") {
				return fmt.Errorf("give exactly one of --binary or --socket")
			}
			var p volume.Plugin
			if bin != "" {
				p = binary.New(bin, timeout)
			} else {
				cl, err := rpc.Dial(sock, timeout)
				if err != nil {
					return err
				}
				defer cl.Close()
				p = cl
			}
			if err := os.MkdirAll(baseDir, 0o755); err != nil {
				return fmt.Errorf("--base-dir: %w", err)
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), 10*timeout+time.Minute)
			defer cancel()
			rep := plugintest.Check(ctx, p, plugintest.Options{BaseDir: baseDir, VolumeID: volID, ProbeFiles: !noProbe})
			rep.Write(cmd.OutOrStdout())
			if !rep.OK() {
				return fmt.Errorf("plugin violates the volume plugin protocol (%d problem(s))", len(rep.Violations))
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&bin, "binary", "", "binary plugin executable")
	f.StringVar(&sock, "socket", "", "rpc plugin address: a Unix socket path or host:port")
	f.StringVar(&baseDir, "base-dir", volume.DefaultBaseDir, "volume_base_dir passed to Attach; host_path must be inside it")
	f.StringVar(&volID, "volume-id", "", "volume ID to use (default plugintest-<random>)")
	f.DurationVar(&timeout, "timeout", volume.DefaultTimeout, "timeout per hook")
	f.BoolVar(&noProbe, "no-probe", false, "skip writing and reading a probe file through host_path")
	return cmd
}
