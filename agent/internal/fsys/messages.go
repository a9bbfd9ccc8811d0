package fsys

import (
	"encoding/json"
	"time"

	"warren.dev/agent/internal/rpc"
)

// The messages of envd's filesystem.Filesystem service, in protobuf's JSON mapping.

// FileType is the filesystem.FileType enum.
type FileType int32

const (
	FileTypeUnspecified FileType = 0
	FileTypeFile        FileType = 1
	FileTypeDirectory   FileType = 2
	FileTypeSymlink     FileType = 3
)

var fileTypeNames = []string{"FILE_TYPE_UNSPECIFIED", "FILE_TYPE_FILE", "FILE_TYPE_DIRECTORY", "FILE_TYPE_SYMLINK"}

func (t FileType) MarshalJSON() ([]byte, error) {
	if int(t) < len(fileTypeNames) && t >= 0 {
		return json.Marshal(fileTypeNames[t])
	}
	return json.Marshal(int32(t))
}

// Timestamp is google.protobuf.Timestamp: an RFC 3339 string in UTC.
type Timestamp time.Time

func (t Timestamp) MarshalJSON() ([]byte, error) {
	return json.Marshal(time.Time(t).UTC().Format(time.RFC3339Nano))
}

type EntryInfo struct {
	Name          string            `json:"name"`
	Type          FileType          `json:"type"`
	Path          string            `json:"path"`
	Size          rpc.Int64         `json:"size"`
	Mode          uint32            `json:"mode"`
	Permissions   string            `json:"permissions"`
	Owner         string            `json:"owner"`
	Group         string            `json:"group"`
	ModifiedTime  *Timestamp        `json:"modifiedTime,omitempty"`
	SymlinkTarget *string           `json:"symlinkTarget,omitempty"`
	Metadata      map[string]string `json:"metadata,omitempty"`
	IsSymlink     bool              `json:"isSymlink"`
}

type StatRequest struct {
	Path string `json:"path"`
}

type StatResponse struct {
	Entry *EntryInfo `json:"entry"`
}

type ListDirRequest struct {
	Path  string     `json:"path"`
	Depth rpc.Uint32 `json:"depth"`
}

type ListDirResponse struct {
	Entries []*EntryInfo `json:"entries"`
}

type MakeDirRequest struct {
	Path string `json:"path"`
}

type MakeDirResponse struct {
	Entry *EntryInfo `json:"entry"`
}

type MoveRequest struct {
	Source      string `json:"source"`
	Destination string `json:"destination"`
}

type MoveResponse struct {
	Entry *EntryInfo `json:"entry"`
}

type RemoveRequest struct {
	Path string `json:"path"`
}

type RemoveResponse struct{}
