package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/cubicle-dev/cubicle/internal/image"
)

func imageCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "image", Short: "Manage the local OCI image store templates build FROM (no registry needed)"}
	imp := &cobra.Command{
		Use:   "import REF PATH",
		Short: "Import a root filesystem dir or tar(.gz), an OCI layout (dir or tar) or a docker-save tar as REF",
		Long: `Import an image into the server's local store, e.g.

  cubicle image import python:3.13 ./python-rootfs.tar.gz
  cubicle image import cubicle/tools ./oci-layout-dir

Templates then use it with fromImage (Template().fromImage('python:3.13')).`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := newAPIClient()
			if err != nil {
				return err
			}
			ref, path := args[0], args[1]
			if _, err := image.NormalizeRef(ref); err != nil {
				return err
			}
			fi, err := os.Stat(path)
			if err != nil {
				return err
			}
			var body io.Reader
			if fi.IsDir() {
				// A directory (rootfs or OCI layout) travels as a tar stream.
				pr, pw := io.Pipe()
				go func() { pw.CloseWithError(image.WriteTar(pw, path)) }()
				body = pr
			} else {
				f, err := os.Open(path)
				if err != nil {
					return err
				}
				defer f.Close()
				body = f
			}
			req, err := http.NewRequest(http.MethodPost, c.base+"/images?ref="+url.QueryEscape(ref), body)
			if err != nil {
				return err
			}
			req.Header.Set("X-API-Key", c.key)
			req.Header.Set("Content-Type", "application/x-tar")
			resp, err := c.http.Do(req)
			if err != nil {
				return fmt.Errorf("%w (is `cubicle serve` running at %s?)", err, c.base)
			}
			defer resp.Body.Close()
			var out map[string]any
			b, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != http.StatusCreated {
				return fmt.Errorf("%s: %s", resp.Status, b)
			}
			json.Unmarshal(b, &out)
			fmt.Fprintln(cmd.OutOrStdout(), out["ref"])
			return nil
		},
	}
	list := &cobra.Command{
		Use:   "list",
		Short: "List images in the local store",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := newAPIClient()
			if err != nil {
				return err
			}
			var out []map[string]any
			if err := c.do(http.MethodGet, "/images", nil, &out); err != nil {
				return err
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "REF\tDIGEST\tSIZE")
			for _, e := range out {
				fmt.Fprintf(tw, "%v\t%v\t%v\n", e["Ref"], e["Digest"], e["Size"])
			}
			return tw.Flush()
		},
	}
	del := &cobra.Command{
		Use:   "delete REF",
		Short: "Remove an image name from the local store",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := newAPIClient()
			if err != nil {
				return err
			}
			return c.do(http.MethodDelete, "/images?ref="+url.QueryEscape(args[0]), nil, nil)
		},
	}
	cmd.AddCommand(imp, list, del)
	return cmd
}
