package fsys

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"sort"

	"warren.dev/agent/internal/identity"
	"warren.dev/agent/internal/rpc"
)

// Service is filesystem.Filesystem over Connect.
type Service struct {
	Self     *identity.User
	watchers watchers
}

// Register mounts the service's methods on a mux.
func (s *Service) Register(mux *http.ServeMux) {
	mux.Handle("/filesystem.Filesystem/Stat", rpc.Unary(s.stat))
	mux.Handle("/filesystem.Filesystem/ListDir", rpc.Unary(s.listDir))
	mux.Handle("/filesystem.Filesystem/MakeDir", rpc.Unary(s.makeDir))
	mux.Handle("/filesystem.Filesystem/Move", rpc.Unary(s.move))
	mux.Handle("/filesystem.Filesystem/Remove", rpc.Unary(s.remove))
	mux.Handle("/filesystem.Filesystem/WatchDir", rpc.ServerStream(s.watchDir))
	mux.Handle("/filesystem.Filesystem/CreateWatcher", rpc.Unary(s.createWatcher))
	mux.Handle("/filesystem.Filesystem/GetWatcherEvents", rpc.Unary(s.getWatcherEvents))
	mux.Handle("/filesystem.Filesystem/RemoveWatcher", rpc.Unary(s.removeWatcher))
}

// resolve finds the call's user and makes its path absolute.
func (s *Service) resolve(r *http.Request, path string) (*identity.User, string, error) {
	user, err := identity.FromRequest(r, s.Self)
	if err != nil {
		return nil, "", err
	}
	abs, err := user.Resolve(path)
	return user, abs, err
}

func (s *Service) stat(_ context.Context, r *http.Request, req *StatRequest) (*StatResponse, error) {
	_, path, err := s.resolve(r, req.Path)
	if err != nil {
		return nil, err
	}
	e, err := entry(path)
	if err != nil {
		return nil, err
	}
	return &StatResponse{Entry: e}, nil
}

func (s *Service) listDir(ctx context.Context, r *http.Request, req *ListDirRequest) (*ListDirResponse, error) {
	_, root, err := s.resolve(r, req.Path)
	if err != nil {
		return nil, err
	}
	depth := int(req.Depth)
	if depth < 1 {
		depth = 1
	}
	fi, err := os.Stat(root)
	if err != nil {
		return nil, statError(root, err)
	}
	if !fi.IsDir() {
		return nil, rpc.Errorf(rpc.InvalidArgument, "%s is not a directory: list a directory, or stat a file", root)
	}
	entries := []*EntryInfo{}
	var walk func(dir string, level int) error
	walk = func(dir string, level int) error {
		if err := ctx.Err(); err != nil {
			return err
		}
		names, err := os.ReadDir(dir)
		if err != nil {
			return statError(dir, err)
		}
		for _, d := range names {
			path := filepath.Join(dir, d.Name())
			e, err := entry(path)
			if err != nil {
				continue // removed while listing
			}
			entries = append(entries, e)
			if d.IsDir() && level < depth {
				if err := walk(path, level+1); err != nil {
					return err
				}
			}
		}
		return nil
	}
	if err := walk(root, 1); err != nil {
		return nil, err
	}
	sort.Slice(entries, func(i, j int) bool { return entries[i].Path < entries[j].Path })
	return &ListDirResponse{Entries: entries}, nil
}

// mkdirAs makes a directory and its missing parents, owned by the user.
func mkdirAs(user *identity.User, path string) error {
	missing := []string{}
	for p := path; ; p = filepath.Dir(p) {
		if _, err := os.Lstat(p); err == nil || p == filepath.Dir(p) {
			break
		}
		missing = append(missing, p)
	}
	if err := os.MkdirAll(path, 0o755); err != nil {
		return statError(path, err)
	}
	for _, p := range missing {
		if err := user.Chown(p); err != nil {
			return statError(p, err)
		}
	}
	return nil
}

func (s *Service) makeDir(_ context.Context, r *http.Request, req *MakeDirRequest) (*MakeDirResponse, error) {
	user, path, err := s.resolve(r, req.Path)
	if err != nil {
		return nil, err
	}
	if fi, err := os.Stat(path); err == nil {
		if fi.IsDir() {
			return nil, rpc.Errorf(rpc.AlreadyExists, "directory %s already exists", path)
		}
		return nil, rpc.Errorf(rpc.InvalidArgument, "%s exists and is not a directory", path)
	}
	if err := mkdirAs(user, path); err != nil {
		return nil, err
	}
	e, err := entry(path)
	if err != nil {
		return nil, err
	}
	return &MakeDirResponse{Entry: e}, nil
}

func (s *Service) move(_ context.Context, r *http.Request, req *MoveRequest) (*MoveResponse, error) {
	user, src, err := s.resolve(r, req.Source)
	if err != nil {
		return nil, err
	}
	dst, err := user.Resolve(req.Destination)
	if err != nil {
		return nil, err
	}
	if _, err := os.Lstat(src); err != nil {
		return nil, statError(src, err)
	}
	if err := mkdirAs(user, filepath.Dir(dst)); err != nil {
		return nil, err
	}
	if err := os.Rename(src, dst); err != nil {
		return nil, statError(dst, err)
	}
	e, err := entry(dst)
	if err != nil {
		return nil, err
	}
	return &MoveResponse{Entry: e}, nil
}

func (s *Service) remove(_ context.Context, r *http.Request, req *RemoveRequest) (*RemoveResponse, error) {
	_, path, err := s.resolve(r, req.Path)
	if err != nil {
		return nil, err
	}
	if _, err := os.Lstat(path); err != nil {
		return nil, statError(path, err)
	}
	if err := os.RemoveAll(path); err != nil {
		return nil, statError(path, err)
	}
	return &RemoveResponse{}, nil
}
