// Package identity resolves the user a call acts as. The SDK names it in an
// `Authorization: Basic base64(user:)` header; no header means the user the
// agent runs as. Acting as another user needs the agent to run as root: when it
// does not, such a call is refused rather than silently run as the agent's user.
package identity

import (
	"encoding/base64"
	"fmt"
	"net/http"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"warren.dev/agent/internal/rpc"
)

// User is who a call acts as.
type User struct {
	Name string
	UID  uint32
	GID  uint32
	Home string
	// Switch is true when the process must change to this user (the agent is
	// root and the user is someone else).
	Switch bool
}

// Self is the user the agent runs as.
func Self() (*User, error) {
	u, err := user.Current()
	if err != nil {
		return nil, fmt.Errorf("finding the agent's own user: %w", err)
	}
	return fromOS(u, false)
}

func fromOS(u *user.User, switchTo bool) (*User, error) {
	uid, err := strconv.ParseUint(u.Uid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("user %s has a non-numeric uid %q", u.Username, u.Uid)
	}
	gid, err := strconv.ParseUint(u.Gid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("user %s has a non-numeric gid %q", u.Username, u.Gid)
	}
	home := u.HomeDir
	if !switchTo {
		if h, err := os.UserHomeDir(); err == nil {
			home = h // the agent's own $HOME wins for its own user
		}
	}
	return &User{Name: u.Username, UID: uint32(uid), GID: uint32(gid), Home: home, Switch: switchTo}, nil
}

// FromRequest resolves the user a request names, or the agent's own user.
func FromRequest(r *http.Request, self *User) (*User, error) {
	name := r.URL.Query().Get("username")
	if auth := r.Header.Get("Authorization"); name == "" && auth != "" {
		raw, ok := strings.CutPrefix(auth, "Basic ")
		if !ok {
			return nil, rpc.Errorf(rpc.InvalidArgument, "the Authorization header must be Basic base64(user:)")
		}
		decoded, err := base64.StdEncoding.DecodeString(strings.TrimSpace(raw))
		if err != nil {
			return nil, rpc.Errorf(rpc.InvalidArgument, "the Authorization header is not base64: %v", err)
		}
		name, _, _ = strings.Cut(string(decoded), ":")
	}
	return Lookup(name, self)
}

// Lookup resolves a user name ("" is the agent's own user).
func Lookup(name string, self *User) (*User, error) {
	if name == "" || name == self.Name {
		return self, nil
	}
	u, err := user.Lookup(name)
	if err != nil {
		return nil, rpc.Errorf(rpc.InvalidArgument, "user %q does not exist in this sandbox: %v", name, err)
	}
	if self.UID != 0 {
		return nil, rpc.Errorf(rpc.PermissionDenied,
			"the agent runs as %s and can act as %s only when it runs as root: omit the user, or run the agent as root", self.Name, name)
	}
	return fromOS(u, true)
}

// Credential is the process credential to run as this user, or nil for the agent's own.
func (u *User) Credential() *syscall.Credential {
	if !u.Switch {
		return nil
	}
	return &syscall.Credential{Uid: u.UID, Gid: u.GID}
}

// Resolve makes a path absolute: `~` and relative paths are under the user's home.
func (u *User) Resolve(path string) (string, error) {
	if path == "" {
		return "", rpc.Errorf(rpc.InvalidArgument, "the path is empty: name a file or directory")
	}
	if path == "~" {
		return u.Home, nil
	}
	if rest, ok := strings.CutPrefix(path, "~/"); ok {
		return filepath.Join(u.Home, rest), nil
	}
	if !filepath.IsAbs(path) {
		return filepath.Join(u.Home, path), nil
	}
	return filepath.Clean(path), nil
}

// Chown gives a path to the user when the agent acts for someone else.
func (u *User) Chown(path string) error {
	if !u.Switch {
		return nil
	}
	return os.Lchown(path, int(u.UID), int(u.GID))
}
