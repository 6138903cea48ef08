package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"path/filepath"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/cubicle-dev/cubicle/internal/lease"
	"github.com/cubicle-dev/cubicle/internal/store"
)

// nodeCmd is the node command group: the registry's admin commands now;
// the node agent (`node run`) and `node join` belong here too.
func nodeCmd() *cobra.Command {
	var dataDir, storeDSN string
	cmd := &cobra.Command{Use: "node", Short: "Cluster nodes: the registry (list, cordon, drain, forget), join tokens and joining"}
	with := func(cmd *cobra.Command, fn func(context.Context, store.Store) error) error {
		return withStore(cmd.Context(), dataDir, storeDSN, func(st store.Store) error { return fn(cmd.Context(), st) })
	}

	var asJSON bool
	list := &cobra.Command{
		Use:   "list",
		Short: "List the registered nodes, their capacity, what is committed and their heartbeat",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return with(cmd, func(ctx context.Context, st store.Store) error {
				rows, err := nodeRows(ctx, st, time.Now())
				if err != nil {
					return err
				}
				if asJSON {
					enc := json.NewEncoder(cmd.OutOrStdout())
					enc.SetIndent("", "  ")
					return enc.Encode(rows)
				}
				printNodes(cmd.OutOrStdout(), rows)
				return nil
			})
		},
	}
	list.Flags().BoolVar(&asJSON, "json", false, "print JSON")

	flag := func(use, short, long, done string, set func(n *store.Node) (bool, bool)) *cobra.Command {
		return &cobra.Command{
			Use: use + " <node-id>", Short: short, Long: long, Args: cobra.ExactArgs(1),
			RunE: func(cmd *cobra.Command, args []string) error {
				return with(cmd, func(ctx context.Context, st store.Store) error {
					n, err := getNode(ctx, st, args[0])
					if err != nil {
						return err
					}
					c, d := set(n)
					if _, err := st.SetNodeFlags(ctx, n.ID, c, d); err != nil {
						return nodeErr(n.ID, err)
					}
					fmt.Fprintf(cmd.OutOrStdout(), "node %s %s\n", n.ID, done)
					return nil
				})
			},
		}
	}
	cordon := flag("cordon", "Stop placing new sandboxes on a node",
		"Cordon a node: creates are no longer placed on it (with one node, they answer 429 naming it\ncordoned). Its sandboxes keep running.",
		"cordoned", func(n *store.Node) (bool, bool) { return true, n.Draining })
	drain := flag("drain", "Cordon a node and mark it draining",
		"Drain a node: cordon it and mark it draining, so no new sandbox lands on it and `node list`\nshows it leaving. Its sandboxes run until they end or are killed; moving them to another node\nneeds cross-node restore, which is not built yet.",
		"draining", func(*store.Node) (bool, bool) { return true, true })
	uncordon := flag("uncordon", "Place new sandboxes on a node again (clears cordon and drain)",
		"Uncordon a node: clear both its cordon and its drain, so creates may be placed on it again.",
		"uncordoned", func(*store.Node) (bool, bool) { return false, false })
	forget := &cobra.Command{
		Use:   "forget <node-id>",
		Short: "Remove a node from the registry and revoke its certificate (refused while live sandboxes name it)",
		Long: `Forget a node: delete its registry row, its allocatable capacity and its reservations,
and revoke every certificate issued to its node ID until now: a node that is still running
is refused (401) at its next call and does not register again, and it cannot renew. The ID
is free to join again with a new token (cubicle node token create, cubicle node join), also
when it had joined but never registered. It is refused while any live sandbox names the node.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return with(cmd, func(ctx context.Context, st store.Store) error {
				release, err := claimForForget(ctx, storeDSN, dataDir, args[0])
				if err != nil {
					return err
				}
				defer release()
				if err := st.ForgetNode(ctx, args[0]); err != nil {
					return nodeErr(args[0], err)
				}
				fmt.Fprintf(cmd.OutOrStdout(), "node %s forgotten; its certificates are revoked (it joins again with a new token)\n", args[0])
				return nil
			})
		},
	}
	// The registry's commands open the control plane's store; join runs
	// on the node and has flags of its own, so these are not persistent.
	for _, c := range []*cobra.Command{list, cordon, uncordon, drain, forget} {
		c.Flags().StringVar(&dataDir, "data-dir", defaultDataDir, "server data directory")
		addStoreFlag(c.Flags(), &storeDSN)
	}
	cmd.AddCommand(list, cordon, uncordon, drain, forget, nodeTokenCmd(), nodeJoinCmd(), nodeRunCmd())
	return cmd
}

// claimForForget takes node id's claim (the one an embedded serve holds
// for its whole life: serve's "node/<id>", on PostgreSQL an advisory lock,
// on SQLite a file lock in the data dir) for the forget: held, the node is
// alive in a running serve, and a forget, which declares it dead, is
// refused. Taken, it keeps such a serve from starting until the forget is
// done.
func claimForForget(ctx context.Context, dsn, dataDir, id string) (release func(), err error) {
	held := func(err error) error {
		return fmt.Errorf("an embedded `cubicle serve` runs node %s (%w): it is alive, so it is not forgotten; stop that serve first", id, err)
	}
	if dsn == "" {
		release, err := lease.ClaimFile(nodeClaimFile(dataDir, id), nodeClaim(id))
		if errors.Is(err, lease.ErrHeld) {
			return nil, held(err)
		}
		return release, err
	}
	pl, err := lease.NewPostgres(dsn, 0, slog.New(slog.DiscardHandler))
	if err != nil {
		return nil, fmt.Errorf("--store: %w", err)
	}
	claim, err := pl.Claim(ctx, nodeClaim(id))
	if errors.Is(err, lease.ErrHeld) {
		return nil, held(err)
	}
	if err != nil {
		return nil, fmt.Errorf("node %s: %w", id, err)
	}
	return claim.Close, nil
}

// nodeClaim is the lease.Claim an embedded serve holds for its node ID.
func nodeClaim(id string) string { return "node/" + id }

// nodeClaimFile is nodeClaim's lock file on SQLite, in the data dir that
// holds the database (the ID escaped, so it stays one file name).
func nodeClaimFile(dataDir, id string) string {
	return filepath.Join(dataDir, "claims", "node-"+url.PathEscape(id))
}

func getNode(ctx context.Context, st store.Store, id string) (*store.Node, error) {
	n, err := st.GetNode(ctx, id)
	if err != nil {
		return nil, nodeErr(id, err)
	}
	return n, nil
}

// nodeErr says what an operator can do about a registry error.
func nodeErr(id string, err error) error {
	var inUse *store.NodeInUseError
	switch {
	case errors.Is(err, store.ErrNotFound):
		return fmt.Errorf("no node %q is registered (`cubicle node list` shows the registered nodes)", id)
	case errors.As(err, &inUse):
		return fmt.Errorf("node %s still holds %d live sandboxes: kill them first", id, inUse.Sandboxes)
	}
	return err
}

// nodeRow is one node as `node list` shows it.
type nodeRow struct {
	ID            string            `json:"id"`
	Address       string            `json:"address"`
	Labels        map[string]string `json:"labels"`
	Runtime       string            `json:"runtime"`
	Version       string            `json:"version"`
	Capacity      store.Capacity    `json:"capacity"`
	Committed     store.Capacity    `json:"committed"`
	Sandboxes     int               `json:"sandboxes"`
	VolumeDrivers []string          `json:"volumeDrivers"`
	Accelerators  json.RawMessage   `json:"accelerators,omitempty"`
	Cordoned      bool              `json:"cordoned"`
	Draining      bool              `json:"draining"`
	RegisteredAt  time.Time         `json:"registeredAt"`
	HeartbeatAt   time.Time         `json:"heartbeatAt"`
	HeartbeatAge  float64           `json:"heartbeatAgeSeconds"`
}

func nodeRows(ctx context.Context, st store.Store, now time.Time) ([]nodeRow, error) {
	nodes, err := st.ListNodes(ctx)
	if err != nil {
		return nil, err
	}
	committed, err := st.CommittedCapacity(ctx)
	if err != nil {
		return nil, err
	}
	live, err := st.ListSandboxes(ctx, store.SandboxFilter{States: []store.SandboxState{
		store.StateCreating, store.StateRunning, store.StatePausing, store.StatePaused, store.StateResuming}})
	if err != nil {
		return nil, err
	}
	count := map[string]int{}
	for _, sb := range live {
		count[sb.Node]++
	}
	rows := make([]nodeRow, 0, len(nodes))
	for _, n := range nodes {
		r := nodeRow{ID: n.ID, Address: n.Address, Labels: n.Labels, Runtime: n.Runtime, Version: n.Version,
			Capacity: n.Capacity, Committed: committed[n.ID], Sandboxes: count[n.ID], VolumeDrivers: n.VolumeDrivers,
			Cordoned: n.Cordoned, Draining: n.Draining, RegisteredAt: n.RegisteredAt, HeartbeatAt: n.HeartbeatAt,
			HeartbeatAge: now.Sub(n.HeartbeatAt).Seconds()}
		if n.Accelerators != "" {
			r.Accelerators = json.RawMessage(n.Accelerators)
		}
		rows = append(rows, r)
	}
	return rows, nil
}

func printNodes(w io.Writer, rows []nodeRow) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tADDRESS\tRUNTIME\tCPU\tMEMORY MiB\tDISK MiB\tCOMMITTED CPU/MiB\tSANDBOXES\tSTATUS\tHEARTBEAT")
	for _, r := range rows {
		addr := r.Address
		if addr == "" {
			addr = "(in-process)"
		}
		status := "ready"
		switch {
		case r.Draining:
			status = "draining"
		case r.Cordoned:
			status = "cordoned"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%d\t%s/%d\t%d\t%s\t%s ago\n", r.ID, addr, r.Runtime,
			cpus(r.Capacity.MilliCPU), r.Capacity.MemoryMiB, r.Capacity.DiskMiB, cpus(r.Committed.MilliCPU), r.Committed.MemoryMiB,
			r.Sandboxes, status, time.Duration(r.HeartbeatAge*float64(time.Second)).Round(time.Second))
	}
	tw.Flush()
}

// cpus prints thousandths of a CPU as CPUs.
func cpus(milli int64) string {
	if milli%1000 == 0 {
		return fmt.Sprint(milli / 1000)
	}
	return fmt.Sprintf("%.3g", float64(milli)/1000)
}
