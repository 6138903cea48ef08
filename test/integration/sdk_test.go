package integration

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/testenv"
	cubicle "github.com/cubicle-dev/cubicle/sdk/go"
)

// The Go SDK against a real `cubicle serve`: every call, its typed errors,
// and its streaming paths.

func sdkClient(t *testing.T, s *server) *cubicle.Client {
	t.Helper()
	c, err := cubicle.NewClient(cubicle.Config{APIURL: s.URL, APIKey: s.Key})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// patternReader yields n deterministic bytes without holding them.
type patternReader struct{ left, off int64 }

func (p *patternReader) Read(b []byte) (int, error) {
	if p.left == 0 {
		return 0, io.EOF
	}
	n := min(int64(len(b)), p.left)
	for i := int64(0); i < n; i++ {
		b[i] = byte((p.off + i) * 7 % 251)
	}
	p.left -= n
	p.off += n
	return int(n), nil
}

func patternSum(n int64) [32]byte {
	h := sha256.New()
	io.Copy(h, &patternReader{left: n})
	var out [32]byte
	copy(out[:], h.Sum(nil))
	return out
}

// waitFor polls cond (bounded) and fails with what it last saw.
func waitFor(t *testing.T, what string, d time.Duration, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(d)
	last := ""
	for time.Now().Before(deadline) {
		ok, seen := cond()
		if ok {
			return
		}
		last = seen
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("%s: not within %s; last: %s", what, d, last)
}

func TestSDKSandboxLifecycle(t *testing.T) {
	s := startServer(t)
	c := sdkClient(t, s)
	ctx := context.Background()

	sb, err := c.Create(ctx, cubicle.CreateOptions{Template: "base", Timeout: 2 * time.Minute,
		Env: map[string]string{"GREETING": "hi"}, Metadata: map[string]string{"suite": "sdk", "user id": "a&b"}})
	if err != nil {
		t.Fatalf("create: %v\n%s", err, s.logs)
	}
	if sb.ID == "" || sb.AccessToken == "" || sb.EnvdVersion == "" {
		t.Fatalf("sandbox handle: %+v", sb)
	}
	if ok, err := sb.IsRunning(ctx); !ok || err != nil {
		t.Fatalf("is running: %v %v", ok, err)
	}
	info, err := sb.Info(ctx)
	if err != nil || info.State != "running" || info.Metadata["suite"] != "sdk" || info.TemplateID == "" {
		t.Fatalf("get: %+v %v", info, err)
	}

	// List: a metadata filter (with characters that need escaping) and
	// pagination by one across three sandboxes.
	var extra []*cubicle.Sandbox
	for i := 0; i < 2; i++ {
		x, err := c.Create(ctx, cubicle.CreateOptions{Metadata: map[string]string{"suite": "other"}})
		if err != nil {
			t.Fatal(err)
		}
		extra = append(extra, x)
	}
	var found []string
	for si, err := range c.List(cubicle.ListOptions{Metadata: map[string]string{"user id": "a&b"}}).All(ctx) {
		if err != nil {
			t.Fatal(err)
		}
		found = append(found, si.SandboxID)
	}
	if len(found) != 1 || found[0] != sb.ID {
		t.Fatalf("metadata filter: %v", found)
	}
	pager := c.List(cubicle.ListOptions{Limit: 1, States: []string{"running"}})
	pages, seen := 0, map[string]bool{}
	for pager.HasNext() && pages < 10 {
		page, err := pager.NextPage(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(page) > 1 {
			t.Fatalf("page of %d with limit 1", len(page))
		}
		for _, p := range page {
			seen[p.SandboxID] = true
		}
		pages++
	}
	if len(seen) != 3 || pages < 3 {
		t.Fatalf("pagination: %d pages, %v", pages, seen)
	}

	// SetTimeout moves the expiry.
	before := info.EndAt
	if err := sb.SetTimeout(ctx, 20*time.Minute); err != nil {
		t.Fatal(err)
	}
	if info2, _ := sb.Info(ctx); !info2.EndAt.After(before.Add(10 * time.Minute)) {
		t.Fatalf("endAt %v -> %v", before, info2.EndAt)
	}

	// Pause twice (second is "already paused"), resume, and it still runs.
	if ok, err := sb.Pause(ctx); !ok || err != nil {
		t.Fatalf("pause: %v %v", ok, err)
	}
	if ok, err := sb.Pause(ctx); ok || err != nil {
		t.Fatalf("second pause: %v %v", ok, err)
	}
	if info, _ := sb.Info(ctx); info.State != "paused" {
		t.Fatalf("state after pause: %s", info.State)
	}
	if _, err := c.Attach(ctx, sb.ID); !errors.Is(err, cubicle.ErrConflict) {
		t.Fatalf("attach to a paused sandbox: %v", err)
	}
	sb2, err := c.Resume(ctx, sb.ID, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if res, err := sb2.Commands().Run(ctx, "echo $GREETING", nil); err != nil || res.Stdout != "hi\n" {
		t.Fatalf("run after resume: %+v %v", res, err)
	}
	// Attach leaves the lifetime alone; Connect only ever extends it.
	end1, _ := sb.Info(ctx)
	att, err := c.Attach(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if res, err := att.Commands().Run(ctx, "echo attached", nil); err != nil || res.Stdout != "attached\n" {
		t.Fatalf("run via attach: %+v %v", res, err)
	}
	if end2, _ := sb.Info(ctx); !end2.EndAt.Equal(end1.EndAt) {
		t.Fatalf("attach moved endAt %v -> %v", end1.EndAt, end2.EndAt)
	}
	// Connect to a running sandbox returns a working handle too.
	sb3, err := c.Connect(ctx, sb.ID, 0)
	if err != nil || sb3.AccessToken == "" {
		t.Fatalf("connect: %v", err)
	}

	for _, x := range append(extra, sb) {
		if ok, err := x.Kill(ctx); !ok || err != nil {
			t.Fatalf("kill %s: %v %v", x.ID, ok, err)
		}
	}
	if ok, err := sb.Kill(ctx); ok || err != nil {
		t.Fatalf("kill twice: %v %v", ok, err)
	}
	if _, err := c.Get(ctx, sb.ID); !errors.Is(err, cubicle.ErrSandboxNotFound) || !errors.Is(err, cubicle.ErrNotFound) {
		t.Fatalf("get killed: %v", err)
	}
	if _, err := c.Connect(ctx, sb.ID, 0); !errors.Is(err, cubicle.ErrSandboxNotFound) {
		t.Fatalf("connect killed: %v", err)
	}
	if err := c.SetTimeout(ctx, sb.ID, time.Minute); !errors.Is(err, cubicle.ErrSandboxNotFound) {
		t.Fatalf("timeout killed: %v", err)
	}

	// Typed failures.
	if _, err := c.Create(ctx, cubicle.CreateOptions{Template: "no-such-template"}); !errors.Is(err, cubicle.ErrTemplateNotFound) || errors.Is(err, cubicle.ErrVolumeNotFound) {
		t.Fatalf("missing template: %v", err)
	}
	// A mount of a missing volume is a bad request (e2b answers 400 too).
	if _, err := c.Create(ctx, cubicle.CreateOptions{VolumeMounts: []cubicle.VolumeMount{{Name: "nope", Path: "/n"}}}); !errors.Is(err, cubicle.ErrInvalidArgument) || errors.Is(err, cubicle.ErrTemplateNotFound) {
		t.Fatalf("missing volume: %v", err)
	}
	if _, err := c.Create(ctx, cubicle.CreateOptions{Accelerators: []cubicle.AcceleratorRequest{{Class: "gpu", Count: 1}}}); !errors.Is(err, cubicle.ErrInvalidArgument) {
		t.Fatalf("gpu on a node without: %v", err)
	}
	// Network options reach the sandbox.
	off := false
	iso, err := c.Create(ctx, cubicle.CreateOptions{AllowInternetAccess: &off, Network: &cubicle.NetworkConfig{DenyOut: []string{"10.0.0.0/8"}}})
	if err != nil {
		t.Fatal(err)
	}
	if info, err := iso.Info(ctx); err != nil || info.AllowInternetAccess == nil || *info.AllowInternetAccess || info.Network == nil {
		t.Fatalf("network config: %+v %v", info, err)
	}
	iso.Kill(ctx)
	bad, _ := cubicle.NewClient(cubicle.Config{APIURL: s.URL, APIKey: "e2b_0000"})
	if _, err := bad.Get(ctx, "x"); !errors.Is(err, cubicle.ErrUnauthorized) {
		t.Fatalf("bad key: %v", err)
	}
	var ae *cubicle.APIError
	if _, err := c.Get(ctx, "nosuch"); !errors.As(err, &ae) || ae.StatusCode != 404 || ae.Code != 404 || ae.Message == "" {
		t.Fatalf("api error shape: %#v", err)
	}
}

func TestSDKCommandsAndPTY(t *testing.T) {
	s := startServer(t)
	c := sdkClient(t, s)
	ctx := context.Background()
	sb, err := c.Create(ctx, cubicle.CreateOptions{Env: map[string]string{"GREETING": "hi"}})
	if err != nil {
		t.Fatal(err)
	}
	cmds := sb.Commands()

	// Non-zero exit keeps the output; callbacks see it as it comes.
	var mu sync.Mutex
	var chunks []string
	res, err := cmds.Run(ctx, "echo $GREETING; echo oops >&2; exit 3", &cubicle.CommandOptions{
		OnStdout: func(b []byte) { mu.Lock(); chunks = append(chunks, "o:"+string(b)); mu.Unlock() },
		OnStderr: func(b []byte) { mu.Lock(); chunks = append(chunks, "e:"+string(b)); mu.Unlock() }})
	var ee *cubicle.CommandExitError
	if !errors.As(err, &ee) || res.ExitCode != 3 || res.Stdout != "hi\n" || res.Stderr != "oops\n" || ee.Result.ExitCode != 3 {
		t.Fatalf("exit 3: %+v %v", res, err)
	}
	if strings.Join(chunks, "") != "o:hi\ne:oops\n" && strings.Join(chunks, "") != "e:oops\no:hi\n" {
		t.Fatalf("callbacks: %q", chunks)
	}
	if res, err := cmds.Run(ctx, "pwd; whoami; echo $X", &cubicle.CommandOptions{Cwd: "/tmp", User: "root", Env: map[string]string{"X": "y"}}); err != nil || res.Stdout != "/tmp\nroot\ny\n" {
		t.Fatalf("cwd/user/env: %+v %v", res, err)
	}

	// Output channel.
	out := make(chan cubicle.Output, 16)
	h, err := cmds.Start(ctx, "for i in 1 2 3; do echo $i; done", &cubicle.CommandOptions{Output: out})
	if err != nil {
		t.Fatal(err)
	}
	var got bytes.Buffer
	for o := range out {
		got.Write(o.Stdout)
	}
	if _, err := h.Wait(); err != nil || got.String() != "1\n2\n3\n" {
		t.Fatalf("channel: %q %v", got.String(), err)
	}

	// Stdin: send, then EOF.
	h, err = cmds.Start(ctx, "cat", &cubicle.CommandOptions{Stdin: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := h.SendStdin(ctx, []byte("piped in\n")); err != nil {
		t.Fatal(err)
	}
	if err := h.CloseStdin(ctx); err != nil {
		t.Fatal(err)
	}
	if res, err := h.Wait(); err != nil || res.Stdout != "piped in\n" {
		t.Fatalf("stdin: %+v %v", res, err)
	}

	// Background process: List finds it by tag, Connect follows it, Kill ends it.
	bg, err := cmds.Start(ctx, "echo started; sleep 60", &cubicle.CommandOptions{Tag: "sleeper"})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "background output", 10*time.Second, func() (bool, string) { return bg.Stdout() == "started\n", bg.Stdout() })
	select {
	case <-bg.Done():
		t.Fatal("background command finished early")
	default:
	}
	procs, err := cmds.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var listed bool
	for _, p := range procs {
		if p.PID == bg.PID && p.Tag == "sleeper" {
			listed = true
		}
	}
	if !listed {
		t.Fatalf("pid %d not listed: %+v", bg.PID, procs)
	}
	bg.Disconnect()
	follow, err := cmds.Connect(ctx, bg.PID, nil)
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := follow.Kill(ctx); !ok || err != nil {
		t.Fatalf("kill: %v %v", ok, err)
	}
	if res, err := follow.Wait(); err == nil || res == nil || res.ExitCode == 0 {
		t.Fatalf("killed process: %+v %v", res, err)
	}
	if ok, err := cmds.Kill(ctx, bg.PID); ok || err != nil {
		t.Fatalf("kill gone pid: %v %v", ok, err)
	}
	if _, err := cmds.Connect(ctx, 999999, nil); !errors.Is(err, cubicle.ErrNotFound) || errors.Is(err, cubicle.ErrSandboxNotFound) {
		t.Fatalf("connect unknown pid: %v", err)
	}

	// Timeouts and cancellation.
	if _, err := cmds.Run(ctx, "sleep 5", &cubicle.CommandOptions{Timeout: 300 * time.Millisecond}); !errors.Is(err, cubicle.ErrTimeout) {
		t.Fatalf("timeout: %v", err)
	}
	cctx, cancel := context.WithCancel(ctx)
	time.AfterFunc(300*time.Millisecond, cancel)
	if _, err := cmds.Run(cctx, "sleep 5", nil); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancel: %v", err)
	}

	// PTY: type, resize, see the terminal's answers.
	var term bytes.Buffer
	var tmu sync.Mutex
	pty, err := sb.PTY().Create(ctx, cubicle.PTYOptions{Cols: 80, Rows: 24, OnData: func(b []byte) { tmu.Lock(); term.Write(b); tmu.Unlock() }})
	if err != nil {
		t.Fatal(err)
	}
	screen := func() (bool, string) { tmu.Lock(); defer tmu.Unlock(); return false, term.String() }
	if err := pty.SendStdin(ctx, []byte("echo pty-$((6*7)); tty\n")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "pty echo", 10*time.Second, func() (bool, string) {
		_, s := screen()
		return strings.Contains(s, "pty-42") && strings.Contains(s, "/dev/pts/"), s
	})
	if err := sb.PTY().Resize(ctx, pty.PID, 100, 40); err != nil {
		t.Fatal(err)
	}
	if err := sb.PTY().SendInput(ctx, pty.PID, []byte("stty size\n")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "pty resize", 10*time.Second, func() (bool, string) { _, s := screen(); return strings.Contains(s, "40 100"), s })
	if ok, err := sb.PTY().Kill(ctx, pty.PID); !ok || err != nil {
		t.Fatalf("pty kill: %v %v", ok, err)
	}
	pty.Wait()

	// Ports: a server in the sandbox, reached through the proxy.
	if _, err := cmds.Start(ctx, "mkdir -p /tmp/www && echo served > /tmp/www/index.html && exec python3 -m http.server 8080 --directory /tmp/www", nil); err != nil {
		t.Fatal(err)
	}
	if h := sb.GetHost(8080); !strings.HasPrefix(h, "8080-"+sb.ID+".") {
		t.Fatalf("host %q", h)
	}
	hc := sb.PortClient(8080)
	waitFor(t, "port 8080", 15*time.Second, func() (bool, string) {
		resp, err := hc.Get(sb.PortURL(8080) + "/index.html")
		if err != nil {
			return false, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode == 200 && string(b) == "served\n", fmt.Sprintf("%d %q", resp.StatusCode, b)
	})
	sb.Kill(ctx)
}

func TestSDKFiles(t *testing.T) {
	s := startServer(t)
	c := sdkClient(t, s)
	ctx := context.Background()
	sb, err := c.Create(ctx, cubicle.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Kill(ctx)
	fs := sb.Files()

	// Streamed both ways: 24 MiB that never sits in memory on this side.
	const size = 24 << 20
	ent, err := fs.Write(ctx, "/tmp/sdk/big.bin", &patternReader{left: size}, nil)
	if err != nil || ent.Path != "/tmp/sdk/big.bin" {
		t.Fatalf("write: %+v %v", ent, err)
	}
	st, err := fs.Stat(ctx, "/tmp/sdk/big.bin", nil)
	if err != nil || st.Size != size || st.Type != cubicle.TypeFile || st.Name != "big.bin" {
		t.Fatalf("stat: %+v %v", st, err)
	}
	rc, err := fs.Read(ctx, "/tmp/sdk/big.bin", nil)
	if err != nil {
		t.Fatal(err)
	}
	h := sha256.New()
	n, err := io.Copy(h, rc)
	rc.Close()
	var sum [32]byte
	copy(sum[:], h.Sum(nil))
	if err != nil || n != size || sum != patternSum(size) {
		t.Fatalf("read back %d bytes, err %v, hash match %v", n, err, sum == patternSum(size))
	}

	if _, err := fs.WriteFiles(ctx, []cubicle.WriteEntry{{Path: "/tmp/sdk/a.txt", Data: strings.NewReader("A")}, {Path: "/tmp/sdk/sub/b.txt", Data: strings.NewReader("B")}}, nil); err != nil {
		t.Fatal(err)
	}
	if b, err := fs.ReadFile(ctx, "/tmp/sdk/sub/b.txt", nil); err != nil || string(b) != "B" {
		t.Fatalf("multi write: %q %v", b, err)
	}
	if ok, err := fs.Exists(ctx, "/tmp/sdk/a.txt", nil); !ok || err != nil {
		t.Fatalf("exists: %v %v", ok, err)
	}
	if ok, err := fs.Exists(ctx, "/tmp/sdk/none", nil); ok || err != nil {
		t.Fatalf("exists missing: %v %v", ok, err)
	}
	if created, err := fs.MakeDir(ctx, "/tmp/sdk/d1/d2", nil); !created || err != nil {
		t.Fatalf("mkdir: %v %v", created, err)
	}
	if created, err := fs.MakeDir(ctx, "/tmp/sdk/d1/d2", nil); created || err != nil {
		t.Fatalf("mkdir again: %v %v", created, err)
	}
	ents, err := fs.List(ctx, "/tmp/sdk", 1, nil)
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]string{}
	for _, e := range ents {
		names[e.Name] = e.Type
	}
	if names["a.txt"] != cubicle.TypeFile || names["d1"] != cubicle.TypeDir || names["sub"] != cubicle.TypeDir || names["big.bin"] != cubicle.TypeFile {
		t.Fatalf("list: %v", names)
	}
	if deep, _ := fs.List(ctx, "/tmp/sdk", 3, nil); len(deep) <= len(ents) {
		t.Fatalf("depth 3 listed %d, depth 1 %d", len(deep), len(ents))
	}
	if e, err := fs.Rename(ctx, "/tmp/sdk/a.txt", "/tmp/sdk/renamed.txt", nil); err != nil || e.Path != "/tmp/sdk/renamed.txt" {
		t.Fatalf("rename: %+v %v", e, err)
	}
	if err := fs.Remove(ctx, "/tmp/sdk/renamed.txt", nil); err != nil {
		t.Fatal(err)
	}
	for name, err := range map[string]error{
		"read":   func() error { _, err := fs.ReadFile(ctx, "/tmp/sdk/renamed.txt", nil); return err }(),
		"stat":   func() error { _, err := fs.Stat(ctx, "/tmp/sdk/renamed.txt", nil); return err }(),
		"list":   func() error { _, err := fs.List(ctx, "/tmp/sdk/nodir", 1, nil); return err }(),
		"rename": func() error { _, err := fs.Rename(ctx, "/tmp/sdk/renamed.txt", "/tmp/x", nil); return err }(),
	} {
		if !errors.Is(err, cubicle.ErrFileNotFound) {
			t.Errorf("%s of a missing path: %v", name, err)
		}
	}
	// Files act as the chosen user.
	if _, err := fs.Write(ctx, "/root/root-only.txt", strings.NewReader("r"), &cubicle.FileOptions{User: "root"}); err != nil {
		t.Fatal(err)
	}
	if st, err := fs.Stat(ctx, "/root/root-only.txt", &cubicle.FileOptions{User: "root"}); err != nil || st.Owner != "root" {
		t.Fatalf("root file: %+v %v", st, err)
	}

	// WatchDir sees a file created after it returns.
	w, err := fs.WatchDir(ctx, "/tmp/sdk", &cubicle.WatchOptions{Recursive: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fs.Write(ctx, "/tmp/sdk/sub/watched.txt", strings.NewReader("w"), nil); err != nil {
		t.Fatal(err)
	}
	timeout := time.After(10 * time.Second)
	var evs []cubicle.FilesystemEvent
	for seenIt := false; !seenIt; {
		select {
		case ev, ok := <-w.Events():
			if !ok {
				t.Fatalf("watch ended: %v (%+v)", w.Err(), evs)
			}
			evs = append(evs, ev)
			seenIt = ev.Name == "sub/watched.txt" && (ev.Type == cubicle.EventCreate || ev.Type == cubicle.EventWrite)
		case <-timeout:
			t.Fatalf("no event for sub/watched.txt: %+v", evs)
		}
	}
	w.Stop()
	if err := w.Err(); err != nil {
		t.Fatalf("watch after stop: %v", err)
	}
	if _, err := fs.WatchDir(ctx, "/tmp/sdk/none", nil); !errors.Is(err, cubicle.ErrFileNotFound) {
		t.Fatalf("watch missing dir: %v", err)
	}
}

func TestSDKVolumes(t *testing.T) {
	s := startServer(t)
	c := sdkClient(t, s)
	ctx := context.Background()
	v, err := c.CreateVolume(ctx, "sdkvol", nil)
	if err != nil || v.VolumeID == "" || v.Token == "" || v.Name != "sdkvol" {
		t.Fatalf("create: %+v %v", v, err)
	}
	if _, err := c.CreateVolume(ctx, "sdkvol", nil); !errors.Is(err, cubicle.ErrConflict) || errors.Is(err, cubicle.ErrVolumeInUse) {
		t.Fatalf("duplicate name: %v", err)
	}
	if _, err := c.CreateVolume(ctx, "bad name!", nil); !errors.Is(err, cubicle.ErrInvalidArgument) {
		t.Fatalf("bad name: %v", err)
	}
	gen, err := c.CreateVolume(ctx, "", nil)
	if err != nil || gen.Name == "" {
		t.Fatalf("generated name: %+v %v", gen, err)
	}
	vs, err := c.ListVolumes(ctx)
	if err != nil || len(vs) != 2 {
		t.Fatalf("list: %+v %v", vs, err)
	}

	// Content API without a sandbox.
	mode, uid := uint32(0o640), 1000 // the sandbox's default user
	if _, err := v.MakeDir(ctx, "/data/deep", &cubicle.VolumeWriteOptions{Force: true}); err != nil {
		t.Fatal(err)
	}
	e, err := v.WriteFile(ctx, "/data/deep/hello.txt", strings.NewReader("from the sdk\n"), &cubicle.VolumeWriteOptions{Mode: &mode, UID: &uid, GID: &uid})
	if err != nil || e.Size != 13 || e.Mode&0o777 != 0o640 || e.Type != "file" || e.UID != 1000 {
		t.Fatalf("write: %+v %v", e, err)
	}
	rc, err := v.ReadFile(ctx, "/data/deep/hello.txt")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(rc)
	rc.Close()
	if string(b) != "from the sdk\n" {
		t.Fatalf("read %q", b)
	}
	if st, err := v.Stat(ctx, "/data"); err != nil || st.Type != "directory" {
		t.Fatalf("stat: %+v %v", st, err)
	}
	if ls, err := v.List(ctx, "/data", 2); err != nil || len(ls) != 2 {
		t.Fatalf("list: %+v %v", ls, err)
	}
	if _, err := v.Stat(ctx, "/nope"); !errors.Is(err, cubicle.ErrFileNotFound) {
		t.Fatalf("stat missing: %v", err)
	}
	if _, err := v.WriteFile(ctx, "/scratch.txt", strings.NewReader("tmp"), nil); err != nil {
		t.Fatal(err)
	}
	if err := v.Remove(ctx, "/scratch.txt"); err != nil {
		t.Fatal(err)
	}
	if err := v.Remove(ctx, "/scratch.txt"); !errors.Is(err, cubicle.ErrFileNotFound) {
		t.Fatalf("remove twice: %v", err)
	}

	// Mounted read-only in a sandbox: readable, not writable, not deletable.
	sb, err := c.Create(ctx, cubicle.CreateOptions{VolumeMounts: []cubicle.VolumeMount{{Name: "sdkvol", Path: "/mnt/v", ReadOnly: true}}})
	if err != nil {
		t.Fatal(err)
	}
	if res, err := sb.Commands().Run(ctx, "cat /mnt/v/data/deep/hello.txt; touch /mnt/v/x 2>/dev/null && echo WRITABLE || echo ro", nil); err != nil || res.Stdout != "from the sdk\nro\n" {
		t.Fatalf("in sandbox: %+v %v", res, err)
	}
	info, _ := sb.Info(ctx)
	if len(info.VolumeMounts) != 1 || !info.VolumeMounts[0].ReadOnly {
		t.Fatalf("sandbox volume mounts: %+v", info.VolumeMounts)
	}
	got, err := c.GetVolume(ctx, "sdkvol")
	if err != nil || len(got.Attachments) != 1 || got.Attachments[0].SandboxID != sb.ID || got.Token == "" {
		t.Fatalf("get: %+v %v", got, err)
	}
	if err := c.DeleteVolume(ctx, v.VolumeID); !errors.Is(err, cubicle.ErrVolumeInUse) || !errors.Is(err, cubicle.ErrConflict) {
		t.Fatalf("delete in use: %v", err)
	}
	sb.Kill(ctx)
	if err := c.DeleteVolume(ctx, v.VolumeID); err != nil {
		t.Fatal(err)
	}
	if _, err := c.GetVolume(ctx, v.VolumeID); !errors.Is(err, cubicle.ErrVolumeNotFound) {
		t.Fatalf("get deleted: %v", err)
	}
	if err := c.DeleteVolume(ctx, v.VolumeID); !errors.Is(err, cubicle.ErrVolumeNotFound) {
		t.Fatalf("delete twice: %v", err)
	}
	if err := c.DeleteVolume(ctx, gen.VolumeID); err != nil {
		t.Fatal(err)
	}
}

func TestSDKTemplatesAndAdmin(t *testing.T) {
	if _, err := os.Stat(filepath.Join(binDir, "buildkitd")); err != nil {
		testenv.Skipf(t, "buildkitd missing: %v", err)
	}
	s := startServer(t)
	c := sdkClient(t, s)
	ctx := context.Background()

	// Admin reads on a node without accelerators.
	nodes, err := c.ListNodes(ctx)
	if err != nil || len(nodes) != 1 || nodes[0].NodeID == "" {
		t.Fatalf("nodes: %+v %v", nodes, err)
	}
	if ds, err := c.ListAccelerators(ctx, nodes[0].NodeID); err != nil || len(ds) != 0 {
		t.Fatalf("accelerators: %+v %v", ds, err)
	}
	if _, err := c.AcceleratorEvents(ctx, nodes[0].NodeID, 10); err != nil {
		t.Fatal(err)
	}
	if _, err := c.AcceleratorAction(ctx, nodes[0].NodeID, "gpu-0000:00:00.0", cubicle.AcceleratorDisable, "x"); !errors.Is(err, cubicle.ErrNotFound) {
		t.Fatalf("action on unknown device: %v", err)
	}
	if _, err := c.ListAccelerators(ctx, "no-node"); !errors.Is(err, cubicle.ErrNotFound) {
		t.Fatalf("unknown node: %v", err)
	}

	// Image import streamed from tar.
	tarCmd := exec.Command("tar", "-C", filepath.Join(imagesDir(t), "base", "rootfs"), "-c", ".")
	pipe, _ := tarCmd.StdoutPipe()
	if err := tarCmd.Start(); err != nil {
		t.Fatal(err)
	}
	ref, err := c.ImportImage(ctx, "sdk/base:1", pipe)
	tarCmd.Wait()
	if err != nil || !strings.Contains(ref, "sdk/base") {
		t.Fatalf("import: %q %v", ref, err)
	}
	imgs, err := c.ListImages(ctx)
	if err != nil || len(imgs) == 0 {
		t.Fatalf("images: %+v %v", imgs, err)
	}

	ctxDir := t.TempDir()
	os.WriteFile(filepath.Join(ctxDir, "payload.txt"), []byte("copied by the sdk\n"), 0o644)
	var logs []cubicle.BuildLogEntry
	var uploads []cubicle.UploadProgress
	var created cubicle.TemplateBuildRef
	spec := cubicle.TemplateSpec{Name: "sdk-tpl", FromImage: "sdk/base:1", ContextDir: ctxDir, CPUCount: 1, MemoryMB: 256,
		Steps: []cubicle.TemplateStep{
			{Type: "COPY", Args: []string{"payload.txt", "/opt/payload.txt"}},
			{Type: "RUN", Args: []string{"echo built > /opt/built"}},
		}}
	ref2, err := c.BuildTemplate(ctx, spec, &cubicle.BuildOptions{
		OnCreated: func(r cubicle.TemplateBuildRef) { created = r },
		OnUpload:  func(u cubicle.UploadProgress) { uploads = append(uploads, u) },
		OnLog:     func(e cubicle.BuildLogEntry) { logs = append(logs, e) }})
	if err != nil {
		t.Fatalf("build: %v\nlogs %+v\nserver:\n%s", err, logs, s.logs)
	}
	if created.TemplateID != ref2.TemplateID || len(logs) == 0 || len(uploads) == 0 || !uploads[len(uploads)-1].Done {
		t.Fatalf("callbacks: created %+v logs %d uploads %+v", created, len(logs), uploads)
	}
	// A rebuild finds the context cached.
	uploads = nil
	if _, err := c.BuildTemplate(ctx, spec, &cubicle.BuildOptions{OnUpload: func(u cubicle.UploadProgress) { uploads = append(uploads, u) }}); err != nil {
		t.Fatal(err)
	}
	if len(uploads) != 1 || !uploads[0].Cached {
		t.Fatalf("rebuild uploads: %+v", uploads)
	}

	alias, err := c.TemplateByAlias(ctx, "sdk-tpl")
	if err != nil || alias.TemplateID != ref2.TemplateID {
		t.Fatalf("alias: %+v %v", alias, err)
	}
	if _, err := c.TemplateByAlias(ctx, "no-such"); !errors.Is(err, cubicle.ErrTemplateNotFound) {
		t.Fatalf("alias missing: %v", err)
	}
	ti, err := c.GetTemplate(ctx, "sdk-tpl")
	if err != nil || ti.BuildStatus != "ready" || len(ti.Builds) != 2 {
		t.Fatalf("get template: %+v %v", ti, err)
	}
	all, err := c.ListTemplates(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var listed bool
	for _, x := range all {
		listed = listed || x.TemplateID == ref2.TemplateID
	}
	if !listed {
		t.Fatalf("list templates: %+v", all)
	}
	st, err := c.TemplateBuildStatus(ctx, ref2.TemplateID, ref2.BuildID, 0)
	if err != nil || st.Status != "ready" || len(st.LogEntries) == 0 {
		t.Fatalf("status: %+v %v", st, err)
	}

	sb, err := c.Create(ctx, cubicle.CreateOptions{Template: "sdk-tpl"})
	if err != nil {
		t.Fatal(err)
	}
	if res, err := sb.Commands().Run(ctx, "cat /opt/payload.txt /opt/built", nil); err != nil || res.Stdout != "copied by the sdk\nbuilt\n" {
		t.Fatalf("built template: %+v %v", res, err)
	}
	sb.Kill(ctx)

	if p, err := c.SetWarmPool(ctx, "sdk-tpl", 1); err != nil || p.PoolSize != 1 {
		t.Fatalf("set pool: %+v %v", p, err)
	}
	waitFor(t, "warm pool ready", 60*time.Second, func() (bool, string) {
		p, err := c.GetWarmPool(ctx, "sdk-tpl")
		return err == nil && p.Ready == 1, fmt.Sprintf("%+v %v", p, err)
	})
	if p, err := c.SetWarmPool(ctx, "sdk-tpl", 0); err != nil || p.PoolSize != 0 {
		t.Fatalf("pool off: %+v %v", p, err)
	}

	// A failing step and a missing COPY source.
	bad := spec
	bad.Name = "sdk-bad"
	bad.Steps = []cubicle.TemplateStep{{Type: "RUN", Args: []string{"exit 7"}}}
	var be *cubicle.BuildError
	if _, err := c.BuildTemplate(ctx, bad, nil); !errors.As(err, &be) || be.Step != "0" {
		t.Fatalf("failing build: %v", err)
	}
	bad.Steps = []cubicle.TemplateStep{{Type: "COPY", Args: []string{"missing.txt", "/x"}}}
	var sfe *cubicle.StepFilesError
	var nf *cubicle.NoFilesError
	if _, err := c.BuildTemplate(ctx, bad, nil); !errors.As(err, &sfe) || sfe.Step != 0 || !errors.As(err, &nf) {
		t.Fatalf("missing copy source: %v", err)
	}

	if err := c.DeleteTemplate(ctx, "sdk-tpl", false); err != nil {
		t.Fatal(err)
	}
	if _, err := c.GetTemplate(ctx, "sdk-tpl"); !errors.Is(err, cubicle.ErrTemplateNotFound) {
		t.Fatalf("deleted template: %v", err)
	}
	if err := c.DeleteTemplate(ctx, "sdk-tpl", false); !errors.Is(err, cubicle.ErrTemplateNotFound) {
		t.Fatalf("delete twice: %v", err)
	}
	if err := c.DeleteImage(ctx, "sdk/base:1"); err != nil {
		t.Fatal(err)
	}
}
