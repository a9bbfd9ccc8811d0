// Command agent is Warren's in-sandbox agent. It serves, on one TCP port, the
// process and filesystem Connect services and the /health and /files HTTP
// routes of E2B's envd, so E2B's SDKs drive a Warren sandbox unchanged.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"warren.dev/agent/internal/identity"
	"warren.dev/agent/internal/metrics"
	"warren.dev/agent/internal/server"
)

// tokenEnv names the environment variable that may carry the access token,
// so it need not appear in the process list.
const tokenEnv = "WARREN_AGENT_ACCESS_TOKEN"

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "agent:", err)
		os.Exit(1)
	}
}

func run() error {
	listen := flag.String("listen", "", "address to listen on (default: all interfaces, -port)")
	port := flag.Int("port", 49983, "TCP port to serve on (envd's)")
	token := flag.String("access-token", "", "require this X-Access-Token on every call but /health (default: $"+tokenEnv+")")
	tokenSHA256 := flag.String("access-token-sha256", "", "require an X-Access-Token whose SHA-256 is this `HEX` (the token itself need appear nowhere)")
	claimSHA256 := flag.String("claim-token-sha256", "", "start unclaimed (a pool pod): serve only /health and one POST /claim with an X-Claim-Token whose SHA-256 is this `HEX`, which sets the access token")
	detached := flag.Bool("detach", false, "start the agent in a session of its own and return once it answers /health (for a container's postStart hook)")
	installDir := flag.String("install", "", "copy this executable into `DIR` as DIR/"+installName+" (mode 0755) and exit, serving nothing")
	hold := flag.Bool("hold", false, "serve nothing and wait for SIGTERM (the placeholder process that keeps a warm pool pod's sandbox up until its claim starts the sandbox's own container)")
	flag.Parse()
	if *hold {
		ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
		defer stop()
		<-ctx.Done()
		return nil
	}
	if *installDir != "" {
		path, err := install(*installDir)
		if err != nil {
			return err
		}
		slog.New(slog.NewJSONHandler(os.Stderr, nil)).Info("installed", "path", path)
		return nil
	}
	if *token == "" {
		*token = os.Getenv(tokenEnv)
	}
	if *tokenSHA256 != "" {
		if !validSHA256(*tokenSHA256) {
			return fmt.Errorf("-access-token-sha256 %q: give 64 lower-case hex digits", *tokenSHA256)
		}
		if *token != "" {
			return errors.New("give the token (-access-token or $" + tokenEnv + ") or its -access-token-sha256, not both")
		}
	}
	if *claimSHA256 != "" {
		if !validSHA256(*claimSHA256) {
			return fmt.Errorf("-claim-token-sha256 %q: give 64 lower-case hex digits", *claimSHA256)
		}
		if *token != "" || *tokenSHA256 != "" {
			return errors.New("an agent started with -claim-token-sha256 learns its access token from the claim: give no other token")
		}
	}
	// The commands the agent runs inherit its environment: the token stays out of it.
	if err := os.Unsetenv(tokenEnv); err != nil {
		return fmt.Errorf("removing $%s from the environment: %w", tokenEnv, err)
	}
	addr := *listen
	if addr == "" {
		addr = fmt.Sprintf(":%d", *port)
	}
	if *detached {
		host, portText, err := net.SplitHostPort(addr)
		if err != nil {
			return fmt.Errorf("-listen %s: %w", addr, err)
		}
		if host == "" || host == "0.0.0.0" || host == "::" {
			host = "127.0.0.1"
		}
		// The token travels to the detached agent in its environment, as it came.
		if *token != "" {
			os.Setenv(tokenEnv, *token)
		}
		args := withoutFlag(os.Args[1:], "detach")
		return detach(withoutValueFlag(args, "access-token"), "http://"+net.JoinHostPort(host, portText)+"/health")
	}
	self, err := identity.Self()
	if err != nil {
		return err
	}
	log := slog.New(slog.NewJSONHandler(os.Stderr, nil))

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	// Sampling lives as long as serving: both end with ctx.
	// An unclaimed agent measures / until its claim: its workspace may be bound beneath
	// the running container only at the claim, and under gVisor a path looked up before
	// (even one found missing) can stay what the sandbox saw then.
	disk := ""
	if *claimSHA256 != "" {
		disk = "/"
	}
	sampler := metrics.New(metrics.Config{Log: log, DiskPath: disk})
	go sampler.Run(ctx)

	protocols := new(http.Protocols)
	protocols.SetHTTP1(true)
	protocols.SetUnencryptedHTTP2(true) // the SDK speaks HTTP/2 without TLS by default
	srv := &http.Server{
		Handler: server.New(server.Config{
			AccessToken: *token, AccessTokenSHA256: *tokenSHA256, ClaimTokenSHA256: *claimSHA256, Self: self, Metrics: sampler,
		}),
		Protocols:         protocols,
		ReadHeaderTimeout: 30 * time.Second,
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("listening on %s: %w (is another agent running? pick another -port)", addr, err)
	}
	log.Info("serving", "address", ln.Addr().String(), "user", self.Name,
		"token_required", *token != "" || *tokenSHA256 != "", "claimable", *claimSHA256 != "")

	go func() {
		<-ctx.Done()
		shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(shutdown)
	}()
	if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
