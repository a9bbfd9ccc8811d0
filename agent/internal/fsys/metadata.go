package fsys

import (
	"bytes"
	"errors"
	"net/http"
	"strings"
	"syscall"

	"warren.dev/agent/internal/rpc"
)

// File metadata is kept as `user.e2b.<key>` extended attributes, as envd keeps
// it; uploads carry it in `X-Metadata-<key>` headers. Header names are
// case-insensitive (HTTP/2 lowercases them), so keys are stored lowercase.
const (
	metadataHeader = "X-Metadata-"
	metadataXattr  = "user.e2b."
)

// metadataFrom reads an upload's metadata headers.
func metadataFrom(h http.Header) map[string]string {
	var md map[string]string
	for name, values := range h {
		if len(name) > len(metadataHeader) && strings.EqualFold(name[:len(metadataHeader)], metadataHeader) && len(values) > 0 {
			if md == nil {
				md = map[string]string{}
			}
			md[strings.ToLower(name[len(metadataHeader):])] = values[0]
		}
	}
	return md
}

// setMetadata stores metadata on a file.
func setMetadata(path string, md map[string]string) error {
	for k, v := range md {
		if err := syscall.Setxattr(path, metadataXattr+k, []byte(v), 0); err != nil {
			if errors.Is(err, syscall.ENOTSUP) {
				return rpc.Errorf(rpc.InvalidArgument, "the filesystem under %s does not keep user extended attributes: upload without metadata", path)
			}
			return rpc.Errorf(rpc.Internal, "storing metadata %q on %s: %v", k, path, err)
		}
	}
	return nil
}

// metadataOf reads a file's metadata (following a symlink); nil when it has none.
func metadataOf(path string) map[string]string {
	size, err := syscall.Listxattr(path, nil)
	if err != nil || size == 0 {
		return nil
	}
	names := make([]byte, size)
	if size, err = syscall.Listxattr(path, names); err != nil {
		return nil
	}
	var md map[string]string
	for _, name := range bytes.Split(names[:size], []byte{0}) {
		key, ok := strings.CutPrefix(string(name), metadataXattr)
		if !ok || key == "" {
			continue
		}
		value := make([]byte, 4096)
		n, err := syscall.Getxattr(path, string(name), value)
		if err != nil {
			continue
		}
		if md == nil {
			md = map[string]string{}
		}
		md[key] = string(value[:n])
	}
	return md
}
