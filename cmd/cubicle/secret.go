package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	cubicle "github.com/cubicle-dev/cubicle/sdk/go"
)

// maxSecretInput bounds what the CLI reads for a value; the server has its
// own (smaller) cap and answers 400 above it.
const maxSecretInput = 1 << 20

// secretValue reads a secret's value from --value-file ("-" = stdin) or, by
// default, from stdin, so the value never lands in shell history or in the
// process list. One trailing newline (from echo or a heredoc) is dropped.
// --value exists for scripts that already hold the value in memory; it is
// visible in `ps` and shell history, which the flag's help says.
func secretValue(cmd *cobra.Command, valueFile, value string, valueSet bool) (string, error) {
	if valueSet {
		if valueFile != "" {
			return "", errors.New("--value and --value-file are exclusive")
		}
		return value, nil
	}
	var r io.Reader = cmd.InOrStdin()
	if valueFile != "" && valueFile != "-" {
		f, err := os.Open(valueFile)
		if err != nil {
			return "", err
		}
		defer f.Close()
		r = f
	}
	b, err := io.ReadAll(io.LimitReader(r, maxSecretInput+1))
	if err != nil {
		return "", err
	}
	if len(b) > maxSecretInput {
		return "", fmt.Errorf("secret value longer than %d bytes", maxSecretInput)
	}
	v := strings.TrimSuffix(strings.TrimSuffix(string(b), "\n"), "\r")
	if v == "" {
		return "", errors.New("empty secret value: pipe it on stdin or name a --value-file")
	}
	return v, nil
}

func parseSecretMetadata(kvs []string) (map[string]string, error) {
	if len(kvs) == 0 {
		return nil, nil
	}
	m := map[string]string{}
	for _, kv := range kvs {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("--metadata %q: want KEY=VALUE", kv)
		}
		m[k] = v
	}
	return m, nil
}

func secretCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "secret", Short: "Manage secrets through the API (CUBICLE_API_URL, CUBICLE_API_KEY); values are write-only"}
	var asJSON bool
	cmd.PersistentFlags().BoolVar(&asJSON, "json", false, "print JSON")
	show := func(cmd *cobra.Command, s *cubicle.Secret) error {
		if asJSON {
			return printJSON(cmd.OutOrStdout(), s)
		}
		fmt.Fprintf(cmd.OutOrStdout(), "%s\t%s\tv%d\n", s.SecretID, s.Name, s.CurrentVersion)
		return nil
	}
	valueFlags := func(c *cobra.Command, valueFile, value *string, meta *[]string) {
		c.Flags().StringVar(valueFile, "value-file", "", "read the value from this file (- = stdin; the default is stdin)")
		c.Flags().StringVar(value, "value", "", "the value itself: visible in shell history and `ps`, prefer stdin or --value-file")
		c.Flags().StringArrayVar(meta, "metadata", nil, "KEY=VALUE metadata (repeatable); on update it replaces the secret's metadata")
	}

	var cValueFile, cValue string
	var cMeta []string
	create := &cobra.Command{
		Use:   "create NAME",
		Short: "Create a secret; the value is read from stdin unless --value-file names a file",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			meta, err := parseSecretMetadata(cMeta)
			if err != nil {
				return err
			}
			v, err := secretValue(cmd, cValueFile, cValue, cmd.Flags().Changed("value"))
			if err != nil {
				return err
			}
			c, err := newClient()
			if err != nil {
				return err
			}
			s, err := c.CreateSecret(cmd.Context(), args[0], v, meta)
			if err != nil {
				return err
			}
			return show(cmd, s)
		},
	}
	valueFlags(create, &cValueFile, &cValue, &cMeta)

	var uValueFile, uValue string
	var uMeta []string
	update := &cobra.Command{
		Use:   "update ID|NAME",
		Short: "Store a new value as the secret's next version (stdin unless --value-file)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			meta, err := parseSecretMetadata(uMeta)
			if err != nil {
				return err
			}
			v, err := secretValue(cmd, uValueFile, uValue, cmd.Flags().Changed("value"))
			if err != nil {
				return err
			}
			c, err := newClient()
			if err != nil {
				return err
			}
			s, err := c.UpdateSecret(cmd.Context(), args[0], v, meta)
			if err != nil {
				return err
			}
			return show(cmd, s)
		},
	}
	valueFlags(update, &uValueFile, &uValue, &uMeta)

	var limit int
	list := &cobra.Command{
		Use:   "list",
		Short: "List the team's secrets (names and versions, never values)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := newClient()
			if err != nil {
				return err
			}
			all := []cubicle.Secret{}
			tok := ""
			// Bounded: a server that kept answering a token would otherwise
			// keep the loop going forever.
			for range 10000 {
				p, err := c.ListSecrets(cmd.Context(), &cubicle.ListSecretsOptions{Limit: limit, NextToken: tok})
				if err != nil {
					return err
				}
				all = append(all, p.Secrets...)
				if tok = p.NextToken; tok == "" || len(p.Secrets) == 0 {
					break
				}
			}
			if asJSON {
				return printJSON(cmd.OutOrStdout(), all)
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tNAME\tVERSION\tUPDATED")
			for _, s := range all {
				fmt.Fprintf(tw, "%s\t%s\t%d\t%s\n", s.SecretID, s.Name, s.CurrentVersion, s.UpdatedAt.Local().Format(time.DateTime))
			}
			return tw.Flush()
		},
	}
	list.Flags().IntVar(&limit, "page-size", 100, "secrets per request")

	get := &cobra.Command{
		Use:   "get ID|NAME",
		Short: "Show a secret's metadata (its value is never returned)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := newClient()
			if err != nil {
				return err
			}
			s, err := c.GetSecret(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			// Metadata is a map: JSON is the readable form with or without --json.
			return printJSON(cmd.OutOrStdout(), s)
		},
	}
	del := &cobra.Command{
		Use:   "delete ID|NAME",
		Short: "Delete a secret and its value",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := newClient()
			if err != nil {
				return err
			}
			return c.DeleteSecret(cmd.Context(), args[0])
		},
	}
	cmd.AddCommand(create, update, list, get, del)
	return cmd
}
