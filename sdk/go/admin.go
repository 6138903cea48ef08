package cubicle

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"time"
)

// Node is one node of the cluster and its accelerator counts by state.
type Node struct {
	NodeID       string         `json:"nodeID"`
	Accelerators map[string]int `json:"accelerators"`
}

// Accelerator is one device in a node's inventory.
type Accelerator struct {
	ID            string            `json:"id"` // "<class>-<pci address>"
	Class         string            `json:"class"`
	Vendor        string            `json:"vendor"`
	VendorID      string            `json:"vendorID"`
	DeviceID      string            `json:"deviceID"`
	Model         string            `json:"model,omitempty"`
	MemoryMB      int64             `json:"memoryMB,omitempty"`
	Labels        map[string]string `json:"labels,omitempty"`
	Allocation    string            `json:"allocation"`
	Backend       string            `json:"backend"`
	Health        string            `json:"health"`
	NUMANode      int               `json:"numaNode"`
	PCIAddress    string            `json:"pciAddress"`
	IOMMUGroup    string            `json:"iommuGroup,omitempty"`
	Driver        string            `json:"driver,omitempty"`
	DriverVersion string            `json:"driverVersion,omitempty"`
	CUDAVersion   string            `json:"cudaVersion,omitempty"`
	UUID          string            `json:"uuid,omitempty"`
	// State is one of initialized, allocatable, reserved, preparing,
	// attached, releasing, released, unhealthy, quarantined, disabled.
	State     string    `json:"state"`
	Reason    string    `json:"reason,omitempty"`
	SandboxID string    `json:"sandboxID,omitempty"`
	Since     time.Time `json:"since"`
}

// AcceleratorEvent is one audit event (reserve, attach, release,
// quarantine, deny, ...).
type AcceleratorEvent struct {
	Time    time.Time `json:"time"`
	Type    string    `json:"type"`
	Device  string    `json:"device,omitempty"`
	Sandbox string    `json:"sandbox,omitempty"`
	From    string    `json:"from,omitempty"`
	To      string    `json:"to,omitempty"`
	Reason  string    `json:"reason,omitempty"`
}

// ListNodes lists the cluster's nodes.
func (c *Client) ListNodes(ctx context.Context) ([]Node, error) {
	var ns []Node
	_, err := c.do(ctx, request{method: http.MethodGet, path: "/nodes", out: &ns})
	return ns, err
}

func accelPath(node string) string { return "/nodes/" + seg(node) + "/accelerators" }

// ListAccelerators lists a node's accelerators with their states.
func (c *Client) ListAccelerators(ctx context.Context, node string) ([]Accelerator, error) {
	var ds []Accelerator
	_, err := c.do(ctx, request{method: http.MethodGet, path: accelPath(node), out: &ds})
	return ds, err
}

// AcceleratorEvents returns a node's newest audit events (limit ≤ 0: the
// server's default), oldest first.
func (c *Client) AcceleratorEvents(ctx context.Context, node string, limit int) ([]AcceleratorEvent, error) {
	var q url.Values
	if limit > 0 {
		q = url.Values{"limit": {strconv.Itoa(limit)}}
	}
	var es []AcceleratorEvent
	_, err := c.do(ctx, request{method: http.MethodGet, path: accelPath(node) + "/events", query: q, out: &es})
	return es, err
}

// Accelerator admin actions.
const (
	AcceleratorDisable = "disable"
	AcceleratorEnable  = "enable"
	AcceleratorRecover = "recover"
)

// AcceleratorAction disables, enables or recovers a device; ErrConflict
// when its state forbids it (disabling a device a sandbox holds).
func (c *Client) AcceleratorAction(ctx context.Context, node, device, action, reason string) (*Accelerator, error) {
	switch action {
	case AcceleratorDisable, AcceleratorEnable, AcceleratorRecover:
	default:
		return nil, fmt.Errorf("%w: unknown accelerator action %q", ErrInvalidArgument, action)
	}
	var d Accelerator
	_, err := c.do(ctx, request{method: http.MethodPost, path: accelPath(node) + "/" + seg(device) + "/" + action,
		body: map[string]string{"reason": reason}, out: &d})
	return &d, err
}

// Image is one entry of the server's local OCI image store.
type Image struct {
	Ref       string `json:"Ref"`
	Digest    string `json:"Digest"`
	MediaType string `json:"MediaType"`
	Size      int64  `json:"Size"`
}

// ImportImage stores a root filesystem tar(.gz), OCI layout tar or
// docker-save tar under ref, streamed from r; it returns the stored ref.
func (c *Client) ImportImage(ctx context.Context, ref string, r io.Reader) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.api.String()+"/images?"+url.Values{"ref": {ref}}.Encode(), r)
	if err != nil {
		return "", fmt.Errorf("%w: %v", ErrInvalidArgument, err)
	}
	c.apiHeaders(req.Header)
	req.Header.Set("Content-Type", "application/x-tar")
	resp, err := c.http.Do(req) // a stream: not retried
	if err != nil {
		if ctx.Err() != nil {
			return "", ctx.Err()
		}
		return "", err
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return "", apiErrorFrom(resp, http.MethodPost, "/images", resNone)
	}
	var out struct {
		Ref string `json:"ref"`
	}
	if err := decodeBody(resp.Body, &out); err != nil {
		return "", err
	}
	return out.Ref, nil
}

// ListImages lists the local image store.
func (c *Client) ListImages(ctx context.Context) ([]Image, error) {
	var is []Image
	_, err := c.do(ctx, request{method: http.MethodGet, path: "/images", out: &is})
	return is, err
}

// DeleteImage removes an image name from the local store.
func (c *Client) DeleteImage(ctx context.Context, ref string) error {
	_, err := c.do(ctx, request{method: http.MethodDelete, path: "/images", query: url.Values{"ref": {ref}}})
	return err
}
