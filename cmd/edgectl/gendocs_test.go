package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/cobra"
)

// TestGenDocs: a man page for every command an operator can run (and none
// for hidden ones), and completions for bash, zsh and fish.
func TestGenDocs(t *testing.T) {
	dir := t.TempDir()
	t.Setenv("SOURCE_DATE_EPOCH", "1700000000")
	if code := execute(t.Context(), []string{"gendocs", dir}); code != 0 {
		t.Fatalf("gendocs exited %d", code)
	}
	var walk func(c *cobra.Command)
	want := map[string]bool{}
	walk = func(c *cobra.Command) {
		if !c.IsAvailableCommand() && c.HasParent() {
			return
		}
		want[strings.ReplaceAll(c.CommandPath(), " ", "-")+".1"] = true
		for _, s := range c.Commands() {
			walk(s)
		}
	}
	root := newRootCommand()
	root.InitDefaultCompletionCmd()
	walk(root)
	for _, must := range []string{"edgectl.1", "edgectl-run.1", "edgectl-policy-validate.1"} {
		if !want[must] {
			t.Fatalf("command tree has no %s", must)
		}
	}
	entries, err := os.ReadDir(filepath.Join(dir, "man1"))
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for _, e := range entries {
		got[e.Name()] = true
	}
	for name := range want {
		if !got[name] {
			t.Errorf("no man page %s", name)
		}
	}
	for name := range got {
		if !want[name] {
			t.Errorf("man page %s for a command operators cannot see", name)
		}
	}
	run, err := os.ReadFile(filepath.Join(dir, "man1", "edgectl-run.1"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(run), `.TH "EDGECTL" "1" "Nov 2023"`) || !strings.Contains(string(run), "iface") {
		t.Errorf("edgectl-run.1: want the SOURCE_DATE_EPOCH date and the --iface flag:\n%.400s", run)
	}
	for file, mark := range map[string]string{
		"edgectl.bash": "__start_edgectl", "_edgectl": "#compdef edgectl", "edgectl.fish": "complete -c edgectl",
	} {
		b, err := os.ReadFile(filepath.Join(dir, "completions", file))
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(b), mark) {
			t.Errorf("completion %s lacks %q", file, mark)
		}
	}
}

func TestGenDocsNeedsADirectory(t *testing.T) {
	if code := execute(t.Context(), []string{"gendocs"}); code != 2 {
		t.Errorf("gendocs without DIR exited %d, want 2", code)
	}
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if code := execute(t.Context(), []string{"gendocs", file}); code != 1 {
		t.Errorf("gendocs into a file exited %d, want 1", code)
	}
}
