package oci

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/runtime"
	"github.com/cubicle-dev/cubicle/internal/runtime/runtimetest"
	"github.com/cubicle-dev/cubicle/internal/testenv"
)

// TestNetNS joins a pre-made netns (as internal/network will provide) and
// reaches a TCP listener inside the sandbox from the host over a veth.
func TestNetNS(t *testing.T) {
	testenv.LookPath(t, "ip")
	// With user namespaces runc cannot join a netns root owns from inside
	// the sandbox's namespace, so it is started in it instead.
	for i, c := range []struct {
		name, rt, tag string
		userns        bool
	}{{"runc", "runc", "r", false}, {"runsc", "runsc", "g", false}, {"runc-userns", "runc", "u", true}, {"runsc-userns", "runsc", "v", true}} {
		rt := c.rt
		t.Run(c.name, func(t *testing.T) {
			env := newTestEnvWith(t, rt, c.userns)
			n := os.Getpid()%200 + 20
			ns := fmt.Sprintf("cubicle-test-%d-%s", os.Getpid(), c.name)
			hostIf := fmt.Sprintf("cbt%d%s", os.Getpid()%100000, c.tag)
			hostIP := fmt.Sprintf("10.253.%d.%d", n, i*4+1)
			sbIP := fmt.Sprintf("10.253.%d.%d", n, i*4+2)
			ipCmd := func(args ...string) {
				t.Helper()
				if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
					t.Fatalf("ip %v: %v: %s", args, err, out)
				}
			}
			ipCmd("netns", "add", ns)
			t.Cleanup(func() { exec.Command("ip", "netns", "del", ns).Run() })
			ipCmd("link", "add", hostIf, "type", "veth", "peer", "name", "eth0", "netns", ns)
			t.Cleanup(func() { exec.Command("ip", "link", "del", hostIf).Run() })
			ipCmd("addr", "add", hostIP+"/30", "dev", hostIf)
			ipCmd("link", "set", hostIf, "up")
			ipCmd("-n", ns, "addr", "add", sbIP+"/30", "dev", "eth0")
			ipCmd("-n", ns, "link", "set", "eth0", "up")
			ipCmd("-n", ns, "link", "set", "lo", "up")
			// A default route, as internal/network sets up; runsc restore must re-add it.
			ipCmd("-n", ns, "route", "add", "default", "via", hostIP)

			ctx := context.Background()
			id := runtimetest.NewID(t)
			_, err := env.d.Create(ctx, runtime.Spec{
				ID: id, Layers: env.layers, NetNSPath: "/run/netns/" + ns,
				Args: []string{"/bin/sh", "-c", "echo hi-from-sandbox > /tmp/index.html; exec httpd -f -p 8080 -h /tmp"},
			})
			t.Cleanup(func() { env.d.Delete(context.Background(), id) })
			if err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			body := fetch(t, "http://"+sbIP+":8080/index.html", 20*time.Second)
			if strings.TrimSpace(body) != "hi-from-sandbox" {
				t.Fatalf("body %q", body)
			}
			t.Logf("%s: listener reachable over veth %v after create", rt, time.Since(start))

			if rt == "runsc" {
				// Checkpoint/restore must bring the network back in the same netns.
				if err := env.d.Pause(ctx, id); err != nil {
					t.Fatal(err)
				}
				if err := env.d.Resume(ctx, id); err != nil {
					t.Fatal(err)
				}
				if body := fetch(t, "http://"+sbIP+":8080/index.html", 20*time.Second); strings.TrimSpace(body) != "hi-from-sandbox" {
					t.Fatalf("after restore: body %q", body)
				}
			}
			if err := env.d.Delete(ctx, id); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func fetch(t *testing.T, url string, timeout time.Duration) string {
	t.Helper()
	c := &http.Client{Timeout: 2 * time.Second}
	deadline := time.Now().Add(timeout)
	for {
		resp, err := c.Get(url)
		if err == nil {
			b, rerr := io.ReadAll(resp.Body)
			resp.Body.Close()
			if rerr == nil && resp.StatusCode == 200 {
				return string(b)
			}
			err = fmt.Errorf("status %d %v", resp.StatusCode, rerr)
		}
		if time.Now().After(deadline) {
			t.Fatalf("GET %s: %v", url, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
