package main

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/cubicle-dev/cubicle/internal/clusterpki"
	"github.com/cubicle-dev/cubicle/internal/nodejoin"
	"github.com/cubicle-dev/cubicle/internal/secret"
	"github.com/cubicle-dev/cubicle/internal/store"
)

// nodeTokenCmd is `cubicle node token`: join tokens, run on a control
// plane host (it opens the store, and the secrets key when the cluster CA
// has to be made).
func nodeTokenCmd() *cobra.Command {
	var dataDir, dsn, secretsKey string
	cmd := &cobra.Command{Use: "token", Short: "Create, list and revoke single-use node join tokens"}
	cmd.PersistentFlags().StringVar(&dataDir, "data-dir", defaultDataDir, "server data directory")
	addStoreFlag(cmd.PersistentFlags(), &dsn)
	cmd.PersistentFlags().StringVar(&secretsKey, "secrets-key", "", "the control plane's secrets key file, needed only to make the cluster CA when no control plane has yet (default <data-dir>/secrets.key)")

	var ttl time.Duration
	var labels []string
	create := &cobra.Command{
		Use:   "create",
		Short: "Create a join token (printed once) and print the cluster CA's pin",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			l, err := parseLabels(labels)
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			return withStore(ctx, dataDir, dsn, func(st store.Store) error {
				caCert, err := clusterCACert(ctx, st, dataDir, secretsKey)
				if err != nil {
					return err
				}
				tok, row, err := nodejoin.Create(ctx, st, ttl, l, time.Now())
				if err != nil {
					if errors.Is(err, nodejoin.ErrInvalidTTL) {
						return fmt.Errorf("--ttl: %w", err)
					}
					return err
				}
				out := cmd.OutOrStdout()
				fmt.Fprintln(out, "token:", tok)
				fmt.Fprintln(out, "ca-pin:", clusterpki.Pin(caCert))
				fmt.Fprintln(out, "expires:", row.ExpiresAt.Format(time.RFC3339))
				fmt.Fprintln(out, "join a node with: cubicle node join --control-plane https://<this host> --token", tok,
					"--ca-pin", clusterpki.Pin(caCert), "--node-id <id> --data-dir <dir>")
				return nil
			})
		},
	}
	create.Flags().DurationVar(&ttl, "ttl", nodejoin.DefaultTTL, fmt.Sprintf("how long the token stays valid (at most %v)", nodejoin.MaxTTL))
	create.Flags().StringArrayVar(&labels, "label", nil, "k=v label the joining node gets (repeatable)")

	list := &cobra.Command{
		Use:   "list",
		Short: "List join tokens (their secrets are not kept)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return withStore(cmd.Context(), dataDir, dsn, func(st store.Store) error {
				toks, err := st.ListJoinTokens(cmd.Context())
				if err != nil {
					return err
				}
				tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "ID\tSTATE\tEXPIRES\tLABELS")
				now := time.Now()
				for _, t := range toks {
					state := "unused"
					switch {
					case !t.UsedAt.IsZero():
						state = "used by " + t.UsedBy + " at " + t.UsedAt.Format(time.RFC3339)
					case !now.Before(t.ExpiresAt):
						state = "expired"
					}
					fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", t.ID, state, t.ExpiresAt.Format(time.RFC3339), formatLabels(t.Labels))
				}
				return tw.Flush()
			})
		},
	}
	revoke := &cobra.Command{
		Use:   "revoke ID",
		Short: "Revoke a join token (by its ID, or the whole token)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, _, _ := strings.Cut(args[0], ".")
			return withStore(cmd.Context(), dataDir, dsn, func(st store.Store) error {
				if err := st.DeleteJoinToken(cmd.Context(), id); errors.Is(err, store.ErrNotFound) {
					return fmt.Errorf("no join token %q (see cubicle node token list)", id)
				} else if err != nil {
					return err
				}
				fmt.Fprintln(cmd.OutOrStdout(), "revoked", id)
				return nil
			})
		},
	}
	cmd.AddCommand(create, list, revoke)
	return cmd
}

// clusterCACert is the cluster CA's certificate, made here when no
// replica has made it yet. Making it needs the control plane's own secrets
// key, which must exist already: a key made here would seal the CA under a
// key no replica has, and they could not sign with it.
func clusterCACert(ctx context.Context, st store.Store, dataDir, keyPath string) (*x509.Certificate, error) {
	cert, err := clusterpki.CACert(ctx, st)
	if !errors.Is(err, store.ErrNotFound) {
		return cert, err
	}
	if keyPath == "" {
		keyPath = filepath.Join(dataDir, "secrets.key")
	}
	key, err := secret.LoadKey(keyPath)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("no cluster CA yet, and making it needs the control plane's secrets key, but %s does not exist: "+
			"start `cubicle serve` with TLS once (it makes the CA), or point --secrets-key at the key the control plane uses", keyPath)
	}
	if err != nil {
		return nil, fmt.Errorf("secrets key: %w", err)
	}
	sec, err := secret.New(st, key)
	clear(key)
	if err != nil {
		return nil, fmt.Errorf("secrets key: %w", err)
	}
	ca, err := clusterpki.LoadOrCreateCA(ctx, st, sec)
	if err != nil {
		return nil, fmt.Errorf("cluster CA: %w", err)
	}
	return ca.Cert, nil
}

func parseLabels(kvs []string) (map[string]string, error) {
	out := map[string]string{}
	for _, kv := range kvs {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			return nil, fmt.Errorf("--label %q: want k=v", kv)
		}
		if _, dup := out[k]; dup {
			return nil, fmt.Errorf("--label %q: %s given twice", kv, k)
		}
		out[k] = v
	}
	if err := nodejoin.ValidateLabels(out); err != nil {
		return nil, fmt.Errorf("--label: %w", err)
	}
	return out, nil
}

func formatLabels(l map[string]string) string {
	if len(l) == 0 {
		return "-"
	}
	keys := make([]string, 0, len(l))
	for k := range l {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for i, k := range keys {
		keys[i] = k + "=" + l[k]
	}
	return strings.Join(keys, ",")
}

// joinTokenEnv passes the token without putting it on the command line,
// where any local user can read it in ps.
const joinTokenEnv = "CUBICLE_JOIN_TOKEN"

// nodeJoinCmd is `cubicle node join`, run on the machine that becomes a
// node: its key is made there and never leaves it.
func nodeJoinCmd() *cobra.Command {
	var o nodejoin.Options
	cmd := &cobra.Command{
		Use:   "join",
		Short: "Join this machine to a cluster: get its node certificate with a join token",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if !cmd.Flags().Changed("token") {
				o.Token = os.Getenv(joinTokenEnv)
			}
			if o.Token == "" {
				return fmt.Errorf("--token (or %s) is required", joinTokenEnv)
			}
			for _, f := range []string{"control-plane", "ca-pin", "node-id"} {
				if !cmd.Flags().Changed(f) {
					return fmt.Errorf("--%s is required", f)
				}
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), time.Minute)
			defer cancel()
			info, err := nodejoin.Join(ctx, o)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "joined as node %s; certificate, key and CA in %s (labels: %s)\n", info.NodeID, o.DataDir, formatLabels(info.Labels))
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.ControlPlane, "control-plane", "", "the control plane's https URL")
	f.StringVar(&o.Token, "token", "", "the join token from `cubicle node token create` (or set "+joinTokenEnv+", which keeps it out of ps)")
	f.StringVar(&o.Pin, "ca-pin", "", "sha256:<hex> the token was printed with: the token is sent only to a server holding that CA")
	f.StringVar(&o.NodeID, "node-id", "", "this node's ID (a DNS label)")
	f.StringVar(&o.DataDir, "data-dir", "/var/lib/cubicle-node", "the node's data directory (its key, certificate and CA go here)")
	f.StringArrayVar(&o.Addresses, "address", nil, "an IP or DNS name the control plane reaches this node at (repeatable; goes in the certificate)")
	return cmd
}
