package agent

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// sysUser is a user from the sandbox's passwd database.
type sysUser struct {
	Name   string
	UID    uint32
	GID    uint32
	Home   string
	Shell  string
	Groups []uint32 // supplementary groups, including GID
}

func withUser(ctx context.Context, u *sysUser) context.Context {
	return context.WithValue(ctx, userKey, u)
}

// requestUser returns the Basic-auth user or the default user.
func (a *Agent) requestUser(ctx context.Context) (*sysUser, error) {
	if u, ok := ctx.Value(userKey).(*sysUser); ok {
		return u, nil
	}
	return a.lookupUser(a.defaultUserName())
}

func (a *Agent) defaultUserName() string {
	a.mu.RLock()
	defer a.mu.RUnlock()
	if a.defaultUser != "" {
		return a.defaultUser
	}
	return "user"
}

// readColonFile reads a passwd/group style file; bounded by the file itself.
// It runs in a file slot (see threads.go): every request naming a user
// reads two of these.
func readColonFile(path string) ([][]string, error) {
	return inFileSlot(func() ([][]string, error) { return readColonFileNow(path) })
}

func readColonFileNow(path string) ([][]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var rows [][]string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		rows = append(rows, strings.Split(line, ":"))
	}
	return rows, sc.Err()
}

func (a *Agent) lookupUser(name string) (*sysUser, error) {
	rows, err := readColonFile(a.cfg.PasswdPath)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrUserNotFound, name, err)
	}
	for _, f := range rows {
		if len(f) < 7 || f[0] != name {
			continue
		}
		uid, err1 := strconv.ParseUint(f[2], 10, 32)
		gid, err2 := strconv.ParseUint(f[3], 10, 32)
		if err1 != nil || err2 != nil {
			continue
		}
		u := &sysUser{Name: name, UID: uint32(uid), GID: uint32(gid), Home: f[5], Shell: f[6]}
		if u.Home == "" {
			u.Home = "/"
		}
		u.Groups = a.supplementaryGroups(name, u.GID)
		return u, nil
	}
	return nil, fmt.Errorf("%w: %s", ErrUserNotFound, name)
}

func (a *Agent) supplementaryGroups(name string, primary uint32) []uint32 {
	groups := []uint32{primary}
	rows, err := readColonFile(a.cfg.GroupPath)
	if err != nil {
		return groups
	}
	for _, f := range rows {
		if len(f) < 4 {
			continue
		}
		gid, err := strconv.ParseUint(f[2], 10, 32)
		if err != nil || uint32(gid) == primary {
			continue
		}
		for _, m := range strings.Split(f[3], ",") {
			if m == name {
				groups = append(groups, uint32(gid))
				break
			}
		}
	}
	return groups
}

// idNames maps uids and gids to names for EntryInfo owner/group.
type idNames struct {
	users  map[uint32]string
	groups map[uint32]string
}

func (a *Agent) loadIDNames() *idNames {
	n := &idNames{users: map[uint32]string{}, groups: map[uint32]string{}}
	if rows, err := readColonFile(a.cfg.PasswdPath); err == nil {
		for _, f := range rows {
			if len(f) >= 3 {
				if id, err := strconv.ParseUint(f[2], 10, 32); err == nil {
					if _, dup := n.users[uint32(id)]; !dup {
						n.users[uint32(id)] = f[0]
					}
				}
			}
		}
	}
	if rows, err := readColonFile(a.cfg.GroupPath); err == nil {
		for _, f := range rows {
			if len(f) >= 3 {
				if id, err := strconv.ParseUint(f[2], 10, 32); err == nil {
					if _, dup := n.groups[uint32(id)]; !dup {
						n.groups[uint32(id)] = f[0]
					}
				}
			}
		}
	}
	return n
}

func (n *idNames) user(id uint32) string {
	if s, ok := n.users[id]; ok {
		return s
	}
	return strconv.FormatUint(uint64(id), 10)
}

func (n *idNames) group(id uint32) string {
	if s, ok := n.groups[id]; ok {
		return s
	}
	return strconv.FormatUint(uint64(id), 10)
}

// resolvePath makes p absolute: "~" and relative paths resolve against the
// user's home. NUL bytes and empty paths are rejected.
func resolvePath(p string, u *sysUser) (string, error) {
	if p == "" || strings.IndexByte(p, 0) >= 0 {
		return "", fmt.Errorf("%w: %q", ErrInvalidPath, p)
	}
	switch {
	case p == "~":
		p = u.Home
	case strings.HasPrefix(p, "~/"):
		p = filepath.Join(u.Home, p[2:])
	case !filepath.IsAbs(p):
		p = filepath.Join(u.Home, p)
	}
	return filepath.Clean(p), nil
}

// asUser runs fn with the file-system identity of u. The agent runs as root;
// file operations must be checked by the kernel as the selected user, so fn
// runs on a locked OS thread whose fsuid/fsgid and supplementary groups are
// the user's (setfsuid drops CAP_DAC_OVERRIDE and friends for that thread, and
// files it creates are owned by the user). Afterwards the thread gets root's
// identity back and returns to the runtime: a new thread per call would need
// a free pid, and at the sandbox's pids limit the runtime's failure to make
// one kills the agent (threads.go). Only if restoring fails is the thread
// left locked, so that the runtime destroys it rather than reuse it with the
// changed identity. At most asUserSlots calls run at once, each holding its
// thread. Descriptors opened inside fn may be used anywhere. When the agent
// is not root, or u is root, fn runs directly, in one of those slots too (its
// system calls hold a thread all the same).
func asUser(u *sysUser, fn func() error) error {
	asUserSem <- struct{}{}
	defer func() { <-asUserSem }()
	if u.UID == 0 || os.Geteuid() != 0 {
		return fn()
	}
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		restored := false
		defer func() {
			if restored {
				runtime.UnlockOSThread()
			}
		}()
		// Nothing is changed yet on these two paths: keep the thread.
		rootGroups, err := unix.Getgroups()
		if err != nil {
			restored = true
			errc <- fmt.Errorf("getgroups: %w", err)
			return
		}
		rootCaps, err := threadCaps()
		if err != nil {
			restored = true
			errc <- err
			return
		}
		gids := make([]int, len(u.Groups))
		for i, g := range u.Groups {
			gids[i] = int(g)
		}
		// x/sys/unix issues these as raw per-thread syscalls (unlike package
		// syscall, which applies set*id to all threads).
		if err := unix.Setgroups(gids); err != nil {
			errc <- fmt.Errorf("setgroups: %w", err)
			return
		}
		if err := setThreadFSIDs(u.UID, u.GID); err != nil {
			errc <- err
			return
		}
		err = fn()
		restored = restoreThreadIDs(rootGroups, rootCaps) == nil
		errc <- err
	}()
	return <-errc
}

// restoreThreadIDs gives the calling thread back the agent's identity
// (root, its supplementary groups, its effective capabilities caps) after
// setThreadFSIDs, and checks it. Order matters: fsuid going back to 0
// re-raises the file capabilities that setfsuid dropped, but only through
// setfsuid (setresuid moves fsuid along with euid without them).
func restoreThreadIDs(groups []int, caps [2]unix.CapUserData) error {
	unix.SetfsuidRetUid(0)
	unix.SetfsgidRetGid(0)
	keep := ^uintptr(0)
	if unix.Geteuid() != 0 {
		if _, _, e := unix.RawSyscall(unix.SYS_SETRESUID, keep, 0, keep); e != 0 {
			return fmt.Errorf("setresuid 0: %w", e)
		}
	}
	if unix.Getegid() != 0 {
		if _, _, e := unix.RawSyscall(unix.SYS_SETRESGID, keep, 0, keep); e != 0 {
			return fmt.Errorf("setresgid 0: %w", e)
		}
	}
	if err := unix.Setgroups(groups); err != nil {
		return fmt.Errorf("setgroups: %w", err)
	}
	uid, _ := unix.SetfsuidRetUid(-1)
	gid, _ := unix.SetfsgidRetGid(-1)
	if uid != 0 || gid != 0 || unix.Geteuid() != 0 || unix.Getegid() != 0 {
		return fmt.Errorf("identity not restored: fsuid %d fsgid %d", uid, gid)
	}
	now, err := threadCaps()
	if err != nil {
		return err
	}
	if now != caps {
		return fmt.Errorf("capabilities not restored: %+v, want %+v", now, caps)
	}
	return nil
}

// threadCaps returns the calling thread's capability sets.
func threadCaps() ([2]unix.CapUserData, error) {
	var data [2]unix.CapUserData
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return data, fmt.Errorf("capget: %w", err)
	}
	return data, nil
}

// setThreadFSIDs switches the calling thread's file-system identity. It uses
// setfsgid/setfsuid and verifies the result (those calls report failure only
// by returning the old id); where they are unavailable (some sandboxed
// kernels) it falls back to per-thread raw setresgid/setresuid on the
// effective ids, which the file-system ids follow. restoreThreadIDs undoes
// either.
func setThreadFSIDs(uid, gid uint32) error {
	_, errG := unix.SetfsgidRetGid(int(gid))
	_, errU := unix.SetfsuidRetUid(int(uid))
	curG, _ := unix.SetfsgidRetGid(-1)
	curU, _ := unix.SetfsuidRetUid(-1)
	if errG == nil && errU == nil && curG == int(gid) && curU == int(uid) {
		return nil
	}
	keep := ^uintptr(0) // -1: leave unchanged
	if _, _, e := unix.RawSyscall(unix.SYS_SETRESGID, keep, uintptr(gid), keep); e != 0 {
		return fmt.Errorf("setresgid %d: %w", gid, e)
	}
	if _, _, e := unix.RawSyscall(unix.SYS_SETRESUID, keep, uintptr(uid), keep); e != 0 {
		return fmt.Errorf("setresuid %d: %w", uid, e)
	}
	return nil
}
