package server

import (
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"

	"warren.dev/agent/internal/identity"
)

const claimToken = "the-controllers-claim-token"

func hexSum(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

// call makes one request with the given headers; the status code.
func call(t *testing.T, method, url, body string, headers map[string]string) int {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	return res.StatusCode
}

func unclaimed(t *testing.T) string {
	t.Helper()
	self, err := identity.Self()
	if err != nil {
		t.Fatal(err)
	}
	self.Home = t.TempDir()
	srv := httptest.NewServer(New(Config{ClaimTokenSHA256: hexSum(claimToken), Self: self}))
	t.Cleanup(srv.Close)
	return srv.URL
}

func TestAnUnclaimedAgentServesNothingButHealthAndTheClaim(t *testing.T) {
	url := unclaimed(t)
	if got := call(t, http.MethodGet, url+"/health", "", nil); got != http.StatusNoContent {
		t.Fatalf("/health: %d", got)
	}
	// No token opens it before the claim, not even the claim token.
	for _, sent := range []string{"", token, claimToken} {
		got := call(t, http.MethodPost, url+"/process.Process/List", `{}`, map[string]string{TokenHeader: sent})
		if got != http.StatusUnauthorized {
			t.Errorf("List with token %q before the claim: %d, want 401", sent, got)
		}
	}
}

func TestAClaimSetsTheAccessTokenAndTheEnvironmentOnce(t *testing.T) {
	url := unclaimed(t)
	body := `{"accessTokenSha256": "` + hexSum(token) + `", "envVars": {"WARREN_CLAIM_TEST": "one"}}`
	t.Cleanup(func() { os.Unsetenv("WARREN_CLAIM_TEST") })
	for _, tc := range []struct {
		name, body, claim string
		want              int
	}{
		{"no claim token", body, "", http.StatusUnauthorized},
		{"wrong claim token", body, claimToken + "x", http.StatusUnauthorized},
		{"the hash for the token", body, hexSum(claimToken), http.StatusUnauthorized},
		{"not JSON", `{`, claimToken, http.StatusBadRequest},
		{"no access token", `{"envVars": {}}`, claimToken, http.StatusBadRequest},
		{"a bad variable name", `{"accessTokenSha256": "` + hexSum(token) + `", "envVars": {"A=B": "x"}}`, claimToken, http.StatusBadRequest},
	} {
		if got := call(t, http.MethodPost, url+"/claim", tc.body, map[string]string{ClaimHeader: tc.claim}); got != tc.want {
			t.Errorf("%s: %d, want %d", tc.name, got, tc.want)
		}
	}
	if os.Getenv("WARREN_CLAIM_TEST") != "" {
		t.Fatal("a refused claim changed the environment")
	}
	if got := call(t, http.MethodPost, url+"/claim", body, map[string]string{ClaimHeader: claimToken}); got != http.StatusNoContent {
		t.Fatalf("the claim: %d", got)
	}
	if got := os.Getenv("WARREN_CLAIM_TEST"); got != "one" {
		t.Fatalf("$WARREN_CLAIM_TEST after the claim: %q", got)
	}
	list := func(sent string) int {
		return call(t, http.MethodPost, url+"/process.Process/List", `{}`, map[string]string{TokenHeader: sent})
	}
	if got := list(token); got != http.StatusOK {
		t.Fatalf("List with the claimed token: %d", got)
	}
	if got := list(claimToken); got != http.StatusUnauthorized {
		t.Fatalf("List with the claim token: %d", got)
	}
	// A second claim, even the claimer's own with another sandbox's token, is refused.
	other := `{"accessTokenSha256": "` + hexSum("another") + `", "envVars": {"WARREN_CLAIM_TEST": "two"}}`
	if got := call(t, http.MethodPost, url+"/claim", other, map[string]string{ClaimHeader: claimToken}); got != http.StatusConflict {
		t.Fatalf("a second claim: %d, want 409", got)
	}
	if list("another") != http.StatusUnauthorized || list(token) != http.StatusOK || os.Getenv("WARREN_CLAIM_TEST") != "one" {
		t.Fatal("a refused second claim changed the agent")
	}
}

func TestAnAgentThatIsNotAPoolPodHasNoClaim(t *testing.T) {
	a := start(t)
	body := `{"accessTokenSha256": "` + hexSum("mine") + `"}`
	got := call(t, http.MethodPost, a.url+"/claim", body, map[string]string{ClaimHeader: claimToken, TokenHeader: token})
	if got != http.StatusNotFound {
		t.Fatalf("/claim on an agent with its token: %d, want 404", got)
	}
}
