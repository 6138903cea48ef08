// Package s3test runs a real S3-compatible server (versitygw over a temp
// POSIX dir) for tests of the S3 volume plugin, and cleans up FUSE mounts
// tests leave behind. Non-Go harnesses use scripts/s3-dev-server instead.
package s3test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"

	"github.com/cubicle-dev/cubicle/internal/testenv"
)

// Server is a running versitygw.
type Server struct {
	Endpoint  string // http://127.0.0.1:PORT
	AccessKey string
	SecretKey string
	Bucket    string
	Region    string
	Root      string // the POSIX backend dir; <Root>/<Bucket>/<key>

	proc   *os.Process
	exited chan error
}

// Version is the versitygw release scripts/install provides.
const Version = "v1.8.0"

// VersityGW returns the versitygw binary: $CUBICLE_VERSITYGW, PATH,
// /usr/local/bin or /var/tmp/gobin.
func VersityGW() (string, error) {
	if p := os.Getenv("CUBICLE_VERSITYGW"); p != "" {
		return p, nil
	}
	if p, err := exec.LookPath("versitygw"); err == nil {
		return p, nil
	}
	for _, p := range []string{"/usr/local/bin/versitygw", "/var/tmp/gobin/versitygw"} {
		if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", errors.New("versitygw not found (scripts/install installs it: go install github.com/versity/versitygw/cmd/versitygw@" + Version + ")")
}

// RequireS3FS skips the test (fails it under CI=true) when s3fs is not
// installed, and returns its path.
func RequireS3FS(t testing.TB) string {
	t.Helper()
	p, err := exec.LookPath("s3fs")
	if err != nil {
		testenv.Skip(t, "s3fs not installed (apt-get install s3fs fuse3; scripts/install does it)")
	}
	return p
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// Start runs versitygw on a free 127.0.0.1 port with random credentials
// and one bucket, and stops it (the process it started) at cleanup. The
// test is skipped (failed under CI=true) when versitygw is not installed.
func Start(t testing.TB) *Server {
	t.Helper()
	bin, err := VersityGW()
	if err != nil {
		testenv.Skip(t, err.Error())
	}
	root := t.TempDir()
	s := &Server{
		AccessKey: "AK" + strings.ToUpper(randHex(9)),
		SecretKey: randHex(20),
		Bucket:    "cubicle-test",
		Region:    "us-east-1",
		Root:      filepath.Join(root, "data"),
	}
	if err := os.Mkdir(s.Root, 0o755); err != nil {
		t.Fatal(err)
	}
	logPath := filepath.Join(root, "versitygw.log")
	var lastErr error
	// A port picked by listening on :0 can be taken again before versitygw
	// binds it; retry with a fresh one.
	for attempt := 0; attempt < 3; attempt++ {
		if lastErr = s.start(bin, logPath); lastErr == nil {
			break
		}
	}
	if lastErr != nil {
		log, _ := os.ReadFile(logPath)
		t.Fatalf("s3test: versitygw: %v\n%s", lastErr, log)
	}
	t.Cleanup(s.Stop)

	c, err := s.Client()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.MakeBucket(ctx, s.Bucket, minio.MakeBucketOptions{Region: s.Region}); err != nil {
		t.Fatalf("s3test: create bucket: %v", err)
	}
	return s
}

func (s *Server) start(bin, logPath string) error {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	addr := l.Addr().String()
	l.Close()
	logf, err := os.OpenFile(logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer logf.Close()
	// --keep-alive: without it versitygw drops connections after each
	// response without saying so, and a client reusing one gets EPIPE.
	cmd := exec.Command(bin, "--port", addr, "--quiet", "--keep-alive", "posix", s.Root)
	cmd.Env = append(os.Environ(),
		"ROOT_ACCESS_KEY="+s.AccessKey,
		"ROOT_SECRET_KEY="+s.SecretKey,
		"VGW_REGION="+s.Region,
	)
	cmd.Stdout, cmd.Stderr = logf, logf
	// Own process group: a ^C to `go test` must not race our cleanup.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return err
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	endpoint := "http://" + addr
	dl := time.Now().Add(15 * time.Second)
	for {
		select {
		case err := <-exited:
			return fmt.Errorf("exited during start: %v", err)
		default:
		}
		// Any HTTP answer (403 for an unsigned request) means it serves.
		resp, err := http.Get(endpoint + "/")
		if err == nil {
			resp.Body.Close()
			break
		}
		if time.Now().After(dl) {
			_ = cmd.Process.Kill()
			<-exited
			return fmt.Errorf("no answer on %s within 15s: %v", addr, err)
		}
		time.Sleep(25 * time.Millisecond)
	}
	s.Endpoint = endpoint
	s.proc, s.exited = cmd.Process, exited
	return nil
}

// Stop kills the server (idempotent).
func (s *Server) Stop() {
	if s.proc == nil {
		return
	}
	_ = s.proc.Signal(syscall.SIGTERM)
	select {
	case <-s.exited:
	case <-time.After(5 * time.Second):
		_ = s.proc.Kill()
		<-s.exited
	}
	s.proc = nil
}

// Env is the CUBICLE_S3_* environment that points the plugin at this server.
func (s *Server) Env() []string {
	return []string{
		"CUBICLE_S3_ENDPOINT=" + s.Endpoint,
		"CUBICLE_S3_REGION=" + s.Region,
		"CUBICLE_S3_BUCKET=" + s.Bucket,
		"CUBICLE_S3_ACCESS_KEY=" + s.AccessKey,
		"CUBICLE_S3_SECRET_KEY=" + s.SecretKey,
		"CUBICLE_S3_PATH_STYLE=true",
	}
}

// Client is an S3 client for the server, for asserting on objects.
func (s *Server) Client() (*minio.Client, error) {
	host := strings.TrimPrefix(s.Endpoint, "http://")
	return minio.New(host, &minio.Options{
		Creds:        credentials.NewStaticV4(s.AccessKey, s.SecretKey, ""),
		Region:       s.Region,
		BucketLookup: minio.BucketLookupPath,
	})
}

// Keys lists every key under prefix.
func (s *Server) Keys(t testing.TB, prefix string) []string {
	t.Helper()
	c, err := s.Client()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var keys []string
	for o := range c.ListObjects(ctx, s.Bucket, minio.ListObjectsOptions{Prefix: prefix, Recursive: true}) {
		if o.Err != nil {
			t.Fatalf("s3test: list %s: %v", prefix, o.Err)
		}
		keys = append(keys, o.Key)
	}
	return keys
}

// FUSEMountsUnder returns the mount points of s3fs mounts at or below dir
// in this process's mount namespace.
func FUSEMountsUnder(dir string) []string {
	raw, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	dir = filepath.Clean(dir)
	if r, err := filepath.EvalSymlinks(dir); err == nil {
		dir = r
	}
	var out []string
	for _, line := range strings.Split(string(raw), "\n") {
		f := strings.Fields(line)
		sep := -1
		for i := 6; i < len(f); i++ {
			if f[i] == "-" {
				sep = i
				break
			}
		}
		if sep < 0 || sep+1 >= len(f) || f[sep+1] != "fuse.s3fs" {
			continue
		}
		mp := strings.ReplaceAll(f[4], `\040`, " ")
		if mp == dir || strings.HasPrefix(mp, dir+"/") {
			out = append(out, mp)
		}
	}
	return out
}

// CleanupMounts registers a cleanup that lazily unmounts any s3fs mount a
// test left under dir, and fails the test if it found one (the plugin
// should have unmounted it). Register it after t.TempDir(dir) so it runs
// before the dir is removed.
func CleanupMounts(t testing.TB, dir string) {
	t.Helper()
	t.Cleanup(func() {
		left := FUSEMountsUnder(dir)
		for _, mp := range left {
			_ = syscall.Unmount(mp, syscall.MNT_DETACH)
		}
		if len(left) > 0 {
			t.Errorf("s3test: s3fs mounts left behind (lazily unmounted): %v", left)
		}
	})
}
