// Package server puts the agent's services on one handler: the Connect services
// process.Process and filesystem.Filesystem, GET /health, /files and /metrics,
// every route but /health behind the access token when the agent has one. An
// agent in a pool pod starts without one and learns it from POST /claim.
package server

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"net/http"
	"strings"

	"warren.dev/agent/internal/fsys"
	"warren.dev/agent/internal/identity"
	"warren.dev/agent/internal/metrics"
	"warren.dev/agent/internal/proc"
	"warren.dev/agent/internal/rpc"
)

// TokenHeader carries the access token on every call.
const TokenHeader = "X-Access-Token"

// Config is what the handler needs.
type Config struct {
	// AccessToken, when not empty, is required on every call but /health.
	AccessToken string
	// AccessTokenSHA256 instead names the token by its SHA-256 (hex), so the
	// token itself appears nowhere the agent's starter could leave it (a pod's
	// spec, a process list).
	AccessTokenSHA256 string
	// ClaimTokenSHA256, when not empty, starts the agent unclaimed (a pool pod):
	// it serves only /health and POST /claim, whose X-Claim-Token must have this
	// SHA-256 (hex), until that claim sets the access token.
	ClaimTokenSHA256 string
	Self             *identity.User
	// Metrics serves GET /metrics from its samples; without one, /metrics is 404.
	Metrics *metrics.Sampler
}

// New returns the agent's handler.
func New(cfg Config) http.Handler {
	mux := http.NewServeMux()
	(&proc.Service{Procs: proc.NewManager(), Self: cfg.Self}).Register(mux)
	(&fsys.Service{Self: cfg.Self}).Register(mux)
	mux.Handle("/files", &fsys.Files{Self: cfg.Self})
	mux.Handle("/metrics", serveMetrics(cfg.Metrics))
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		if isRPC(r.URL.Path) {
			rpc.WriteError(w, rpc.Errorf(rpc.Unimplemented, "%s is not a method this agent serves", r.URL.Path))
			return
		}
		fsys.WriteHTTPError(w, http.StatusNotFound, "%s %s: no such route (the agent serves /health, /files, /metrics and its Connect services)", r.Method, r.URL.Path)
	})

	var pool *claim
	if cfg.ClaimTokenSHA256 != "" {
		pool = &claim{tokenSHA256: cfg.ClaimTokenSHA256}
		if cfg.Metrics != nil {
			// Only now: a workspace bound beneath a running gVisor container at the claim
			// must not have been looked up before it is there (see main.go).
			pool.onClaim = func() { cfg.Metrics.MeasureDisk(metrics.DefaultDiskPath()) }
		}
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/claim" && pool != nil {
			pool.serve(w, r)
			return
		}
		if r.URL.Path == "/health" {
			if r.Method != http.MethodGet && r.Method != http.MethodHead {
				fsys.WriteHTTPError(w, http.StatusMethodNotAllowed, "%s /health: use GET", r.Method)
				return
			}
			w.WriteHeader(http.StatusNoContent)
			return
		}
		accepted := cfg.tokenAccepted
		if pool != nil {
			access, claimed := pool.claimed()
			accepted = func(got string) bool { return claimed && hashAccepted(got, access) }
		}
		if !accepted(r.Header.Get(TokenHeader)) {
			const msg = "missing or wrong " + TokenHeader + " header: send the sandbox's access token"
			if isRPC(r.URL.Path) {
				rpc.WriteError(w, rpc.Errorf(rpc.Unauthenticated, "%s", msg))
			} else {
				fsys.WriteHTTPError(w, http.StatusUnauthorized, "%s", msg)
			}
			return
		}
		mux.ServeHTTP(w, r)
	})
}

// tokenAccepted says whether a call's token is the one the agent requires
// (any, when it requires none), compared in constant time.
func (cfg Config) tokenAccepted(got string) bool {
	switch {
	case cfg.AccessTokenSHA256 != "":
		return hashAccepted(got, cfg.AccessTokenSHA256)
	case cfg.AccessToken != "":
		return subtle.ConstantTimeCompare([]byte(got), []byte(cfg.AccessToken)) == 1
	default:
		return true
	}
}

// hashAccepted says whether got's SHA-256 is want (hex), in constant time.
func hashAccepted(got, want string) bool {
	sum := sha256.Sum256([]byte(got))
	return subtle.ConstantTimeCompare([]byte(hex.EncodeToString(sum[:])), []byte(want)) == 1
}

// isRPC tells a Connect call (/<package.Service>/<Method>) from a plain HTTP route.
func isRPC(path string) bool {
	first, _, found := strings.Cut(strings.TrimPrefix(path, "/"), "/")
	return found && strings.Contains(first, ".")
}
