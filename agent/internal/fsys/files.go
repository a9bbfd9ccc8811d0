package fsys

import (
	"compress/gzip"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"os"
	"path/filepath"
	"strings"

	"warren.dev/agent/internal/identity"
	"warren.dev/agent/internal/rpc"
)

// Files serves GET /files (download) and POST /files (upload) of envd's HTTP API.
type Files struct {
	Self *identity.User
}

// httpError is the HTTP API's error body: the status and a message naming the fix.
type httpError struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

// WriteHTTPError answers a plain HTTP call with a JSON error.
func WriteHTTPError(w http.ResponseWriter, status int, format string, args ...any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(httpError{Code: status, Message: fmt.Sprintf(format, args...)})
}

// writeErr maps an error (an *rpc.Error when the cause is known) to an HTTP status.
func writeErr(w http.ResponseWriter, err error) {
	var e *rpc.Error
	status := http.StatusInternalServerError
	if errors.As(err, &e) {
		switch e.Code {
		case rpc.InvalidArgument:
			status = http.StatusBadRequest
		case rpc.NotFound:
			status = http.StatusNotFound
		case rpc.PermissionDenied:
			status = http.StatusForbidden
		case rpc.AlreadyExists:
			status = http.StatusConflict
		}
		WriteHTTPError(w, status, "%s", e.Message)
		return
	}
	if errors.Is(err, errNoSpace) {
		status = http.StatusInsufficientStorage
	}
	WriteHTTPError(w, status, "%v", err)
}

var errNoSpace = errors.New("no space left on the sandbox's disk: free some space or use a larger sandbox")

func (f *Files) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch r.Method {
	case http.MethodGet:
		f.download(w, r)
	case http.MethodPost:
		f.upload(w, r)
	default:
		w.Header().Set("Allow", "GET, POST")
		WriteHTTPError(w, http.StatusMethodNotAllowed, "%s /files: use GET to download or POST to upload", r.Method)
	}
}

func (f *Files) download(w http.ResponseWriter, r *http.Request) {
	user, err := identity.FromRequest(r, f.Self)
	if err != nil {
		writeErr(w, err)
		return
	}
	path, err := user.Resolve(r.URL.Query().Get("path"))
	if err != nil {
		writeErr(w, err)
		return
	}
	file, err := os.Open(path)
	if err != nil {
		writeErr(w, statError(path, err))
		return
	}
	defer file.Close()
	fi, err := file.Stat()
	if err != nil {
		writeErr(w, statError(path, err))
		return
	}
	if fi.IsDir() {
		WriteHTTPError(w, http.StatusBadRequest, "%s is a directory: download files one at a time", path)
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Disposition", mime.FormatMediaType("attachment", map[string]string{"filename": filepath.Base(path)}))
	http.ServeContent(w, r, "", fi.ModTime(), file)
}

// writeInfo is one entry of an upload's answer.
type writeInfo struct {
	Name     string            `json:"name"`
	Type     string            `json:"type"`
	Path     string            `json:"path"`
	Metadata map[string]string `json:"metadata,omitempty"`
}

func (f *Files) upload(w http.ResponseWriter, r *http.Request) {
	user, err := identity.FromRequest(r, f.Self)
	if err != nil {
		writeErr(w, err)
		return
	}
	query := r.URL.Query().Get("path")
	mediaType, params, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	var written []writeInfo
	switch mediaType {
	case "multipart/form-data":
		written, err = f.uploadMultipart(r, user, query, params["boundary"])
	case "application/octet-stream":
		written, err = f.uploadStream(r, user, query)
	default:
		err = rpc.Errorf(rpc.InvalidArgument, "content type %q: upload multipart/form-data or application/octet-stream", mediaType)
	}
	if err != nil {
		writeErr(w, err)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(written)
}

func (f *Files) uploadStream(r *http.Request, user *identity.User, query string) ([]writeInfo, error) {
	if query == "" {
		return nil, rpc.Errorf(rpc.InvalidArgument, "an application/octet-stream upload needs ?path= naming the file")
	}
	body := io.Reader(r.Body)
	switch enc := strings.ToLower(r.Header.Get("Content-Encoding")); enc {
	case "", "identity":
	case "gzip":
		gz, err := gzip.NewReader(r.Body)
		if err != nil {
			return nil, rpc.Errorf(rpc.InvalidArgument, "the body is not gzip: %v", err)
		}
		defer gz.Close()
		body = gz
	default:
		return nil, rpc.Errorf(rpc.InvalidArgument, "Content-Encoding %q: send gzip or no encoding", enc)
	}
	info, err := writeFile(user, query, body, metadataFrom(r.Header))
	if err != nil {
		return nil, err
	}
	return []writeInfo{info}, nil
}

func (f *Files) uploadMultipart(r *http.Request, user *identity.User, query, boundary string) ([]writeInfo, error) {
	if boundary == "" {
		return nil, rpc.Errorf(rpc.InvalidArgument, "the multipart upload has no boundary in its Content-Type")
	}
	reader, err := r.MultipartReader()
	if err != nil {
		return nil, rpc.Errorf(rpc.InvalidArgument, "reading the multipart upload: %v", err)
	}
	written := []writeInfo{}
	for {
		part, err := reader.NextPart()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, rpc.Errorf(rpc.InvalidArgument, "reading the multipart upload: %v", err)
		}
		if part.FormName() != "file" {
			part.Close()
			continue
		}
		target := partPath(part)
		if query != "" {
			if len(written) > 0 {
				return nil, rpc.Errorf(rpc.InvalidArgument, "?path= names one file but the upload has several: give each part its path as its filename")
			}
			target = query
		}
		if target == "" {
			return nil, rpc.Errorf(rpc.InvalidArgument, "a multipart file part has no filename: name its path there or in ?path=")
		}
		info, err := writeFile(user, target, part, metadataFrom(r.Header))
		part.Close()
		if err != nil {
			return nil, err
		}
		written = append(written, info)
	}
	if len(written) == 0 {
		return nil, rpc.Errorf(rpc.InvalidArgument, "the multipart upload has no part named \"file\"")
	}
	return written, nil
}

// partPath is a part's filename as sent: the SDK puts the file's whole path
// there, which multipart.Part.FileName would cut to its base name.
func partPath(part *multipart.Part) string {
	_, params, err := mime.ParseMediaType(part.Header.Get("Content-Disposition"))
	if err != nil {
		return ""
	}
	return params["filename"]
}

// writeFile writes a file through a temporary file beside it, renamed into place.
// Metadata, when given, is stored on the new file.
func writeFile(user *identity.User, name string, body io.Reader, md map[string]string) (writeInfo, error) {
	path, err := user.Resolve(name)
	if err != nil {
		return writeInfo{}, err
	}
	if fi, err := os.Stat(path); err == nil && fi.IsDir() {
		return writeInfo{}, rpc.Errorf(rpc.InvalidArgument, "%s is a directory: upload to a file path", path)
	}
	if err := mkdirAs(user, filepath.Dir(path)); err != nil {
		return writeInfo{}, err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".upload-*")
	if err != nil {
		return writeInfo{}, statError(path, err)
	}
	defer os.Remove(tmp.Name())
	if _, err := io.Copy(tmp, body); err != nil {
		tmp.Close()
		if strings.Contains(err.Error(), "no space left") {
			return writeInfo{}, errNoSpace
		}
		return writeInfo{}, rpc.Errorf(rpc.InvalidArgument, "writing %s: %v", path, err)
	}
	if err := tmp.Close(); err != nil {
		return writeInfo{}, statError(path, err)
	}
	mode := os.FileMode(0o644)
	if fi, err := os.Stat(path); err == nil {
		mode = fi.Mode().Perm() // an overwrite keeps the file's mode
	}
	if err := os.Chmod(tmp.Name(), mode); err != nil {
		return writeInfo{}, statError(path, err)
	}
	if err := user.Chown(tmp.Name()); err != nil {
		return writeInfo{}, statError(path, err)
	}
	if err := setMetadata(tmp.Name(), md); err != nil {
		return writeInfo{}, err
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return writeInfo{}, statError(path, err)
	}
	return writeInfo{Name: filepath.Base(path), Type: "file", Path: path, Metadata: md}, nil
}
