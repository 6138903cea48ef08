package main

import "github.com/spf13/cobra"

// nodeCmd is `cubicle node`: the cluster's nodes.
func nodeCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "node", Short: "Cluster nodes: join tokens and joining"}
	cmd.AddCommand(nodeTokenCmd(), nodeJoinCmd())
	return cmd
}
