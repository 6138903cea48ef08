package cubicle

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// call is one request a fake server saw.
type call struct {
	method, uri string
	body        map[string]any
}

// recorder records every request and answers with fn.
type recorder struct {
	mu    sync.Mutex
	calls []call
}

func (rec *recorder) handler(t *testing.T, fn func(w http.ResponseWriter, r *http.Request, body map[string]any)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		raw, _ := io.ReadAll(r.Body)
		var body map[string]any
		if len(raw) > 0 {
			if err := json.Unmarshal(raw, &body); err != nil {
				t.Errorf("%s %s: body %q: %v", r.Method, r.URL, raw, err)
			}
		}
		rec.mu.Lock()
		rec.calls = append(rec.calls, call{r.Method, r.URL.RequestURI(), body})
		rec.mu.Unlock()
		fn(w, r, body)
	}
}

func (rec *recorder) uris() []string {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	var out []string
	for _, c := range rec.calls {
		out = append(out, c.method+" "+c.uri)
	}
	return out
}

func (rec *recorder) last() call { return rec.back(1) }

// back is the nth request from the end (1: the last).
func (rec *recorder) back(n int) call {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	return rec.calls[len(rec.calls)-n]
}

func apiError(w http.ResponseWriter, status int, code, msg string) {
	w.WriteHeader(status)
	b, _ := json.Marshal(map[string]any{"code": status, "message": msg, "error_code": code})
	w.Write(b)
}

const snapJSON = `{"snapshotID":"snap_1","names":["before-upgrade"],"sandboxID":"sb1","kind":"memory","sizeBytes":12345,"createdAt":"2025-03-04T05:06:07Z","templateID":"base"}`

func TestCreateSnapshot(t *testing.T) {
	var rec recorder
	c := testClient(t, rec.handler(t, func(w http.ResponseWriter, r *http.Request, body map[string]any) {
		if r.URL.Path == "/sandboxes/gpu/snapshots" {
			apiError(w, 409, "", "GPU sandboxes cannot be snapshotted")
			return
		}
		if r.URL.Path == "/sandboxes/gone/snapshots" {
			apiError(w, 404, "sandbox_not_found", "sandbox 'gone' not found")
			return
		}
		w.WriteHeader(201)
		fmt.Fprint(w, snapJSON)
	}), nil)
	ctx := context.Background()
	sb := c.sandboxFrom(sandboxJSON{SandboxID: "sb1"})
	info, err := sb.Snapshot(ctx, &SnapshotOptions{Name: "before-upgrade"})
	if err != nil {
		t.Fatal(err)
	}
	want := SnapshotInfo{ID: "snap_1", Names: []string{"before-upgrade"}, SandboxID: "sb1", Kind: SnapshotKindMemory, SizeBytes: 12345,
		CreatedAt: time.Date(2025, 3, 4, 5, 6, 7, 0, time.UTC), TemplateID: "base"}
	if !reflect.DeepEqual(*info, want) {
		t.Fatalf("info %+v", *info)
	}
	if l := rec.last(); l.method != "POST" || l.uri != "/sandboxes/sb1/snapshots" || !reflect.DeepEqual(l.body, map[string]any{"name": "before-upgrade"}) {
		t.Fatalf("request %+v", l)
	}
	if _, err := c.CreateSnapshot(ctx, "sb1", nil); err != nil {
		t.Fatal(err)
	}
	if l := rec.last(); len(l.body) != 0 || l.body == nil {
		t.Fatalf("no name: body %v, want {}", l.body)
	}
	if _, err := c.CreateSnapshot(ctx, "gpu", nil); !errors.Is(err, ErrConflict) || !strings.Contains(err.Error(), "GPU") {
		t.Fatalf("gpu: %v", err)
	}
	if _, err := c.CreateSnapshot(ctx, "gone", nil); !errors.Is(err, ErrSandboxNotFound) {
		t.Fatalf("gone: %v", err)
	}
}

func TestListSnapshotsPages(t *testing.T) {
	var rec recorder
	c := testClient(t, rec.handler(t, func(w http.ResponseWriter, r *http.Request, _ map[string]any) {
		if r.URL.Path != "/snapshots" || r.Method != "GET" {
			apiError(w, 404, "", "no route")
			return
		}
		switch r.URL.Query().Get("nextToken") {
		case "":
			w.Header().Set("X-Next-Token", "tok 2")
			fmt.Fprint(w, "["+snapJSON+"]")
		case "tok 2":
			fmt.Fprint(w, `[{"snapshotID":"snap_0","names":[],"sandboxID":"sb1","kind":"filesystem"}]`)
		default:
			apiError(w, 400, "", "bad token")
		}
	}), nil)
	ctx := context.Background()
	p, err := c.ListSnapshots(ctx, &ListSnapshotsOptions{SandboxID: "sb1", Name: "before-upgrade", Limit: 1})
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Snapshots) != 1 || p.Snapshots[0].ID != "snap_1" || p.NextToken != "tok 2" {
		t.Fatalf("page 1: %+v", p)
	}
	if u := rec.last().uri; u != "/snapshots?limit=1&name=before-upgrade&sandboxID=sb1" {
		t.Fatalf("uri %s", u)
	}
	p, err = c.ListSnapshots(ctx, &ListSnapshotsOptions{SandboxID: "sb1", Limit: 1, NextToken: p.NextToken})
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Snapshots) != 1 || p.Snapshots[0].Kind != SnapshotKindFilesystem || p.NextToken != "" {
		t.Fatalf("page 2: %+v", p)
	}
	if u := rec.last().uri; u != "/snapshots?limit=1&nextToken=tok+2&sandboxID=sb1" {
		t.Fatalf("uri %s", u)
	}
	if _, err := c.ListSnapshots(ctx, nil); err != nil || rec.last().uri != "/snapshots" {
		t.Fatalf("no options: %v %s", err, rec.last().uri)
	}
	if _, err := c.ListSnapshots(ctx, &ListSnapshotsOptions{NextToken: "junk"}); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("bad token: %v", err)
	}
	n := len(rec.uris())
	if _, err := c.ListSnapshots(ctx, &ListSnapshotsOptions{Limit: -1}); !errors.Is(err, ErrInvalidArgument) || len(rec.uris()) != n {
		t.Fatalf("negative limit: %v", err)
	}
}

func TestListSnapshotsEmpty(t *testing.T) {
	c := testClient(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Next-Token", "ignored") // no entries: no next page
		fmt.Fprint(w, `[]`)
	}, nil)
	p, err := c.ListSnapshots(context.Background(), nil)
	if err != nil || p.Snapshots == nil || len(p.Snapshots) != 0 || p.NextToken != "" {
		t.Fatalf("%+v %v", p, err)
	}
}

func TestGetAndDeleteSnapshot(t *testing.T) {
	var rec recorder
	var mu sync.Mutex
	deleted := map[string]bool{}
	c := testClient(t, rec.handler(t, func(w http.ResponseWriter, r *http.Request, _ map[string]any) {
		mu.Lock()
		defer mu.Unlock()
		switch {
		case r.Method == "GET" && r.URL.EscapedPath() == "/snapshots/snap_1:default":
			fmt.Fprint(w, snapJSON)
		case r.Method == "DELETE" && r.URL.Path == "/templates/busy":
			apiError(w, 409, "", "in use")
		case r.Method == "DELETE" && strings.HasPrefix(r.URL.Path, "/templates/") && !deleted[r.URL.Path]:
			deleted[r.URL.Path] = true
			w.WriteHeader(204)
		case r.Method == "DELETE" && strings.HasPrefix(r.URL.Path, "/templates/"):
			apiError(w, 404, "template_not_found", "gone")
		default:
			apiError(w, 404, "snapshot_not_found", "snapshot 'x' not found")
		}
	}), nil)
	ctx := context.Background()
	info, err := c.GetSnapshot(ctx, "snap_1:default")
	if err != nil || info.ID != "snap_1" || info.SizeBytes != 12345 {
		t.Fatalf("%+v %v", info, err)
	}
	_, err = c.GetSnapshot(ctx, "nope")
	var ae *APIError
	if !errors.Is(err, ErrSnapshotNotFound) || errors.Is(err, ErrSandboxNotFound) || !errors.As(err, &ae) || ae.ErrorCode != "snapshot_not_found" {
		t.Fatalf("missing: %v", err)
	}
	for i, want := range []bool{true, false} {
		ok, err := c.DeleteSnapshot(ctx, "snap_1")
		if err != nil || ok != want {
			t.Fatalf("delete %d: %v %v, want %v", i, ok, err, want)
		}
	}
	if ok, err := c.DeleteSnapshot(ctx, "busy"); ok || !errors.Is(err, ErrConflict) {
		t.Fatalf("busy: %v %v", ok, err)
	}
	if got := rec.uris()[2]; got != "DELETE /templates/snap_1" {
		t.Fatalf("delete went to %s", got)
	}
}

func TestFork(t *testing.T) {
	var rec recorder
	c := testClient(t, rec.handler(t, func(w http.ResponseWriter, r *http.Request, body map[string]any) {
		switch r.URL.Path {
		case "/sandboxes/gpu/fork":
			apiError(w, 409, "", "GPU sandboxes cannot be forked")
			return
		case "/sandboxes/sb1/fork":
		default:
			apiError(w, 404, "sandbox_not_found", "no such sandbox")
			return
		}
		w.WriteHeader(201)
		fmt.Fprint(w, `[
			{"sandbox":{"sandboxID":"f1","templateID":"snap_x","clientID":"c","envdVersion":"0.2.0","envdAccessToken":"t1","trafficAccessToken":null,"domain":"cubicle.test"}},
			{"error":{"code":429,"message":"team sandbox limit reached","error_code":"team_quota_exceeded"}},
			{"sandbox":{"sandboxID":"f3","templateID":"snap_x","envdAccessToken":"t3","trafficAccessToken":"tr3"}},
			{"error":{"code":500,"message":"internal error (error id 7)"}},
			{}
		]`)
	}), nil)
	ctx := context.Background()
	sb := c.sandboxFrom(sandboxJSON{SandboxID: "sb1"})
	res, err := sb.Fork(ctx, &ForkOptions{Count: 5, Timeout: 1500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if l := rec.last(); l.uri != "/sandboxes/sb1/fork" || !reflect.DeepEqual(l.body, map[string]any{"count": 5.0, "timeout": 2.0}) {
		t.Fatalf("request %+v", l)
	}
	if len(res) != 5 {
		t.Fatalf("%d results", len(res))
	}
	if s := res[0].Sandbox; res[0].Err != nil || s == nil || s.ID != "f1" || s.AccessToken != "t1" || s.Domain != "cubicle.test" || s.EnvdVersion != "0.2.0" || s.envd == nil {
		t.Fatalf("fork 0: %+v", res[0])
	}
	if s := res[2].Sandbox; res[2].Err != nil || s == nil || s.ID != "f3" || s.TrafficAccessToken != "tr3" {
		t.Fatalf("fork 2: %+v", res[2])
	}
	var ae *APIError
	if res[1].Sandbox != nil || !errors.Is(res[1].Err, ErrRateLimited) || !errors.As(res[1].Err, &ae) || ae.ErrorCode != "team_quota_exceeded" || ae.StatusCode != 429 || !strings.Contains(ae.Error(), "limit reached") {
		t.Fatalf("fork 1: %+v", res[1])
	}
	if res[3].Sandbox != nil || res[3].Err == nil || errors.Is(res[3].Err, ErrRateLimited) || !errors.As(res[3].Err, &ae) || ae.StatusCode != 500 {
		t.Fatalf("fork 3: %+v", res[3])
	}
	if res[4].Sandbox != nil || res[4].Err == nil {
		t.Fatalf("fork 4 (empty entry): %+v", res[4])
	}

	if _, err := sb.Fork(ctx, nil); err != nil || len(rec.last().body) != 0 {
		t.Fatalf("defaults: %v body %v", err, rec.last().body)
	}
	if _, err := c.Fork(ctx, "gpu", &ForkOptions{Count: 2}); !errors.Is(err, ErrConflict) {
		t.Fatalf("gpu: %v", err)
	}
	if _, err := c.Fork(ctx, "gone", nil); !errors.Is(err, ErrSandboxNotFound) {
		t.Fatalf("gone: %v", err)
	}
	n := len(rec.uris())
	for _, o := range []ForkOptions{{Count: -1}, {Timeout: -time.Second}} {
		if _, err := sb.Fork(ctx, &o); !errors.Is(err, ErrInvalidArgument) {
			t.Fatalf("%+v: %v", o, err)
		}
	}
	if len(rec.uris()) != n {
		t.Fatal("invalid options reached the server")
	}
}

// cloneServer fakes snapshot, create, kill and delete for Clone.
type cloneServer struct {
	recorder
	creates  atomic.Int32
	failAt   int32 // the nth create fails (0: none)
	killFail bool
}

func (f *cloneServer) client(t *testing.T) *Client {
	return testClient(t, f.handler(t, func(w http.ResponseWriter, r *http.Request, body map[string]any) {
		switch {
		case r.Method == "POST" && r.URL.Path == "/sandboxes/src/snapshots":
			w.WriteHeader(201)
			fmt.Fprint(w, `{"snapshotID":"snap_c","names":[],"sandboxID":"src","kind":"filesystem"}`)
		case r.Method == "POST" && r.URL.Path == "/v2/sandboxes":
			if body["templateID"] != "snap_c" {
				t.Errorf("create from %v", body["templateID"])
			}
			n := f.creates.Add(1)
			if n == f.failAt {
				apiError(w, 409, "", "volume 'data' was deleted since the snapshot")
				return
			}
			w.WriteHeader(201)
			fmt.Fprintf(w, `{"sandboxID":"c%d","templateID":"snap_c","envdAccessToken":"t"}`, n)
		case r.Method == "DELETE" && strings.HasPrefix(r.URL.Path, "/sandboxes/c"):
			if f.killFail {
				apiError(w, 400, "", "cannot kill")
				return
			}
			w.WriteHeader(204)
		case r.Method == "DELETE" && r.URL.Path == "/templates/snap_c":
			w.WriteHeader(204)
		default:
			apiError(w, 404, "", "unexpected "+r.Method+" "+r.URL.Path)
		}
	}), nil)
}

func (f *cloneServer) count(prefix string) int {
	n := 0
	for _, u := range f.uris() {
		if strings.HasPrefix(u, prefix) {
			n++
		}
	}
	return n
}

func TestClone(t *testing.T) {
	ctx := context.Background()
	f := &cloneServer{}
	c := f.client(t)
	src := c.sandboxFrom(sandboxJSON{SandboxID: "src"})
	sbs, err := src.Clone(ctx, 3)
	if err != nil || len(sbs) != 3 {
		t.Fatalf("%v %v", sbs, err)
	}
	var ids []string
	for _, s := range sbs {
		ids = append(ids, s.ID)
	}
	sort.Strings(ids)
	if !reflect.DeepEqual(ids, []string{"c1", "c2", "c3"}) {
		t.Fatalf("ids %v", ids)
	}
	if f.count("DELETE") != 0 || f.count("POST /sandboxes/src/snapshots") != 1 {
		t.Fatalf("calls %v", f.uris())
	}
	if _, err := src.Clone(ctx, 0); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("n=0: %v", err)
	}
}

func TestCloneAllOrNothing(t *testing.T) {
	ctx := context.Background()
	f := &cloneServer{failAt: 2}
	c := f.client(t)
	src := c.sandboxFrom(sandboxJSON{SandboxID: "src"})
	sbs, err := src.Clone(ctx, 5)
	if sbs != nil || !errors.Is(err, ErrConflict) || !strings.Contains(err.Error(), "volume 'data'") {
		t.Fatalf("%v %v", sbs, err)
	}
	made := int(f.creates.Load()) - 1
	if kills := f.count("DELETE /sandboxes/"); kills != made || made < 1 {
		t.Fatalf("%d made, %d killed: %v", made, kills, f.uris())
	}
	if f.count("DELETE /templates/snap_c") != 1 {
		t.Fatalf("snapshot not deleted: %v", f.uris())
	}

	// A clone that cannot be killed keeps the snapshot it was made from.
	f = &cloneServer{failAt: 2, killFail: true}
	c = f.client(t)
	src = c.sandboxFrom(sandboxJSON{SandboxID: "src"})
	_, err = src.Clone(ctx, 2)
	if !errors.Is(err, ErrConflict) || !strings.Contains(err.Error(), "kill clone c1") {
		t.Fatalf("%v", err)
	}
	if f.count("DELETE /templates/") != 0 {
		t.Fatalf("snapshot deleted while clone c1 lives: %v", f.uris())
	}
}

func TestRollback(t *testing.T) {
	var rec recorder
	c := testClient(t, rec.handler(t, func(w http.ResponseWriter, r *http.Request, body map[string]any) {
		switch {
		case r.URL.Path == "/sandboxes/gone/rollback":
			apiError(w, 404, "sandbox_not_found", "no sandbox")
		case body["snapshotID"] == "snap_1":
			fmt.Fprint(w, `{"sandboxID":"sb1","snapshotID":"snap_1","status":"success"}`)
		default:
			apiError(w, 404, "snapshot_not_found", "no snapshot")
		}
	}), nil)
	ctx := context.Background()
	sb := c.sandboxFrom(sandboxJSON{SandboxID: "sb1", EnvdAccessToken: "tok"})
	if err := sb.Rollback(ctx, "snap_1"); err != nil {
		t.Fatal(err)
	}
	if l := rec.last(); l.method != "POST" || l.uri != "/sandboxes/sb1/rollback" || !reflect.DeepEqual(l.body, map[string]any{"snapshotID": "snap_1"}) {
		t.Fatalf("request %+v", l)
	}
	if sb.ID != "sb1" || sb.AccessToken != "tok" {
		t.Fatalf("handle changed: %+v", sb)
	}
	if err := sb.Rollback(ctx, "other"); !errors.Is(err, ErrNotFound) || errors.Is(err, ErrSandboxNotFound) {
		t.Fatalf("missing snapshot: %v", err)
	}
	if err := c.Rollback(ctx, "gone", "snap_1"); !errors.Is(err, ErrSandboxNotFound) {
		t.Fatalf("missing sandbox: %v", err)
	}
	n := len(rec.uris())
	if err := sb.Rollback(ctx, ""); !errors.Is(err, ErrInvalidArgument) || len(rec.uris()) != n {
		t.Fatalf("empty snapshot: %v", err)
	}
}

func TestPauseWithAndConnectWith(t *testing.T) {
	var rec recorder
	var paused atomic.Bool
	c := testClient(t, rec.handler(t, func(w http.ResponseWriter, r *http.Request, body map[string]any) {
		switch {
		case r.URL.Path == "/sandboxes/sb1/pause":
			if paused.Swap(true) {
				apiError(w, 409, "", "already paused")
				return
			}
			w.WriteHeader(204)
		case r.URL.Path == "/sandboxes/sb1" && r.Method == "GET":
			fmt.Fprint(w, `{"sandboxID":"sb1","state":"paused"}`)
		case r.URL.Path == "/v2/sandboxes/sb1/connect":
			paused.Store(false)
			w.WriteHeader(201)
			fmt.Fprint(w, `{"sandboxID":"sb1","templateID":"base","envdAccessToken":"tok"}`)
		default:
			apiError(w, 404, "", "unexpected")
		}
	}), nil)
	ctx := context.Background()
	sb := c.sandboxFrom(sandboxJSON{SandboxID: "sb1"})
	no := false
	if ok, err := sb.PauseWith(ctx, PauseOptions{KeepMemory: &no}); !ok || err != nil {
		t.Fatalf("pause: %v %v", ok, err)
	}
	if l := rec.last(); !reflect.DeepEqual(l.body, map[string]any{"memory": false}) {
		t.Fatalf("pause body %v", l.body)
	}
	if ok, err := sb.PauseWith(ctx, PauseOptions{}); ok || err != nil {
		t.Fatalf("already paused: %v %v", ok, err)
	}
	if b := rec.back(2).body; b == nil || len(b) != 0 {
		t.Fatalf("default pause body %v, want {}", b)
	}
	s, err := c.ConnectWith(ctx, "sb1", ConnectOptions{Timeout: 30 * time.Second, Reboot: true})
	if err != nil || s.ID != "sb1" || s.AccessToken != "tok" {
		t.Fatalf("connect: %+v %v", s, err)
	}
	if l := rec.last(); l.uri != "/v2/sandboxes/sb1/connect" || !reflect.DeepEqual(l.body, map[string]any{"memory": false, "timeout": 30.0}) {
		t.Fatalf("connect %+v", l)
	}
	if _, err := c.ConnectWith(ctx, "sb1", ConnectOptions{}); err != nil || len(rec.last().body) != 0 {
		t.Fatalf("plain connect: %v body %v", err, rec.last().body)
	}
}
