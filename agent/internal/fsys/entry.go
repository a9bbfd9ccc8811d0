// Package fsys serves envd's filesystem.Filesystem service and the /files
// upload and download endpoints, acting on paths as the call's user resolves them.
package fsys

import (
	"errors"
	"io/fs"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"syscall"

	"warren.dev/agent/internal/rpc"
)

// statError names what went wrong with a path in the code the SDK maps.
func statError(path string, err error) error {
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return rpc.Errorf(rpc.NotFound, "%s does not exist", path)
	case errors.Is(err, fs.ErrPermission):
		return rpc.Errorf(rpc.PermissionDenied, "%s: permission denied", path)
	case errors.Is(err, fs.ErrExist):
		return rpc.Errorf(rpc.AlreadyExists, "%s already exists", path)
	case errors.Is(err, syscall.ENOTDIR):
		return rpc.Errorf(rpc.InvalidArgument, "%s: a component of the path is not a directory", path)
	}
	return rpc.Errorf(rpc.Internal, "%s: %v", path, err)
}

func typeOf(m fs.FileMode) FileType {
	switch {
	case m.IsDir():
		return FileTypeDirectory
	case m&fs.ModeSymlink != 0:
		return FileTypeSymlink
	default:
		return FileTypeFile
	}
}

// entry describes a path without following a final symlink's name, as envd
// does: a symlink reports its target's type and size, with isSymlink and the
// target set.
func entry(path string) (*EntryInfo, error) {
	fi, err := os.Lstat(path)
	if err != nil {
		return nil, statError(path, err)
	}
	e := &EntryInfo{Name: filepath.Base(path), Path: path}
	if fi.Mode()&fs.ModeSymlink != 0 {
		e.IsSymlink = true
		if target, err := filepath.EvalSymlinks(path); err == nil {
			e.SymlinkTarget = &target
		} else if raw, err := os.Readlink(path); err == nil {
			e.SymlinkTarget = &raw
		}
		if followed, err := os.Stat(path); err == nil {
			fi = followed
		}
	}
	fill(e, fi)
	e.Metadata = metadataOf(path)
	return e, nil
}

func fill(e *EntryInfo, fi fs.FileInfo) {
	e.Type = typeOf(fi.Mode())
	e.Size = rpc.Int64(fi.Size())
	e.Mode = uint32(fi.Mode().Perm())
	e.Permissions = fi.Mode().String()
	mtime := Timestamp(fi.ModTime())
	e.ModifiedTime = &mtime
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		e.Owner = strconv.FormatUint(uint64(st.Uid), 10)
		if u, err := user.LookupId(e.Owner); err == nil {
			e.Owner = u.Username
		}
		e.Group = strconv.FormatUint(uint64(st.Gid), 10)
		if g, err := user.LookupGroupId(e.Group); err == nil {
			e.Group = g.Name
		}
	}
}
