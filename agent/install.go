package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
)

// installName is the name the agent gets in the directory -install names.
const installName = "agent"

// install copies the running executable into dir as dir/agent, mode 0755.
// The copy is written beside its target and renamed over it, so a reader of
// dir/agent sees the old file or the whole new one, never a part. This is how
// a sandbox's init container hands the agent to the sandbox's own image: the
// agent's image runs `agent -install DIR` with DIR a volume both containers
// mount.
func install(dir string) (string, error) {
	info, err := os.Stat(dir)
	if err != nil {
		return "", fmt.Errorf("-install %s: %w (name an existing directory)", dir, err)
	}
	if !info.IsDir() {
		return "", fmt.Errorf("-install %s: not a directory (name the directory to put %s in)", dir, installName)
	}
	self, err := os.Executable()
	if err != nil {
		return "", fmt.Errorf("finding the agent's own executable: %w (is /proc mounted?)", err)
	}
	src, err := os.Open(self)
	if err != nil {
		return "", fmt.Errorf("reading the agent's own executable: %w", err)
	}
	defer src.Close()
	tmp, err := os.CreateTemp(dir, "."+installName+"-*")
	if err != nil {
		return "", fmt.Errorf("-install %s: %w (the directory must be writable)", dir, err)
	}
	target := filepath.Join(dir, installName)
	if err := finish(tmp, src, target); err != nil {
		_ = tmp.Close()
		_ = os.Remove(tmp.Name())
		return "", fmt.Errorf("-install %s: %w", dir, err)
	}
	return target, nil
}

// finish fills tmp from src, makes it executable by all, and renames it to target.
func finish(tmp *os.File, src io.Reader, target string) error {
	if _, err := io.Copy(tmp, src); err != nil {
		return err
	}
	if err := tmp.Chmod(0o755); err != nil {
		return err
	}
	if err := tmp.Sync(); err != nil {
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), target)
}
