package buildkit

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/cubicle-dev/cubicle/internal/network"
)

// relays makes the local registry, which listens on the host's loopback,
// reachable from inside the builder's network namespace at the same
// address, for buildkitd alone: a connection is relayed only when its
// socket is one of buildkitd's own descriptors. RUN steps share the
// namespace but are other processes, so theirs are closed unanswered; the
// registry's per-start password stays the second lock.
type relays struct {
	lns   []net.Listener
	owner func() int // buildkitd's pid now, 0 between restarts
	// upstream opens the connection to a registry (Config.Upstream).
	upstream func(ctx context.Context, registry string) (net.Conn, error)
	wg       sync.WaitGroup
	once     sync.Once

	mu    sync.Mutex
	conns map[net.Conn]struct{}
}

// ErrNotBuilder: a connection to a relay came from a process other than
// buildkitd (a RUN step).
var ErrNotBuilder = errors.New("buildkit: registry relay: connection is not from buildkitd")

// startRelays opens one listener inside the netns at nsPath per registry
// on a loopback address. Loopback there is brought up if it is not.
// owner gives buildkitd's current pid.
func startRelays(nsPath string, registries []string, owner func() int, upstream func(context.Context, string) (net.Conn, error)) (*relays, error) {
	if upstream == nil {
		upstream = func(ctx context.Context, registry string) (net.Conn, error) {
			d := net.Dialer{Timeout: 10 * time.Second}
			return d.DialContext(ctx, "tcp", registry)
		}
	}
	r := &relays{conns: map[net.Conn]struct{}{}, owner: owner, upstream: upstream}
	var addrs []string
	for _, reg := range registries {
		host, _, err := net.SplitHostPort(reg)
		if err != nil {
			return nil, fmt.Errorf("buildkit: registry %q: %w", reg, err)
		}
		if ip, err := netip.ParseAddr(host); err == nil && ip.IsLoopback() {
			addrs = append(addrs, reg)
		}
	}
	err := network.RunInNetns(nsPath, func() error {
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			return err
		}
		if err := netlink.LinkSetUp(lo); err != nil {
			return err
		}
		for _, a := range addrs {
			ln, err := net.Listen("tcp", a)
			if err != nil {
				return err
			}
			r.lns = append(r.lns, ln)
		}
		return nil
	})
	if err != nil {
		r.close()
		return nil, fmt.Errorf("buildkit: registry relay in %s: %w", nsPath, err)
	}
	for i, ln := range r.lns {
		r.wg.Add(1)
		go r.serve(ln, addrs[i])
	}
	return r, nil
}

func (r *relays) serve(ln net.Listener, target string) {
	defer r.wg.Done()
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		r.wg.Add(1)
		go func() {
			defer r.wg.Done()
			r.relay(c, target)
		}()
	}
}

func (r *relays) relay(c net.Conn, target string) {
	defer c.Close()
	if !r.track(c) {
		return
	}
	defer r.untrack(c)
	if err := heldBy(r.owner(), c); err != nil {
		return
	}
	// Dialled from a goroutine on an ordinary thread: the host's netns.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	up, err := r.upstream(ctx, target)
	cancel()
	if err != nil {
		return
	}
	defer up.Close()
	if !r.track(up) {
		return
	}
	defer r.untrack(up)
	done := make(chan struct{}, 2)
	cp := func(dst, src net.Conn) {
		io.Copy(dst, src)
		if cw, ok := dst.(interface{ CloseWrite() error }); ok {
			cw.CloseWrite() // a TCP FIN, or a TLS close_notify upstream
		}
		done <- struct{}{}
	}
	go cp(up, c)
	go cp(c, up)
	<-done
	<-done
}

// track registers a live connection so close can end it; false once closed.
func (r *relays) track(c net.Conn) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.conns == nil {
		return false
	}
	r.conns[c] = struct{}{}
	return true
}

func (r *relays) untrack(c net.Conn) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.conns, c)
}

// close stops the listeners and every relayed connection, and waits.
func (r *relays) close() {
	r.once.Do(func() {
		for _, ln := range r.lns {
			ln.Close()
		}
		r.mu.Lock()
		for c := range r.conns {
			c.Close()
		}
		r.conns = nil
		r.mu.Unlock()
		r.wg.Wait()
	})
}

// heldBy checks that the peer of c (accepted in the same netns as pid's)
// is a socket among pid's open descriptors: it finds the peer's inode in
// /proc/<pid>/net/tcp{,6} (which lists pid's netns) and looks for
// socket:[inode] in /proc/<pid>/fd.
func heldBy(pid int, c net.Conn) error {
	if pid <= 0 {
		return ErrNotBuilder
	}
	peer, ok1 := c.RemoteAddr().(*net.TCPAddr)
	local, ok2 := c.LocalAddr().(*net.TCPAddr)
	if !ok1 || !ok2 {
		return ErrNotBuilder
	}
	file := "tcp"
	if peer.IP.To4() == nil {
		file = "tcp6"
	}
	inode, err := socketInode(fmt.Sprintf("/proc/%d/net/%s", pid, file), procAddr(peer), procAddr(local))
	if err != nil {
		return err
	}
	fdDir := fmt.Sprintf("/proc/%d/fd", pid)
	ents, err := os.ReadDir(fdDir)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrNotBuilder, err)
	}
	want := "socket:[" + inode + "]"
	for _, e := range ents {
		if l, err := os.Readlink(fdDir + "/" + e.Name()); err == nil && l == want {
			return nil
		}
	}
	return ErrNotBuilder
}

// socketInode finds the inode of the socket local->remote in a
// /proc/net/tcp listing.
func socketInode(path, local, remote string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", fmt.Errorf("%w: %v", ErrNotBuilder, err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) > 9 && fs[1] == local && fs[2] == remote {
			return fs[9], nil
		}
	}
	return "", ErrNotBuilder
}

// procAddr renders an address as /proc/net/tcp does: each 32-bit word of
// the address in host (little-endian) byte order, then the port, in hex.
func procAddr(a *net.TCPAddr) string {
	ip := a.IP.To4()
	if ip == nil {
		ip = a.IP.To16()
	}
	var b strings.Builder
	for i := 0; i < len(ip); i += 4 {
		fmt.Fprintf(&b, "%02X%02X%02X%02X", ip[i+3], ip[i+2], ip[i+1], ip[i])
	}
	b.WriteString(":" + strings.ToUpper(fmt.Sprintf("%04x", a.Port)))
	return b.String()
}
