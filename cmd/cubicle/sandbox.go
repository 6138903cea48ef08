package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
)

// apiClient is the small REST client the CLI uses until the Go SDK lands.
type apiClient struct {
	base, key string
	http      *http.Client
}

func envFirst(names ...string) string {
	for _, n := range names {
		if v := os.Getenv(n); v != "" {
			return v
		}
	}
	return ""
}

func newAPIClient() (*apiClient, error) {
	base := envFirst("CUBICLE_API_URL", "E2B_API_URL", "CUBE_API_URL")
	if base == "" {
		base = "http://127.0.0.1:3000"
	}
	key := envFirst("CUBICLE_API_KEY", "E2B_API_KEY", "CUBE_API_KEY")
	if key == "" {
		return nil, fmt.Errorf("no API key: set CUBICLE_API_KEY (create one with `cubicle apikey create`)")
	}
	return &apiClient{base: strings.TrimRight(base, "/"), key: key, http: &http.Client{Timeout: 5 * time.Minute}}, nil
}

func (c *apiClient) do(method, path string, in, out any) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, c.base+path, body)
	if err != nil {
		return err
	}
	req.Header.Set("X-API-Key", c.key)
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return fmt.Errorf("%w (is `cubicle serve` running at %s?)", err, c.base)
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		var e struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
		}
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
		if json.Unmarshal(b, &e) == nil && e.Message != "" {
			return fmt.Errorf("%d: %s", resp.StatusCode, e.Message)
		}
		return fmt.Errorf("%s: %s", resp.Status, b)
	}
	if out != nil {
		return json.NewDecoder(resp.Body).Decode(out)
	}
	return nil
}

func sandboxCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "sandbox", Aliases: []string{"sb"}, Short: "Manage sandboxes through the API (CUBICLE_API_URL, CUBICLE_API_KEY)"}
	var asJSON bool
	cmd.PersistentFlags().BoolVar(&asJSON, "json", false, "print JSON")
	var tpl string
	var timeout int
	var vols []string
	var accelSpec string
	create := &cobra.Command{
		Use:   "create",
		Short: "Create a sandbox",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := newAPIClient()
			if err != nil {
				return err
			}
			body := map[string]any{"templateID": tpl, "timeout": timeout}
			if len(vols) > 0 {
				mounts, err := parseVolumeFlags(vols)
				if err != nil {
					return err
				}
				body["volumeMounts"] = mounts
			}
			if accelSpec != "" {
				req, err := parseAccelFlag(accelSpec)
				if err != nil {
					return err
				}
				body["accelerators"] = []any{req}
			}
			var out map[string]any
			if err := c.do(http.MethodPost, "/v2/sandboxes", body, &out); err != nil {
				return err
			}
			if asJSON {
				return json.NewEncoder(cmd.OutOrStdout()).Encode(out)
			}
			fmt.Fprintln(cmd.OutOrStdout(), out["sandboxID"])
			return nil
		},
	}
	create.Flags().StringVarP(&tpl, "template", "t", "base", "template ID or alias")
	create.Flags().IntVar(&timeout, "timeout", 300, "timeout in seconds")
	create.Flags().StringArrayVarP(&vols, "volume", "v", nil, "mount a volume: NAME:/path[:ro] (repeatable)")
	create.Flags().StringVar(&accelSpec, "accelerator", "", "request accelerators: class=gpu,count=1,vendor=nvidia,backend=passthrough,min-memory-mb=N,label.KEY=VALUE")
	list := &cobra.Command{
		Use:   "list",
		Short: "List running and paused sandboxes",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := newAPIClient()
			if err != nil {
				return err
			}
			var out []map[string]any
			if err := c.do(http.MethodGet, "/v2/sandboxes?limit=100", nil, &out); err != nil {
				return err
			}
			if asJSON {
				return json.NewEncoder(cmd.OutOrStdout()).Encode(out)
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tTEMPLATE\tSTATE\tSTARTED\tEXPIRES")
			for _, s := range out {
				fmt.Fprintf(tw, "%v\t%v\t%v\t%v\t%v\n", s["sandboxID"], s["templateID"], s["state"], s["startedAt"], s["endAt"])
			}
			return tw.Flush()
		},
	}
	kill := &cobra.Command{
		Use:   "kill ID...",
		Short: "Kill sandboxes",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := newAPIClient()
			if err != nil {
				return err
			}
			for _, id := range args {
				if err := c.do(http.MethodDelete, "/sandboxes/"+id, nil, nil); err != nil {
					return fmt.Errorf("kill %s: %w", id, err)
				}
			}
			return nil
		},
	}
	pause := &cobra.Command{
		Use:   "pause ID",
		Short: "Pause a sandbox",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := newAPIClient()
			if err != nil {
				return err
			}
			return c.do(http.MethodPost, "/sandboxes/"+args[0]+"/pause", map[string]any{}, nil)
		},
	}
	resume := &cobra.Command{
		Use:   "resume ID",
		Short: "Resume (connect to) a paused sandbox",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := newAPIClient()
			if err != nil {
				return err
			}
			return c.do(http.MethodPost, "/v2/sandboxes/"+args[0]+"/connect", map[string]any{}, nil)
		},
	}
	cmd.AddCommand(create, list, kill, pause, resume)
	return cmd
}
