package main

import (
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	cubicle "github.com/cubicle-dev/cubicle/sdk/go"
)

// remotePath splits SANDBOX:/path; ok is false for a local path.
func remotePath(s string) (id, p string, ok bool) {
	id, p, ok = strings.Cut(s, ":")
	if !ok || id == "" || strings.ContainsAny(id, "/\\.") {
		return "", "", false
	}
	return id, p, true
}

func filesCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "files", Aliases: []string{"fs"}, Short: "Copy and list files in sandboxes (SANDBOX:/path)"}
	var user string
	var progress bool
	cp := &cobra.Command{
		Use:   "cp SRC DST",
		Short: "Copy a file into or out of a sandbox (one side is SANDBOX:/path; - is stdin/stdout)",
		Example: `  cubicle files cp ./data.csv $ID:/home/user/data.csv
  cubicle files cp $ID:/var/log/app.log ./app.log
  cubicle files cp $ID:/etc/os-release -`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			srcID, srcPath, srcRemote := remotePath(args[0])
			dstID, dstPath, dstRemote := remotePath(args[1])
			if srcRemote == dstRemote {
				return fmt.Errorf("exactly one of SRC and DST must be SANDBOX:/path (got %q, %q)", args[0], args[1])
			}
			c, err := newClient()
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			errOut := cmd.ErrOrStderr()
			live := progress || isTerminal(errOut)
			if dstRemote {
				sb, err := c.Attach(ctx, dstID)
				if err != nil {
					return err
				}
				var r io.Reader = cmd.InOrStdin()
				var total int64 = -1
				label := "stdin"
				if args[0] != "-" {
					f, err := os.Open(args[0])
					if err != nil {
						return err
					}
					defer f.Close()
					fi, err := f.Stat()
					if err != nil {
						return err
					}
					if fi.IsDir() {
						return fmt.Errorf("%s is a directory; cp copies one file", args[0])
					}
					r, total, label = f, fi.Size(), filepath.Base(args[0])
					if strings.HasSuffix(dstPath, "/") {
						dstPath += filepath.Base(args[0])
					}
				}
				bar := &progressBar{w: errOut, label: "Uploading " + label, live: live}
				cr := &countReader{r: r, fn: func(n int64) { bar.update(n, total) }}
				ent, err := sb.Files().Write(ctx, dstPath, cr, &cubicle.FileOptions{User: user})
				if err != nil {
					return err
				}
				bar.finish(cr.n, max(total, cr.n))
				fmt.Fprintf(cmd.OutOrStdout(), "%s:%s (%s)\n", dstID, ent.Path, humanBytes(cr.n))
				return nil
			}
			sb, err := c.Attach(ctx, srcID)
			if err != nil {
				return err
			}
			var total int64 = -1
			if st, err := sb.Files().Stat(ctx, srcPath, &cubicle.FileOptions{User: user}); err == nil {
				if st.Type == cubicle.TypeDir {
					return fmt.Errorf("%s:%s is a directory; cp copies one file", srcID, srcPath)
				}
				total = st.Size
			}
			rc, err := sb.Files().Read(ctx, srcPath, &cubicle.FileOptions{User: user})
			if err != nil {
				return err
			}
			defer rc.Close()
			var w io.Writer = cmd.OutOrStdout()
			dst := args[1]
			if dst != "-" {
				if fi, err := os.Stat(dst); err == nil && fi.IsDir() {
					dst = filepath.Join(dst, path.Base(srcPath))
				}
				f, err := os.Create(dst)
				if err != nil {
					return err
				}
				defer f.Close()
				w = f
			} else {
				live = progress // never draw over data on stdout unless asked
			}
			bar := &progressBar{w: errOut, label: "Downloading " + path.Base(srcPath), live: live}
			n, err := io.Copy(w, &countReader{r: rc, fn: func(n int64) { bar.update(n, total) }})
			if err != nil {
				return err
			}
			bar.finish(n, max(total, n))
			if dst != "-" {
				if f, ok := w.(*os.File); ok {
					if err := f.Close(); err != nil {
						return err
					}
				}
				fmt.Fprintf(cmd.OutOrStdout(), "%s (%s)\n", dst, humanBytes(n))
			}
			return nil
		},
	}
	cp.Flags().StringVar(&user, "user", "", "act as this user in the sandbox")
	cp.Flags().BoolVar(&progress, "progress", false, "draw the progress bar even when stderr is not a terminal")

	var depth int
	var asJSON bool
	ls := &cobra.Command{
		Use:   "ls SANDBOX:/dir",
		Short: "List a directory in a sandbox",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, p, ok := remotePath(args[0])
			if !ok {
				return fmt.Errorf("want SANDBOX:/dir, got %q", args[0])
			}
			c, err := newClient()
			if err != nil {
				return err
			}
			sb, err := c.Attach(cmd.Context(), id)
			if err != nil {
				return err
			}
			ents, err := sb.Files().List(cmd.Context(), p, depth, &cubicle.FileOptions{User: user})
			if err != nil {
				return err
			}
			if asJSON {
				if ents == nil {
					ents = []cubicle.EntryInfo{}
				}
				return printJSON(cmd.OutOrStdout(), ents)
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			for _, e := range ents {
				name := e.Path
				if e.Type == cubicle.TypeSymlink && e.SymlinkTarget != "" {
					name += " -> " + e.SymlinkTarget
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\n", e.Permissions, e.Owner, e.Group, e.Size, tplTime(e.ModifiedTime), name)
			}
			return tw.Flush()
		},
	}
	ls.Flags().IntVar(&depth, "depth", 1, "levels to descend")
	ls.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	ls.Flags().StringVar(&user, "user", "", "act as this user in the sandbox")
	cmd.AddCommand(cp, ls)
	return cmd
}
