package agent

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"connectrpc.com/connect"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/types/known/timestamppb"

	fspb "github.com/cubicle-dev/cubicle/sdk/go/envd/filesystem"
)

const xattrPrefix = "user.e2b."

// filesystemService implements filesystemconnect.FilesystemHandler.
type filesystemService struct{ a *Agent }

// fsError maps an OS error to a Connect error code.
func fsError(err error, what string) error {
	var ce *connect.Error
	if errors.As(err, &ce) {
		return err
	}
	code := connect.CodeInternal
	switch {
	case errors.Is(err, ErrInvalidPath), errors.Is(err, ErrNotDir), errors.Is(err, syscall.ENOTDIR), errors.Is(err, syscall.EISDIR), errors.Is(err, syscall.EINVAL), errors.Is(err, syscall.ENAMETOOLONG):
		code = connect.CodeInvalidArgument
	case errors.Is(err, fs.ErrNotExist), errors.Is(err, ErrNotFound):
		code = connect.CodeNotFound
	case errors.Is(err, fs.ErrExist), errors.Is(err, ErrAlreadyExists):
		code = connect.CodeAlreadyExists
	case errors.Is(err, fs.ErrPermission):
		code = connect.CodePermissionDenied
	case errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.EDQUOT):
		code = connect.CodeResourceExhausted
	}
	return connect.NewError(code, fmt.Errorf("%s: %w", what, err))
}

func readMetadata(path string) map[string]string {
	size, err := unix.Llistxattr(path, nil)
	if err != nil || size <= 0 {
		return nil
	}
	buf := make([]byte, size)
	size, err = unix.Llistxattr(path, buf)
	if err != nil {
		return nil
	}
	var md map[string]string
	for _, name := range strings.Split(string(buf[:size]), "\x00") {
		if !strings.HasPrefix(name, xattrPrefix) {
			continue
		}
		vbuf := make([]byte, 4096)
		n, err := unix.Lgetxattr(path, name, vbuf)
		if err != nil {
			continue
		}
		if md == nil {
			md = map[string]string{}
		}
		md[strings.TrimPrefix(name, xattrPrefix)] = string(vbuf[:n])
	}
	return md
}

// entryInfo stats path (without following a final symlink).
func entryInfo(path string, names *idNames) (*fspb.EntryInfo, error) {
	fi, err := os.Lstat(path)
	if err != nil {
		return nil, err
	}
	return entryFromInfo(path, fi, names), nil
}

func entryFromInfo(path string, fi fs.FileInfo, names *idNames) *fspb.EntryInfo {
	e := &fspb.EntryInfo{
		Name:         fi.Name(),
		Path:         path,
		Size:         fi.Size(),
		Mode:         uint32(fi.Mode().Perm()),
		Permissions:  fi.Mode().String(),
		ModifiedTime: timestamppb.New(fi.ModTime()),
		Metadata:     readMetadata(path),
	}
	if fi.Mode()&fs.ModeSymlink != 0 {
		// As current envd: the link is flagged, and type and mode are its
		// target's (unspecified when the link dangles). SDKs that read
		// is_symlink report "symlink"; older ones report the target's type.
		e.IsSymlink = true
		target, err := filepath.EvalSymlinks(path)
		if err != nil {
			if t, err2 := os.Readlink(path); err2 == nil {
				if !filepath.IsAbs(t) {
					t = filepath.Join(filepath.Dir(path), t)
				}
				target = t
			}
		}
		if target != "" {
			e.SymlinkTarget = &target
		}
		e.Mode = 0
		if ti, err := os.Stat(path); err == nil {
			e.Type, e.Mode = fileType(ti.Mode()), uint32(ti.Mode().Perm())
		}
	} else {
		e.Type = fileType(fi.Mode())
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		e.Owner = names.user(st.Uid)
		e.Group = names.group(st.Gid)
	}
	return e
}

func fileType(m fs.FileMode) fspb.FileType {
	switch {
	case m.IsDir():
		return fspb.FileType_FILE_TYPE_DIRECTORY
	case m.IsRegular():
		return fspb.FileType_FILE_TYPE_FILE
	}
	return fspb.FileType_FILE_TYPE_UNSPECIFIED
}

// userPath resolves the request user and path.
func (s *filesystemService) userPath(ctx context.Context, p string) (*sysUser, string, error) {
	u, err := s.a.requestUser(ctx)
	if err != nil {
		return nil, "", connect.NewError(connect.CodeUnauthenticated, err)
	}
	path, err := resolvePath(p, u)
	if err != nil {
		return nil, "", connect.NewError(connect.CodeInvalidArgument, err)
	}
	return u, path, nil
}

func (s *filesystemService) Stat(ctx context.Context, req *connect.Request[fspb.StatRequest]) (*connect.Response[fspb.StatResponse], error) {
	u, path, err := s.userPath(ctx, req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	names := s.a.loadIDNames()
	var e *fspb.EntryInfo
	err = asUser(u, func() (err error) { e, err = entryInfo(path, names); return })
	if err != nil {
		return nil, fsError(err, "stat "+path)
	}
	return connect.NewResponse(&fspb.StatResponse{Entry: e}), nil
}

func (s *filesystemService) MakeDir(ctx context.Context, req *connect.Request[fspb.MakeDirRequest]) (*connect.Response[fspb.MakeDirResponse], error) {
	u, path, err := s.userPath(ctx, req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	names := s.a.loadIDNames()
	var e *fspb.EntryInfo
	err = asUser(u, func() error {
		if fi, err := os.Stat(path); err == nil {
			if fi.IsDir() {
				return fmt.Errorf("%w: directory %s", ErrAlreadyExists, path)
			}
			return fmt.Errorf("%w: %s exists and is not a directory", ErrNotDir, path)
		}
		return nil
	})
	if err == nil {
		err = ensureDirs(u, path)
	}
	if err == nil {
		err = asUser(u, func() (err error) { e, err = entryInfo(path, names); return })
	}
	if err != nil {
		return nil, fsError(err, "make dir "+path)
	}
	return connect.NewResponse(&fspb.MakeDirResponse{Entry: e}), nil
}

func (s *filesystemService) Move(ctx context.Context, req *connect.Request[fspb.MoveRequest]) (*connect.Response[fspb.MoveResponse], error) {
	u, src, err := s.userPath(ctx, req.Msg.GetSource())
	if err != nil {
		return nil, err
	}
	dst, err := resolvePath(req.Msg.GetDestination(), u)
	if err != nil {
		return nil, connect.NewError(connect.CodeInvalidArgument, err)
	}
	names := s.a.loadIDNames()
	var e *fspb.EntryInfo
	err = asUser(u, func() error { _, err := os.Lstat(src); return err })
	if err == nil {
		err = ensureDirs(u, filepath.Dir(dst))
	}
	if err == nil {
		err = asUser(u, func() error {
			if err := os.Rename(src, dst); err != nil {
				return err
			}
			var err error
			e, err = entryInfo(dst, names)
			return err
		})
	}
	if err != nil {
		return nil, fsError(err, "move "+src)
	}
	return connect.NewResponse(&fspb.MoveResponse{Entry: e}), nil
}

func (s *filesystemService) ListDir(ctx context.Context, req *connect.Request[fspb.ListDirRequest]) (*connect.Response[fspb.ListDirResponse], error) {
	u, path, err := s.userPath(ctx, req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	depth := int(req.Msg.GetDepth())
	if depth < 1 {
		depth = 1
	}
	names := s.a.loadIDNames()
	var entries []*fspb.EntryInfo
	err = asUser(u, func() error {
		// The listed directory itself may be a symlink to a directory.
		root, err := filepath.EvalSymlinks(path)
		if err != nil {
			return err
		}
		fi, err := os.Stat(root)
		if err != nil {
			return err
		}
		if !fi.IsDir() {
			return fmt.Errorf("%w: %s", ErrNotDir, path)
		}
		var walk func(dir, shown string, level int) error
		walk = func(dir, shown string, level int) error {
			des, err := os.ReadDir(dir)
			if err != nil {
				return err
			}
			for _, de := range des {
				full := filepath.Join(dir, de.Name())
				info, err := de.Info()
				if err != nil {
					continue // vanished meanwhile
				}
				entries = append(entries, entryFromInfo(filepath.Join(shown, de.Name()), info, names))
				// Symlinked directories are not descended into (no loops).
				if de.IsDir() && level < depth {
					if err := walk(full, filepath.Join(shown, de.Name()), level+1); err != nil && !errors.Is(err, fs.ErrPermission) {
						return err
					}
				}
			}
			return nil
		}
		return walk(root, path, 1)
	})
	if err != nil {
		return nil, fsError(err, "list "+path)
	}
	return connect.NewResponse(&fspb.ListDirResponse{Entries: entries}), nil
}

func (s *filesystemService) Remove(ctx context.Context, req *connect.Request[fspb.RemoveRequest]) (*connect.Response[fspb.RemoveResponse], error) {
	u, path, err := s.userPath(ctx, req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	if err := asUser(u, func() error { return os.RemoveAll(path) }); err != nil {
		return nil, fsError(err, "remove "+path)
	}
	return connect.NewResponse(&fspb.RemoveResponse{}), nil
}
