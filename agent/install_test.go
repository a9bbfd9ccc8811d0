package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestInstallCopiesItsOwnExecutable(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	want, err := os.ReadFile(self)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	// An older agent is replaced, not appended to or left beside.
	if err := os.WriteFile(filepath.Join(dir, installName), []byte("old agent"), 0o600); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		path, err := install(dir)
		if err != nil {
			t.Fatal(err)
		}
		if path != filepath.Join(dir, installName) {
			t.Fatalf("installed at %s; want %s", path, filepath.Join(dir, installName))
		}
		got, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("the installed file (%d bytes) is not the running executable (%d bytes)", len(got), len(want))
		}
		info, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		if info.Mode() != 0o755 {
			t.Fatalf("mode %v; want -rwxr-xr-x", info.Mode())
		}
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 1 {
		t.Fatalf("the directory holds %d entries; want only %s (no temporary file left)", len(entries), installName)
	}
}

func TestInstallRefusesWhatIsNotADirectory(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for path, want := range map[string]string{
		filepath.Join(dir, "missing"): "name an existing directory",
		file:                          "not a directory",
	} {
		_, err := install(path)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("install(%s) = %v; want an error saying %q", path, err, want)
		}
	}
}

func TestInstallLeavesNothingBehindWhenItFails(t *testing.T) {
	dir := t.TempDir()
	// A directory in the agent's place: the rename fails, for root too.
	if err := os.MkdirAll(filepath.Join(dir, installName, "inside"), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := install(dir); err == nil {
		t.Fatal("install over a non-empty directory succeeded")
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 1 || !entries[0].IsDir() {
		t.Fatalf("a failed install left %v; want only the directory that was there", entries)
	}
}
