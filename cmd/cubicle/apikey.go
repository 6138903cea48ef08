package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/cubicle-dev/cubicle/internal/api"
	"github.com/cubicle-dev/cubicle/internal/store"
	"github.com/cubicle-dev/cubicle/internal/store/sqlite"
)

const defaultDataDir = "/var/lib/cubicle"

func openStore(dataDir string) (*sqlite.Store, error) {
	if err := os.MkdirAll(dataDir, 0o700); err != nil {
		return nil, err
	}
	return sqlite.Open(filepath.Join(dataDir, "cubicle.db"))
}

// withStore opens the data dir's database for one CLI command.
func withStore(dataDir string, fn func(*sqlite.Store) error) error {
	st, err := openStore(dataDir)
	if err != nil {
		return err
	}
	defer st.Close()
	return fn(st)
}

// newAPIKey makes a key shaped e2b_<hex> so older SDKs' format check passes.
func newAPIKey() string {
	b := make([]byte, 20)
	rand.Read(b)
	return "e2b_" + hex.EncodeToString(b)
}

func apikeyCmd() *cobra.Command {
	var dataDir string
	cmd := &cobra.Command{Use: "apikey", Short: "Manage API keys (stored hashed in the data dir)"}
	cmd.PersistentFlags().StringVar(&dataDir, "data-dir", defaultDataDir, "server data directory")
	var name string
	create := &cobra.Command{
		Use:   "create",
		Short: "Create an API key and print it (shown only once)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return withStore(dataDir, func(st *sqlite.Store) error {
				key := newAPIKey()
				idb := make([]byte, 8)
				rand.Read(idb)
				k := &store.APIKey{ID: "key_" + hex.EncodeToString(idb), Name: name, Hash: api.HashKey(key), Prefix: key[:10], CreatedAt: time.Now().UTC()}
				if err := st.CreateAPIKey(context.Background(), k); err != nil {
					return err
				}
				fmt.Fprintln(cmd.OutOrStdout(), key)
				return nil
			})
		},
	}
	create.Flags().StringVar(&name, "name", "default", "a label for the key")
	list := &cobra.Command{
		Use:   "list",
		Short: "List API keys",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return withStore(dataDir, func(st *sqlite.Store) error {
				keys, err := st.ListAPIKeys(context.Background())
				if err != nil {
					return err
				}
				tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "ID\tNAME\tPREFIX\tCREATED\tLAST USED")
				for _, k := range keys {
					used := "never"
					if !k.LastUsed.IsZero() {
						used = k.LastUsed.Format(time.RFC3339)
					}
					fmt.Fprintf(tw, "%s\t%s\t%s…\t%s\t%s\n", k.ID, k.Name, k.Prefix, k.CreatedAt.Format(time.RFC3339), used)
				}
				return tw.Flush()
			})
		},
	}
	del := &cobra.Command{
		Use:   "delete ID",
		Short: "Revoke an API key",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withStore(dataDir, func(st *sqlite.Store) error {
				return st.DeleteAPIKey(context.Background(), args[0])
			})
		},
	}
	cmd.AddCommand(create, list, del)
	return cmd
}
