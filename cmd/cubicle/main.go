// Command cubicle is Cubicle's single binary: the server and its CLI.
package main

import (
	"errors"
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/cubicle-dev/cubicle/internal/version"
)

func main() {
	if err := newRoot().Execute(); err != nil {
		var ec *exitCodeError
		if errors.As(err, &ec) {
			os.Exit(ec.code) // `sandbox exec` passes the command's code through
		}
		fmt.Fprintln(os.Stderr, "error:", err)
		if h := hint(err); h != "" {
			fmt.Fprintln(os.Stderr, "hint:", h)
		}
		os.Exit(1)
	}
}

func newRoot() *cobra.Command {
	root := &cobra.Command{
		Use:           "cubicle",
		Short:         "Cubicle: a self-hosted, E2B-compatible sandbox platform",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(serveCmd(), apikeyCmd(), teamCmd(), nodeCmd(), sandboxCmd(), volumeCmd(), imageCmd(), templateCmd(), versionCmd())
	root.AddCommand(poolCmd(), gpuCmd(), filesCmd(), snapshotCmd())
	root.AddCommand(secretCmd(), schedulerCmd())
	return root
}

func versionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version",
		Run: func(cmd *cobra.Command, _ []string) {
			fmt.Fprintln(cmd.OutOrStdout(), "cubicle", version.Version)
		},
	}
}
