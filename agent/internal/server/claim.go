package server

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"regexp"
	"sync"

	"warren.dev/agent/internal/fsys"
)

// ClaimHeader carries the claim token on POST /claim.
const ClaimHeader = "X-Claim-Token"

// maxClaimBody bounds a claim's body: a token hash and the environment.
const maxClaimBody = 1 << 20

var (
	hexSHA256 = regexp.MustCompile(`^[0-9a-f]{64}$`)
	envName   = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
)

// ClaimRequest is the body of POST /claim: who the sandbox is from now on.
type ClaimRequest struct {
	// AccessTokenSHA256 names the sandbox's access token by its SHA-256 (hex).
	AccessTokenSHA256 string `json:"accessTokenSha256"`
	// EnvVars join the environment of every process started after the claim.
	EnvVars map[string]string `json:"envVars"`
}

// claim is the identity of an agent started in a pool pod, before any sandbox
// was chosen for it: it answers nothing but /health and one POST /claim, made by
// whoever holds the claim token (the controller that made the pod). The claim
// sets the access token every later call needs; a second claim is refused, so a
// pod serves one sandbox for its whole life.
type claim struct {
	tokenSHA256 string // of the claim token; the token itself is known only to the claimer
	mu          sync.Mutex
	access      string // the sandbox's access token hash, once claimed
	onClaim     func() // after a claim succeeds, if set
}

func (c *claim) claimed() (string, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.access, c.access != ""
}

func (c *claim) serve(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		fsys.WriteHTTPError(w, http.StatusMethodNotAllowed, "%s /claim: use POST", r.Method)
		return
	}
	sum := sha256.Sum256([]byte(r.Header.Get(ClaimHeader)))
	if subtle.ConstantTimeCompare([]byte(hex.EncodeToString(sum[:])), []byte(c.tokenSHA256)) != 1 {
		fsys.WriteHTTPError(w, http.StatusUnauthorized, "missing or wrong %s header: only the pod's maker claims it", ClaimHeader)
		return
	}
	var req ClaimRequest
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxClaimBody)).Decode(&req); err != nil {
		fsys.WriteHTTPError(w, http.StatusBadRequest, "the claim is not JSON {accessTokenSha256, envVars}: %v", err)
		return
	}
	if err := req.validate(); err != nil {
		fsys.WriteHTTPError(w, http.StatusBadRequest, "%v", err)
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.access != "" {
		fsys.WriteHTTPError(w, http.StatusConflict, "this agent is claimed already: a pool pod serves one sandbox")
		return
	}
	for name, value := range req.EnvVars {
		if err := os.Setenv(name, value); err != nil {
			fsys.WriteHTTPError(w, http.StatusBadRequest, "setting $%s: %v", name, err)
			return
		}
	}
	c.access = req.AccessTokenSHA256
	if c.onClaim != nil {
		c.onClaim()
	}
	w.WriteHeader(http.StatusNoContent)
}

func (req ClaimRequest) validate() error {
	if !hexSHA256.MatchString(req.AccessTokenSHA256) {
		return fmt.Errorf("accessTokenSha256 %q: give 64 lower-case hex digits", req.AccessTokenSHA256)
	}
	for name := range req.EnvVars {
		if !envName.MatchString(name) {
			return fmt.Errorf("envVars: %q is not a variable name (letters, digits and _, not first a digit)", name)
		}
	}
	return nil
}
