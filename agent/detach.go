package main

import (
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"
)

// detachWait bounds how long -detach waits for the agent it started to answer.
const detachWait = 15 * time.Second

// detach starts this agent again, without -detach, in a session of its own
// with no terminal and no inherited output, and returns once it answers
// /health on healthURL. It is how a sandbox's container starts the agent from
// a postStart hook: the hook's process must end (the kubelet waits for it),
// the agent must not (it serves for the container's life), and the container
// should count as started only with the agent up, so a failure here restarts
// the container and says why in its events.
func detach(args []string, healthURL string) error {
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("finding the agent's own executable: %w (is /proc mounted?)", err)
	}
	cmd := exec.Command(self, args...)
	cmd.Stdin, cmd.Stdout = nil, nil
	// The agent's log goes where the container's own does when it may (its
	// first process's stderr), so `kubectl logs` shows both; else nowhere.
	if logs, err := os.OpenFile("/proc/1/fd/2", os.O_WRONLY|os.O_APPEND, 0); err == nil {
		cmd.Stderr = logs
		defer logs.Close()
	}
	// Setsid: no controlling terminal, and no signal meant for the hook's
	// process group reaches the agent.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting the agent: %w", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	client := &http.Client{Timeout: time.Second}
	deadline := time.Now().Add(detachWait)
	for time.Now().Before(deadline) {
		select {
		case err := <-exited:
			if err == nil {
				err = errors.New("it exited")
			}
			return fmt.Errorf("the agent stopped before it answered: %w (its log is the container's)", err)
		default:
		}
		if resp, err := client.Get(healthURL); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusNoContent {
				// Leave it running: this process ends, the agent is adopted by
				// the container's first process.
				return cmd.Process.Release()
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	_ = cmd.Process.Kill()
	return fmt.Errorf("the agent did not answer %s within %s", healthURL, detachWait)
}

// withoutFlag returns args without the boolean flag name (as -name or --name).
func withoutFlag(args []string, name string) []string {
	kept := make([]string, 0, len(args))
	for _, arg := range args {
		if arg == "-"+name || arg == "--"+name || arg == "-"+name+"=true" || arg == "--"+name+"=true" {
			continue
		}
		kept = append(kept, arg)
	}
	return kept
}

// withoutValueFlag returns args without the flag name and its value (as
// -name V, -name=V, or the same with --): a token given on the command line
// goes to the detached agent in its environment instead, out of its process
// list.
func withoutValueFlag(args []string, name string) []string {
	kept := make([]string, 0, len(args))
	for i := 0; i < len(args); i++ {
		arg := args[i]
		if arg == "-"+name || arg == "--"+name {
			i++
			continue
		}
		if strings.HasPrefix(arg, "-"+name+"=") || strings.HasPrefix(arg, "--"+name+"=") {
			continue
		}
		kept = append(kept, arg)
	}
	return kept
}

// validSHA256 says whether s is a SHA-256 in lower-case hex.
func validSHA256(s string) bool {
	if len(s) != 64 {
		return false
	}
	for _, c := range s {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}
