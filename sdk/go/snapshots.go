package cubicle

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// Snapshot kinds.
const (
	// SnapshotKindMemory (runsc) holds memory and the filesystem: sandboxes
	// made from it continue where the source was.
	SnapshotKindMemory = "memory"
	// SnapshotKindFilesystem (runc) holds the root filesystem only:
	// sandboxes made from it boot fresh with the source's files.
	SnapshotKindFilesystem = "filesystem"
)

// SnapshotInfo describes a snapshot. A snapshot is a template: its ID (or
// one of its names) is a CreateOptions.Template.
//
// A missing snapshot is an ErrNotFound whose *APIError has ErrorCode
// "snapshot_not_found".
type SnapshotInfo struct {
	ID        string   `json:"snapshotID"`
	Names     []string `json:"names"`
	SandboxID string   `json:"sandboxID"`
	// Kind is SnapshotKindMemory or SnapshotKindFilesystem.
	Kind      string    `json:"kind"`
	SizeBytes int64     `json:"sizeBytes"`
	CreatedAt time.Time `json:"createdAt"`
	// TemplateID is the template the source sandbox came from.
	TemplateID string `json:"templateID"`
}

// SnapshotOptions configures CreateSnapshot.
type SnapshotOptions struct {
	// Name is an extra name for the snapshot (template name rules:
	// ^[a-z0-9][a-z0-9._-]{0,127}$); it must not be taken by a template or
	// snapshot of the team (ErrConflict).
	Name string
}

// CreateSnapshot snapshots a running or paused sandbox, which keeps running
// unchanged. GPU sandboxes are an ErrConflict.
func (c *Client) CreateSnapshot(ctx context.Context, sandboxID string, o *SnapshotOptions) (*SnapshotInfo, error) {
	body := map[string]any{}
	if o != nil && o.Name != "" {
		body["name"] = o.Name
	}
	var info SnapshotInfo
	if _, err := c.do(ctx, request{method: http.MethodPost, path: "/sandboxes/" + seg(sandboxID) + "/snapshots", body: body, out: &info, res: resSandbox}); err != nil {
		return nil, err
	}
	return &info, nil
}

// ListSnapshotsOptions filters ListSnapshots. Zero values mean "any".
type ListSnapshotsOptions struct {
	// SandboxID keeps the snapshots taken of this sandbox.
	SandboxID string
	// Name keeps the snapshots with this name.
	Name string
	// Limit is the page size (1..100, default 100).
	Limit int
	// NextToken is the previous page's SnapshotPage.NextToken.
	NextToken string
}

// SnapshotPage is one page of ListSnapshots, newest first.
type SnapshotPage struct {
	Snapshots []SnapshotInfo
	// NextToken fetches the next page; "" on the last one.
	NextToken string
}

// ListSnapshots returns one page of the team's snapshots (the server's
// X-Next-Token is the cursor).
func (c *Client) ListSnapshots(ctx context.Context, o *ListSnapshotsOptions) (*SnapshotPage, error) {
	q := url.Values{}
	if o != nil {
		if o.SandboxID != "" {
			q.Set("sandboxID", o.SandboxID)
		}
		if o.Name != "" {
			q.Set("name", o.Name)
		}
		if o.Limit < 0 {
			return nil, fmt.Errorf("%w: negative limit", ErrInvalidArgument)
		}
		if o.Limit > 0 {
			q.Set("limit", strconv.Itoa(o.Limit))
		}
		if o.NextToken != "" {
			q.Set("nextToken", o.NextToken)
		}
	}
	p := &SnapshotPage{}
	resp, err := c.do(ctx, request{method: http.MethodGet, path: "/snapshots", query: q, out: &p.Snapshots})
	if err != nil {
		return nil, err
	}
	if p.Snapshots == nil {
		p.Snapshots = []SnapshotInfo{}
	}
	if len(p.Snapshots) > 0 {
		p.NextToken = resp.header.Get("X-Next-Token")
	}
	return p, nil
}

// GetSnapshot returns a snapshot by ID or name.
func (c *Client) GetSnapshot(ctx context.Context, snapshotID string) (*SnapshotInfo, error) {
	var info SnapshotInfo
	if _, err := c.do(ctx, request{method: http.MethodGet, path: "/snapshots/" + seg(snapshotID), out: &info, res: resSnapshot}); err != nil {
		return nil, err
	}
	return &info, nil
}

// DeleteSnapshot deletes a snapshot (through DELETE /templates/{id}, as the
// e2b SDKs do). It reports false (and no error) when there was none.
// Sandboxes made from it are not affected.
func (c *Client) DeleteSnapshot(ctx context.Context, snapshotID string) (bool, error) {
	_, err := c.do(ctx, request{method: http.MethodDelete, path: "/templates/" + seg(snapshotID), res: resSnapshot})
	return existed(err)
}

// ForkOptions configures Fork.
type ForkOptions struct {
	// Count is how many forks to make (1..100; 0 means 1).
	Count int
	// Timeout is each fork's lifetime (0: the server's default, 15 s).
	Timeout time.Duration
}

// ForkResult is one requested fork: Sandbox, connected as Create returns
// it, or Err, typed like any API error (errors.Is against the sentinels,
// errors.As to *APIError).
type ForkResult struct {
	Sandbox *Sandbox
	Err     error
}

// forkEntry is one element of the fork answer.
type forkEntry struct {
	Sandbox *sandboxJSON `json:"sandbox"`
	Error   *struct {
		Code      int    `json:"code"`
		Message   string `json:"message"`
		ErrorCode string `json:"error_code"`
	} `json:"error"`
}

// Fork makes copies of the sandbox from one internal snapshot (memory
// snapshots: they continue where the source is). A request the server
// refuses as a whole (unknown sandbox, GPU sandbox, bad count) is the
// error; otherwise there is one result per requested fork, each either a
// sandbox or its own error.
func (s *Sandbox) Fork(ctx context.Context, o *ForkOptions) ([]ForkResult, error) {
	return s.c.Fork(ctx, s.ID, o)
}

// Fork is Sandbox.Fork by sandbox ID.
func (c *Client) Fork(ctx context.Context, sandboxID string, o *ForkOptions) ([]ForkResult, error) {
	body := map[string]any{}
	if o != nil {
		if o.Count < 0 {
			return nil, fmt.Errorf("%w: negative count", ErrInvalidArgument)
		}
		if o.Count > 0 {
			body["count"] = o.Count
		}
		if o.Timeout < 0 {
			return nil, fmt.Errorf("%w: negative timeout", ErrInvalidArgument)
		}
		if o.Timeout > 0 {
			body["timeout"] = int64((o.Timeout + time.Second - 1) / time.Second)
		}
	}
	path := "/sandboxes/" + seg(sandboxID) + "/fork"
	var entries []forkEntry
	if _, err := c.do(ctx, request{method: http.MethodPost, path: path, body: body, out: &entries, res: resSandbox}); err != nil {
		return nil, err
	}
	out := make([]ForkResult, len(entries))
	for i, e := range entries {
		switch {
		case e.Error != nil:
			ae := &APIError{StatusCode: e.Error.Code, Code: e.Error.Code, ErrorCode: e.Error.ErrorCode, Message: e.Error.Message,
				Method: http.MethodPost, Path: path, res: resSandbox}
			if ae.Message == "" {
				ae.Message = http.StatusText(ae.Code)
			}
			out[i].Err = ae
		case e.Sandbox != nil && e.Sandbox.SandboxID != "":
			out[i].Sandbox = c.sandboxFrom(*e.Sandbox)
		default:
			out[i].Err = fmt.Errorf("POST %s: fork %d: answer has neither a sandbox nor an error", path, i)
		}
	}
	return out, nil
}

// Clone snapshots the sandbox and creates n sandboxes from the snapshot,
// all or nothing: when one create fails, the ones made are killed, the
// snapshot is deleted and the first failure is returned. On success the
// snapshot is kept (ListSnapshots with SandboxID finds it).
func (s *Sandbox) Clone(ctx context.Context, n int) ([]*Sandbox, error) {
	if n <= 0 {
		return nil, fmt.Errorf("%w: clone count must be positive", ErrInvalidArgument)
	}
	snap, err := s.c.CreateSnapshot(ctx, s.ID, nil)
	if err != nil {
		return nil, err
	}
	const parallel = 8
	out := make([]*Sandbox, n)
	errs := make([]error, n)
	// After a failure no new create starts; those in flight finish (a
	// cancelled request could leave a sandbox nobody knows to kill).
	var failed atomic.Bool
	sem := make(chan struct{}, parallel)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			if failed.Load() {
				return
			}
			sb, err := s.c.Create(ctx, CreateOptions{Template: snap.ID})
			if err != nil {
				errs[i] = err
				failed.Store(true)
				return
			}
			out[i] = sb
		}()
	}
	wg.Wait()
	var first error
	for i, err := range errs {
		if err != nil {
			first = fmt.Errorf("clone %d of %d: %w", i+1, n, err)
			break
		}
	}
	if first == nil {
		return out, nil
	}
	// Clean up even when ctx is what failed.
	bg, stop := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
	defer stop()
	cleanup := []error{first}
	left := 0
	for _, sb := range out {
		if sb == nil {
			continue
		}
		if _, err := sb.Kill(bg); err != nil {
			left++
			cleanup = append(cleanup, fmt.Errorf("kill clone %s: %w", sb.ID, err))
		}
	}
	if left == 0 {
		if _, err := s.c.DeleteSnapshot(bg, snap.ID); err != nil {
			cleanup = append(cleanup, fmt.Errorf("delete snapshot %s: %w", snap.ID, err))
		}
	}
	return nil, errors.Join(cleanup...)
}

// Snapshot snapshots the sandbox (see Client.CreateSnapshot).
func (s *Sandbox) Snapshot(ctx context.Context, o *SnapshotOptions) (*SnapshotInfo, error) {
	return s.c.CreateSnapshot(ctx, s.ID, o)
}

// Rollback returns the sandbox to a snapshot (ID or name) in place: its
// ID, access token and volumes stay, so this handle keeps working. A
// filesystem snapshot reboots the sandbox (its processes restart).
func (s *Sandbox) Rollback(ctx context.Context, snapshotID string) error {
	return s.c.Rollback(ctx, s.ID, snapshotID)
}

// Rollback is Sandbox.Rollback by sandbox ID.
func (c *Client) Rollback(ctx context.Context, sandboxID, snapshotID string) error {
	if snapshotID == "" {
		return fmt.Errorf("%w: snapshot ID is required", ErrInvalidArgument)
	}
	// resNone: a 404 may be the sandbox or the snapshot; the server's
	// error_code tells them apart (ErrSandboxNotFound, "snapshot_not_found").
	_, err := c.do(ctx, request{method: http.MethodPost, path: "/sandboxes/" + seg(sandboxID) + "/rollback",
		body: map[string]string{"snapshotID": snapshotID}})
	return err
}

// PauseOptions configures PauseWith.
type PauseOptions struct {
	// KeepMemory false stops every process and keeps only the files; the
	// next Connect reboots the sandbox (its start command reruns). nil or
	// true is Pause (memory kept).
	KeepMemory *bool
}

// PauseWith is Pause with options; false (no error) when the sandbox was
// already paused.
func (c *Client) PauseWith(ctx context.Context, sandboxID string, o PauseOptions) (bool, error) {
	body := map[string]any{}
	if o.KeepMemory != nil {
		body["memory"] = *o.KeepMemory
	}
	_, err := c.do(ctx, request{method: http.MethodPost, path: "/sandboxes/" + seg(sandboxID) + "/pause", body: body, res: resSandbox})
	if err == nil {
		return true, nil
	}
	if isStatus(err, http.StatusConflict) {
		if info, gerr := c.Get(ctx, sandboxID); gerr == nil && info.State == "paused" {
			return false, nil
		}
	}
	return false, err
}

// PauseWith pauses the sandbox with options (see Client.PauseWith).
func (s *Sandbox) PauseWith(ctx context.Context, o PauseOptions) (bool, error) {
	return s.c.PauseWith(ctx, s.ID, o)
}

// ConnectOptions configures ConnectWith.
type ConnectOptions struct {
	// Timeout extends the lifetime to at least now+Timeout (0: server default).
	Timeout time.Duration
	// Reboot discards a paused sandbox's memory and boots it with its files
	// (e2b's onResume: 'reboot'); the start command reruns.
	Reboot bool
}

// ConnectWith is Connect with options.
func (c *Client) ConnectWith(ctx context.Context, sandboxID string, o ConnectOptions) (*Sandbox, error) {
	body := map[string]any{}
	if o.Timeout < 0 {
		return nil, fmt.Errorf("%w: negative timeout", ErrInvalidArgument)
	}
	if o.Timeout > 0 {
		body["timeout"] = int64((o.Timeout + time.Second - 1) / time.Second)
	}
	if o.Reboot {
		body["memory"] = false
	}
	var j sandboxJSON
	if _, err := c.do(ctx, request{method: http.MethodPost, path: "/v2/sandboxes/" + seg(sandboxID) + "/connect", body: body, out: &j, res: resSandbox}); err != nil {
		return nil, err
	}
	return c.sandboxFrom(j), nil
}
