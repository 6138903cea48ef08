package main

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"text/tabwriter"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/cubicle-dev/cubicle/internal/store"
)

var teamNameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,62}$`)

// findTeam looks a team up by name, then by ID.
func findTeam(ctx context.Context, st store.Store, ref string) (*store.Team, error) {
	t, err := st.TeamByName(ctx, ref)
	if errors.Is(err, store.ErrNotFound) {
		t, err = st.GetTeam(ctx, ref)
	}
	if errors.Is(err, store.ErrNotFound) {
		return nil, fmt.Errorf("no team %q (see cubicle team list)", ref)
	}
	return t, err
}

// quotaFlags are the --max-* flags of team create and update.
type quotaFlags struct{ q store.Quota }

func (f *quotaFlags) register(fs *pflag.FlagSet) {
	fs.IntVar(&f.q.MaxSandboxes, "max-sandboxes", 0, "concurrent sandboxes (0 = unlimited)")
	fs.IntVar(&f.q.MaxVCPUs, "max-vcpus", 0, "vCPUs summed over live sandboxes (0 = unlimited)")
	fs.IntVar(&f.q.MaxMemoryMB, "max-memory-mb", 0, "memory MiB summed over live sandboxes (0 = unlimited)")
	fs.IntVar(&f.q.MaxDiskMB, "max-disk-mb", 0, "diskSizeMB summed over live sandboxes (0 = unlimited)")
	fs.IntVar(&f.q.MaxVolumes, "max-volumes", 0, "volumes (0 = unlimited)")
	fs.IntVar(&f.q.MaxVolumeMB, "max-volume-mb", 0, "volume sizes in MiB summed over the team's volumes (0 = unlimited)")
}

// apply copies the flags the user set onto q.
func (f *quotaFlags) apply(fs *pflag.FlagSet, q *store.Quota) error {
	for _, c := range []struct {
		name     string
		src, dst *int
	}{
		{"max-sandboxes", &f.q.MaxSandboxes, &q.MaxSandboxes}, {"max-vcpus", &f.q.MaxVCPUs, &q.MaxVCPUs},
		{"max-memory-mb", &f.q.MaxMemoryMB, &q.MaxMemoryMB}, {"max-disk-mb", &f.q.MaxDiskMB, &q.MaxDiskMB},
		{"max-volumes", &f.q.MaxVolumes, &q.MaxVolumes}, {"max-volume-mb", &f.q.MaxVolumeMB, &q.MaxVolumeMB},
	} {
		if !fs.Changed(c.name) {
			continue
		}
		if *c.src < 0 {
			return fmt.Errorf("--%s must be >= 0 (0 = unlimited)", c.name)
		}
		*c.dst = *c.src
	}
	return nil
}

func limit(n int) string {
	if n == 0 {
		return "-"
	}
	return strconv.Itoa(n)
}

func teamCmd() *cobra.Command {
	var dataDir, storeDSN string
	cmd := &cobra.Command{Use: "team", Short: "Manage teams (tenants) and their quotas (stored in the data dir)"}
	cmd.PersistentFlags().StringVar(&dataDir, "data-dir", defaultDataDir, "server data directory")
	addStoreFlag(cmd.PersistentFlags(), &storeDSN)

	var cq quotaFlags
	create := &cobra.Command{
		Use:   "create NAME",
		Short: "Create a team; add keys with cubicle apikey create --team NAME",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if !teamNameRE.MatchString(args[0]) {
				return fmt.Errorf("team name %q must match %s", args[0], teamNameRE)
			}
			t := &store.Team{ID: "team_" + randomHex(6), Name: args[0]}
			if err := cq.apply(cmd.Flags(), &t.Quota); err != nil {
				return err
			}
			return withStore(cmd.Context(), dataDir, storeDSN, func(st store.Store) error {
				if err := st.CreateTeam(cmd.Context(), t); err != nil {
					if errors.Is(err, store.ErrConflict) {
						return fmt.Errorf("a team called %q exists", t.Name)
					}
					return err
				}
				fmt.Fprintln(cmd.OutOrStdout(), t.ID)
				return nil
			})
		},
	}
	cq.register(create.Flags())

	var uq quotaFlags
	update := &cobra.Command{
		Use:   "update NAME",
		Short: "Change a team's quotas (only the flags given; 0 = unlimited); running servers apply them to the next create",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withStore(cmd.Context(), dataDir, storeDSN, func(st store.Store) error {
				t, err := findTeam(cmd.Context(), st, args[0])
				if err != nil {
					return err
				}
				if err := uq.apply(cmd.Flags(), &t.Quota); err != nil {
					return err
				}
				return st.UpdateTeam(cmd.Context(), t)
			})
		},
	}
	uq.register(update.Flags())

	list := &cobra.Command{
		Use:   "list",
		Short: "List teams and their quotas (- = unlimited)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return withStore(cmd.Context(), dataDir, storeDSN, func(st store.Store) error {
				ts, err := st.ListTeams(cmd.Context())
				if err != nil {
					return err
				}
				tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "ID\tNAME\tSANDBOXES\tVCPUS\tMEMORY MB\tDISK MB\tVOLUMES\tVOLUME MB")
				for _, t := range ts {
					q := t.Quota
					fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", t.ID, t.Name, limit(q.MaxSandboxes), limit(q.MaxVCPUs),
						limit(q.MaxMemoryMB), limit(q.MaxDiskMB), limit(q.MaxVolumes), limit(q.MaxVolumeMB))
				}
				return tw.Flush()
			})
		},
	}

	del := &cobra.Command{
		Use:   "delete NAME",
		Short: "Delete a team that owns nothing (revoke its keys and remove its sandboxes, volumes and templates first)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withStore(cmd.Context(), dataDir, storeDSN, func(st store.Store) error {
				t, err := findTeam(cmd.Context(), st, args[0])
				if err != nil {
					return err
				}
				if t.ID == store.DefaultTeamID {
					return errors.New("the default team cannot be deleted")
				}
				return st.DeleteTeam(cmd.Context(), t.ID)
			})
		},
	}
	cmd.AddCommand(create, update, list, del)
	return cmd
}
