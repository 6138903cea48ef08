// Package pgtest runs a throwaway PostgreSQL server for tests: one per test
// binary (started by the first test that asks, stopped by TestMain), with a
// fresh database for every caller of DSN, so tests sharing the server never
// see each other's rows.
//
// initdb and postgres refuse to run as root. As root the server runs as
// the system user "postgres" when it exists (the Debian package creates
// it), else as nobody (65534): no account is created, the process only
// gets a uid, and its temp dir is chowned to it. The server is the test
// binary's child, killed by the kernel if the binary dies (Pdeathsig), and
// its backends exit when they see their postmaster gone.
package pgtest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/testenv"
	"github.com/jackc/pgx/v5"
)

// ErrNoPostgres: initdb/postgres are not installed.
var ErrNoPostgres = errors.New("pgtest: PostgreSQL binaries (initdb, pg_ctl, postgres) not found; scripts/install installs them")

// Server is a running throwaway cluster.
type Server struct {
	dir  string
	bin  string
	port int
	cmd  *exec.Cmd
	cred *syscall.Credential
	n    atomic.Int64
}

// BinDir finds the directory holding initdb: PATH first, then the newest
// /usr/lib/postgresql/*/bin (Debian keeps them off PATH).
func BinDir() (string, error) {
	if p, err := exec.LookPath("initdb"); err == nil {
		return filepath.Dir(p), nil
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool { return version(dirs[i]) > version(dirs[j]) })
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, "initdb")); err == nil {
			return d, nil
		}
	}
	return "", ErrNoPostgres
}

func version(binDir string) int {
	n, _ := strconv.Atoi(filepath.Base(filepath.Dir(binDir)))
	return n
}

// credential is who the server runs as (nil: ourselves, when not root).
func credential() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return &syscall.Credential{Uid: 65534, Gid: 65534}, nil
	}
	uid, err := strconv.Atoi(u.Uid)
	if err != nil {
		return nil, err
	}
	gid, err := strconv.Atoi(u.Gid)
	if err != nil {
		return nil, err
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

// Start initialises a cluster in a new temp dir and starts it on a free
// 127.0.0.1 port and a unix socket in that dir. On error nothing is left
// behind.
func Start() (_ *Server, err error) {
	bin, err := BinDir()
	if err != nil {
		return nil, err
	}
	cred, err := credential()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "pgtest")
	if err != nil {
		return nil, err
	}
	s := &Server{dir: dir, bin: bin, cred: cred}
	defer func() {
		if err != nil {
			s.Stop()
		}
	}()
	if cred != nil {
		if err := os.Chown(dir, int(cred.Uid), int(cred.Gid)); err != nil {
			return nil, err
		}
	}
	data := filepath.Join(dir, "data")
	if out, err := s.command("initdb", "-D", data, "-U", "cubicle", "--auth=trust", "-E", "UTF8", "--no-sync", "--no-instructions").CombinedOutput(); err != nil {
		return nil, fmt.Errorf("initdb: %v: %s", err, out)
	}
	if s.port, err = freePort(); err != nil {
		return nil, err
	}
	log, err := os.Create(filepath.Join(dir, "server.log"))
	if err != nil {
		return nil, err
	}
	defer log.Close()
	// Durability is irrelevant for a throwaway database; speed is not.
	s.cmd = s.command("postgres", "-D", data, "-p", strconv.Itoa(s.port), "-k", dir,
		"-c", "listen_addresses=127.0.0.1", "-c", "fsync=off", "-c", "synchronous_commit=off",
		"-c", "full_page_writes=off", "-c", "max_connections=300")
	s.cmd.Stdout, s.cmd.Stderr = log, log
	s.cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	if err := startPinned(s.cmd); err != nil {
		return nil, err
	}
	if err := s.waitReady(); err != nil {
		out, _ := os.ReadFile(log.Name())
		return nil, fmt.Errorf("%w; log:\n%s", err, out)
	}
	return s, nil
}

// startPinned starts cmd from an OS thread that never exits: Pdeathsig
// fires when the forking thread ends, and Go ends a thread when a
// goroutine locked to it returns, which another test could otherwise do.
func startPinned(cmd *exec.Cmd) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		errc <- cmd.Start()
		select {} // keeps the thread (one parked goroutine per server)
	}()
	return <-errc
}

func (s *Server) command(name string, args ...string) *exec.Cmd {
	cmd := exec.Command(filepath.Join(s.bin, name), args...)
	cmd.Dir = s.dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: s.cred}
	return cmd
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// waitReady polls until the server accepts a connection, for at most 30 s.
func (s *Server) waitReady() error {
	exited := make(chan error, 1)
	go func() { exited <- s.cmd.Wait() }()
	for range 300 {
		select {
		case err := <-exited:
			s.cmd = nil
			return fmt.Errorf("postgres exited: %v", err)
		case <-time.After(100 * time.Millisecond):
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		c, err := pgx.Connect(ctx, s.dsn("postgres"))
		cancel()
		if err == nil {
			c.Close(context.Background())
			go func() { <-exited }()
			return nil
		}
	}
	return errors.New("postgres did not accept connections within 30s")
}

// dsn names database db on the server over TCP.
func (s *Server) dsn(db string) string {
	return fmt.Sprintf("postgres://cubicle@127.0.0.1:%d/%s?sslmode=disable", s.port, db)
}

// SocketDir is where the server's unix socket lives.
func (s *Server) SocketDir() string { return s.dir }

// AdminDSN names the maintenance database (for pg_terminate_backend etc.).
func (s *Server) AdminDSN() string { return s.dsn("postgres") }

// NewDatabase creates an empty database and returns its DSN.
func (s *Server) NewDatabase(ctx context.Context) (string, error) {
	name := fmt.Sprintf("t%d", s.n.Add(1))
	c, err := pgx.Connect(ctx, s.AdminDSN())
	if err != nil {
		return "", err
	}
	defer c.Close(ctx)
	if _, err := c.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		return "", err
	}
	return s.dsn(name), nil
}

// Stop shuts the server down (pg_ctl stop -m fast, then SIGKILL to the
// postmaster if it is still there) and removes its directory.
func (s *Server) Stop() {
	if s.cmd != nil && s.cmd.Process != nil {
		stop := s.command("pg_ctl", "stop", "-D", filepath.Join(s.dir, "data"), "-m", "fast", "-w", "-t", "20")
		if out, err := stop.CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "pgtest: pg_ctl stop: %v: %s; killing %d\n", err, strings.TrimSpace(string(out)), s.cmd.Process.Pid)
			s.cmd.Process.Kill()
		}
	}
	os.RemoveAll(s.dir)
}

var (
	sharedOnce sync.Once
	shared     *Server
	startErr   error
	inMain     bool
)

// Main runs the package's tests and stops the shared server (started by
// the first Shared or DSN call, so a run that needs none starts none) even
// when tests fail: call it from TestMain as os.Exit(pgtest.Main(m)).
func Main(m *testing.M) int {
	inMain = true
	defer func() {
		if shared != nil {
			shared.Stop()
		}
	}()
	return m.Run()
}

// Shared returns the package's server, skipping t (failing it under
// CI=true) when PostgreSQL is not installed.
func Shared(t testing.TB) *Server {
	t.Helper()
	if !inMain {
		t.Fatal("pgtest: call pgtest.Main from TestMain (it stops the server)")
	}
	sharedOnce.Do(func() { shared, startErr = Start() })
	if errors.Is(startErr, ErrNoPostgres) {
		testenv.Skip(t, startErr)
	}
	if startErr != nil {
		t.Fatalf("pgtest: %v", startErr)
	}
	return shared
}

// DSN returns a fresh database on the shared server.
func DSN(t testing.TB) string {
	t.Helper()
	dsn, err := Shared(t).NewDatabase(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return dsn
}

// StartT starts a server for one test (outside TestMain: a package that
// needs PostgreSQL in one test only) and stops it when the test ends. It
// skips t (fails it under CI=true) when PostgreSQL is not installed.
func StartT(t testing.TB) *Server {
	t.Helper()
	s, err := Start()
	if errors.Is(err, ErrNoPostgres) {
		testenv.Skip(t, err)
	}
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	t.Cleanup(s.Stop)
	return s
}
