package identity

import (
	"encoding/base64"
	"errors"
	"net/http/httptest"
	"testing"

	"warren.dev/agent/internal/rpc"
)

func TestResolve(t *testing.T) {
	u := &User{Name: "me", Home: "/home/me"}
	for in, want := range map[string]string{
		"~": "/home/me", "~/a": "/home/me/a", "rel/x": "/home/me/rel/x", "/abs/../etc": "/etc",
	} {
		if got, err := u.Resolve(in); err != nil || got != want {
			t.Fatalf("Resolve(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	if _, err := u.Resolve(""); err == nil {
		t.Fatal("an empty path must be refused")
	}
}

func TestFromRequest(t *testing.T) {
	self := &User{Name: "me", UID: 1000, Home: "/home/me"}
	req := httptest.NewRequest("POST", "/x", nil)
	if u, err := FromRequest(req, self); err != nil || u != self {
		t.Fatalf("no header: %v, %v; want the agent's own user", u, err)
	}
	req.Header.Set("Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte("me:")))
	if u, err := FromRequest(req, self); err != nil || u != self {
		t.Fatalf("naming the agent's user: %v, %v", u, err)
	}
	req.Header.Set("Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte("root:")))
	_, err := FromRequest(req, self)
	var e *rpc.Error
	if !errors.As(err, &e) || e.Code != rpc.PermissionDenied {
		t.Fatalf("another user without root: %v; want permission_denied", err)
	}
	req.Header.Set("Authorization", "Bearer x")
	if _, err := FromRequest(req, self); !errors.As(err, &e) || e.Code != rpc.InvalidArgument {
		t.Fatalf("a non-Basic header: %v; want invalid_argument", err)
	}
}
