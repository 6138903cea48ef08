package main

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/cubicle-dev/cubicle/internal/api"
	"github.com/cubicle-dev/cubicle/internal/store"
)

const defaultDataDir = "/var/lib/cubicle"

// newAPIKey makes a key shaped e2b_<hex> so older SDKs' format check passes.
func newAPIKey() string {
	b := make([]byte, 20)
	rand.Read(b)
	return "e2b_" + hex.EncodeToString(b)
}

func apikeyCmd() *cobra.Command {
	var dataDir, storeDSN string
	cmd := &cobra.Command{Use: "apikey", Short: "Manage API keys (stored hashed in the data dir)"}
	cmd.PersistentFlags().StringVar(&dataDir, "data-dir", defaultDataDir, "server data directory")
	addStoreFlag(cmd.PersistentFlags(), &storeDSN)
	var name, team string
	var admin bool
	create := &cobra.Command{
		Use:   "create",
		Short: "Create an API key and print it (shown only once)",
		Long: `Create an API key of a team and print it (shown only once).

Without --team the key belongs to the default team and is an admin key (the
operator's key: it also manages nodes, images, public templates and teams);
pass --admin=false for a plain key. With --team the key is a plain member
of that team unless --admin is given.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return withStore(cmd.Context(), dataDir, storeDSN, func(st store.Store) error {
				ctx := cmd.Context()
				teamID := store.DefaultTeamID
				if team != "" {
					t, err := findTeam(ctx, st, team)
					if err != nil {
						return err
					}
					teamID = t.ID
				} else if !cmd.Flags().Changed("admin") {
					admin = true
				}
				key := newAPIKey()
				k := &store.APIKey{ID: "key_" + randomHex(8), TeamID: teamID, Admin: admin, Name: name, Hash: api.HashKey(key), Prefix: key[:10], CreatedAt: time.Now().UTC()}
				if err := st.CreateAPIKey(ctx, k); err != nil {
					return err
				}
				fmt.Fprintln(cmd.OutOrStdout(), key)
				return nil
			})
		},
	}
	create.Flags().StringVar(&name, "name", "default", "a label for the key")
	create.Flags().StringVar(&team, "team", "", "the team (name or ID) the key belongs to (default: the default team)")
	create.Flags().BoolVar(&admin, "admin", false, "make an admin key (default: true without --team, false with it)")
	var listTeam string
	list := &cobra.Command{
		Use:   "list",
		Short: "List API keys (never their secrets)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return withStore(cmd.Context(), dataDir, storeDSN, func(st store.Store) error {
				ctx := cmd.Context()
				teams, err := st.ListTeams(ctx)
				if err != nil {
					return err
				}
				names := map[string]string{}
				for _, t := range teams {
					names[t.ID] = t.Name
				}
				only := ""
				if listTeam != "" {
					t, err := findTeam(ctx, st, listTeam)
					if err != nil {
						return err
					}
					only = t.ID
				}
				keys, err := st.ListAPIKeys(ctx)
				if err != nil {
					return err
				}
				tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "ID\tNAME\tTEAM\tADMIN\tPREFIX\tCREATED\tLAST USED")
				for _, k := range keys {
					if only != "" && k.TeamID != only {
						continue
					}
					used := "never"
					if !k.LastUsed.IsZero() {
						used = k.LastUsed.Format(time.RFC3339)
					}
					fmt.Fprintf(tw, "%s\t%s\t%s\t%v\t%s…\t%s\t%s\n", k.ID, k.Name, names[k.TeamID], k.Admin, k.Prefix, k.CreatedAt.Format(time.RFC3339), used)
				}
				return tw.Flush()
			})
		},
	}
	list.Flags().StringVar(&listTeam, "team", "", "only this team's keys (name or ID)")
	del := &cobra.Command{
		Use:     "revoke ID",
		Aliases: []string{"delete"},
		Short:   "Revoke (delete) an API key; a running server refuses it from its next request",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withStore(cmd.Context(), dataDir, storeDSN, func(st store.Store) error {
				if err := st.DeleteAPIKey(cmd.Context(), args[0]); err != nil {
					if errors.Is(err, store.ErrNotFound) {
						return fmt.Errorf("no API key %s (see cubicle apikey list)", args[0])
					}
					return err
				}
				return nil
			})
		},
	}
	cmd.AddCommand(create, list, del)
	return cmd
}

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}
