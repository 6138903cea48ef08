package cubicle

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"time"
)

// Volume is a persistent volume. Token authorises the volume-content API
// (file operations without a sandbox).
type Volume struct {
	VolumeID string `json:"volumeID"`
	Name     string `json:"name"`
	Token    string `json:"token,omitempty"`
	Driver   string `json:"driver,omitempty"`
	// Size in bytes (0: the volume has none: its driver does not enforce
	// sizes, or it predates them). Writes past it fail with ENOSPC.
	Size int64 `json:"size,omitempty"`
	// Detail fields (GetVolume only).
	State       string             `json:"state,omitempty"`
	CreatedAt   time.Time          `json:"createdAt,omitzero"`
	Attachments []VolumeAttachment `json:"attachments,omitempty"`

	c *Client
}

// VolumeAttachment is a sandbox that has the volume mounted.
type VolumeAttachment struct {
	SandboxID string `json:"sandboxID"`
	Path      string `json:"path"`
	ReadOnly  bool   `json:"readOnly"`
}

// CreateVolumeOptions configures CreateVolume.
type CreateVolumeOptions struct {
	// Driver picks the volume plugin (default: the server's first).
	Driver string
	// Size in bytes, a whole number of MiB (0: the server default).
	Size int64
}

// CreateVolume creates a volume named name (letters, digits, '_' and '-');
// "" lets the server generate one.
func (c *Client) CreateVolume(ctx context.Context, name string, o *CreateVolumeOptions) (*Volume, error) {
	body := map[string]any{}
	if name != "" {
		body["name"] = name
	}
	if o != nil && o.Driver != "" {
		body["driver"] = o.Driver
	}
	if o != nil && o.Size != 0 {
		body["size"] = o.Size
	}
	v := &Volume{c: c}
	// resNone: a 409 here is a taken name, not a volume in use.
	if _, err := c.do(ctx, request{method: http.MethodPost, path: "/volumes", body: body, out: v}); err != nil {
		return nil, err
	}
	return v, nil
}

// ListVolumes lists every volume (without tokens).
func (c *Client) ListVolumes(ctx context.Context) ([]Volume, error) {
	var vs []Volume
	if _, err := c.do(ctx, request{method: http.MethodGet, path: "/volumes", out: &vs, res: resVolume}); err != nil {
		return nil, err
	}
	for i := range vs {
		vs[i].c = c
	}
	return vs, nil
}

// GetVolume returns a volume by ID or name, with its token and attachments.
func (c *Client) GetVolume(ctx context.Context, idOrName string) (*Volume, error) {
	v := &Volume{c: c}
	if _, err := c.do(ctx, request{method: http.MethodGet, path: "/volumes/" + seg(idOrName), out: v, res: resVolume}); err != nil {
		return nil, err
	}
	return v, nil
}

// DeleteVolume deletes a volume: ErrVolumeNotFound when there is none,
// ErrVolumeInUse while a sandbox has it mounted.
func (c *Client) DeleteVolume(ctx context.Context, idOrName string) error {
	_, err := c.do(ctx, request{method: http.MethodDelete, path: "/volumes/" + seg(idOrName), res: resVolume})
	return err
}

// VolumeEntry is a file or directory in a volume.
type VolumeEntry struct {
	Name   string    `json:"name"`
	Type   string    `json:"type"` // file, directory, symlink
	Path   string    `json:"path"`
	Size   int64     `json:"size"`
	Mode   uint32    `json:"mode"` // permission bits (0o7777)
	UID    int       `json:"uid"`
	GID    int       `json:"gid"`
	Atime  time.Time `json:"atime"`
	Mtime  time.Time `json:"mtime"`
	Ctime  time.Time `json:"ctime"`
	Target string    `json:"target,omitempty"`
}

// VolumeWriteOptions sets ownership and mode of what is written.
type VolumeWriteOptions struct {
	UID, GID *int
	Mode     *uint32 // permission bits, e.g. 0o640
	// Force creates missing parents (mkdir -p) or overwrites.
	Force bool
}

func (v *Volume) contentBase() string {
	if v.c.cfg.VolumeAPIURL != "" {
		return v.c.cfg.VolumeAPIURL
	}
	return v.c.api.String()
}

// content is one volume-content call (Bearer token, no API key).
func (v *Volume) content(ctx context.Context, method, kind, path string, q url.Values, body io.Reader, ctype string) (*http.Response, error) {
	if v.Token == "" {
		return nil, fmt.Errorf("%w: volume %s has no token (get it with GetVolume)", ErrInvalidArgument, v.VolumeID)
	}
	if q == nil {
		q = url.Values{}
	}
	q.Set("path", path)
	req, err := http.NewRequestWithContext(ctx, method, v.contentBase()+"/volumecontent/"+seg(v.VolumeID)+"/"+kind+"?"+q.Encode(), body)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalidArgument, err)
	}
	req.Header.Set("Authorization", "Bearer "+v.Token)
	req.Header.Set("User-Agent", v.c.ua)
	if ctype != "" {
		req.Header.Set("Content-Type", ctype)
	}
	resp, err := v.c.http.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, err
	}
	if resp.StatusCode/100 != 2 {
		defer resp.Body.Close()
		return nil, apiErrorFrom(resp, method, "/volumecontent/"+v.VolumeID+"/"+kind+"?path="+path, resFile)
	}
	return resp, nil
}

func decodeClose(resp *http.Response, out any) error {
	defer resp.Body.Close()
	return decodeBody(resp.Body, out)
}

func decodeBody(r io.Reader, out any) error {
	if err := json.NewDecoder(r).Decode(out); err != nil {
		return fmt.Errorf("decode response: %w", err)
	}
	return nil
}

func writeQuery(o *VolumeWriteOptions) url.Values {
	q := url.Values{}
	if o == nil {
		return q
	}
	if o.UID != nil {
		q.Set("uid", strconv.Itoa(*o.UID))
	}
	if o.GID != nil {
		q.Set("gid", strconv.Itoa(*o.GID))
	}
	if o.Mode != nil {
		q.Set("mode", strconv.FormatUint(uint64(*o.Mode), 10))
	}
	if o.Force {
		q.Set("force", "true")
	}
	return q
}

// ReadFile streams a file of the volume; close it when done.
func (v *Volume) ReadFile(ctx context.Context, path string) (io.ReadCloser, error) {
	resp, err := v.content(ctx, http.MethodGet, "file", path, nil, nil, "")
	if err != nil {
		return nil, err
	}
	return resp.Body, nil
}

// WriteFile streams r into a file of the volume.
func (v *Volume) WriteFile(ctx context.Context, path string, r io.Reader, o *VolumeWriteOptions) (*VolumeEntry, error) {
	resp, err := v.content(ctx, http.MethodPut, "file", path, writeQuery(o), r, "application/octet-stream")
	if err != nil {
		return nil, err
	}
	var e VolumeEntry
	return &e, decodeClose(resp, &e)
}

// Stat describes a path of the volume (ErrFileNotFound when missing).
func (v *Volume) Stat(ctx context.Context, path string) (*VolumeEntry, error) {
	resp, err := v.content(ctx, http.MethodGet, "path", path, nil, nil, "")
	if err != nil {
		return nil, err
	}
	var e VolumeEntry
	return &e, decodeClose(resp, &e)
}

// List lists a directory of the volume, depth levels deep (≤0 means 1).
func (v *Volume) List(ctx context.Context, path string, depth int) ([]VolumeEntry, error) {
	if depth <= 0 {
		depth = 1
	}
	resp, err := v.content(ctx, http.MethodGet, "dir", path, url.Values{"depth": {strconv.Itoa(depth)}}, nil, "")
	if err != nil {
		return nil, err
	}
	var es []VolumeEntry
	return es, decodeClose(resp, &es)
}

// MakeDir creates a directory of the volume (with Force: and its parents).
func (v *Volume) MakeDir(ctx context.Context, path string, o *VolumeWriteOptions) (*VolumeEntry, error) {
	resp, err := v.content(ctx, http.MethodPost, "dir", path, writeQuery(o), nil, "")
	if err != nil {
		return nil, err
	}
	var e VolumeEntry
	return &e, decodeClose(resp, &e)
}

// Remove deletes a path of the volume.
func (v *Volume) Remove(ctx context.Context, path string) error {
	resp, err := v.content(ctx, http.MethodDelete, "path", path, nil, nil, "")
	if err != nil {
		return err
	}
	resp.Body.Close()
	return nil
}
