package main

import (
	"fmt"
	"io"
	"os"
	"text/tabwriter"

	"github.com/spf13/cobra"

	cubicle "github.com/cubicle-dev/cubicle/sdk/go"

	"github.com/cubicle-dev/cubicle/internal/image"
)

func imageCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "image", Short: "Manage the local OCI image store templates build FROM (no registry needed)"}
	var asJSON bool
	cmd.PersistentFlags().BoolVar(&asJSON, "json", false, "print JSON")
	imp := &cobra.Command{
		Use:   "import REF PATH",
		Short: "Import a root filesystem dir or tar(.gz), an OCI layout (dir or tar) or a docker-save tar as REF",
		Long: `Import an image into the server's local store, e.g.

  cubicle image import python:3.13 ./python-rootfs.tar.gz
  cubicle image import cubicle/tools ./oci-layout-dir

Templates then use it with fromImage (Template().fromImage('python:3.13')).`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := newClient()
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
			out, err := c.ImportImage(cmd.Context(), ref, body)
			if err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), out)
			return nil
		},
	}
	list := &cobra.Command{
		Use:   "list",
		Short: "List images in the local store",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := newClient()
			if err != nil {
				return err
			}
			out, err := c.ListImages(cmd.Context())
			if err != nil {
				return err
			}
			if asJSON {
				if out == nil {
					out = []cubicle.Image{}
				}
				return printJSON(cmd.OutOrStdout(), out)
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "REF\tDIGEST\tSIZE")
			for _, e := range out {
				fmt.Fprintf(tw, "%s\t%s\t%s\n", e.Ref, e.Digest, humanBytes(e.Size))
			}
			return tw.Flush()
		},
	}
	del := &cobra.Command{
		Use:   "delete REF",
		Short: "Remove an image name from the local store",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := newClient()
			if err != nil {
				return err
			}
			return c.DeleteImage(cmd.Context(), args[0])
		},
	}
	cmd.AddCommand(imp, list, del)
	return cmd
}
